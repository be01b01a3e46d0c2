"""``python -m beam_spark_runner``: the version report and the demo word count."""

from __future__ import annotations

import platform
from importlib import metadata

import pytest

from beam_spark_runner import __main__ as cli
from beam_spark_runner import demo
from beam_spark_runner._version import __version__
from beam_spark_runner.spark.java import java_executable, java_version


def report_rows(stdout: str) -> dict[str, str]:
    rows = {}
    for line in stdout.strip().splitlines():
        name, _, value = line.partition(" ")
        rows[name] = value.strip()
    return rows


def test_version_reports_every_component(run_python, tmp_path):
    completed = run_python(["-m", "beam_spark_runner", "--version"], cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    rows = report_rows(completed.stdout)
    assert rows["beam-spark-runner"] == __version__
    assert rows["apache-beam"] == metadata.version("apache-beam")
    assert rows["pyspark"] == metadata.version("pyspark")
    java = java_executable()
    if java is None:
        assert rows["java"].startswith("not found")
    else:
        assert rows["java"] == f"{java_version(java)} ({java})"
    assert rows["python"].startswith(platform.python_version() + " (")
    assert "platform" in rows


def test_version_says_when_java_is_missing(run_python, tmp_path):
    completed = run_python(
        ["-m", "beam_spark_runner", "--version"], env={"JAVA_HOME": str(tmp_path)}, cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr
    assert report_rows(completed.stdout)["java"].startswith("not found")


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--version" in out
    assert "demo" in out

    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--output DIR" in out
    assert "--spark_master" in out


def test_no_command_prints_help_and_fails(capsys):
    assert cli.main([]) == 2
    assert "demo" in capsys.readouterr().err


def test_unknown_option_without_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--bogus"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_demo_arguments_other_than_output_go_to_beam(monkeypatch):
    calls = []

    def fake_run(output, pipeline_args):
        calls.append((output, pipeline_args))
        return output

    monkeypatch.setattr(demo, "run", fake_run)
    log_level = cli._LOGGER.level
    try:
        argv = ["demo", "--spark_master=local[2]", "--output", "out", "--spark_conf", "a=b"]
        assert cli.main(argv) == 0
    finally:
        cli._LOGGER.setLevel(log_level)
    assert calls == [("out", ["--spark_master=local[2]", "--spark_conf", "a=b"])]


def test_corpus_is_the_same_every_time(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    text = demo.write_corpus(first).read_text()
    assert text == demo.write_corpus(second).read_text()
    assert len(text.splitlines()) == demo.CORPUS_LINES


def test_split_words_and_format():
    assert demo.split_words("Beam ON  spark\trunner's") == ["beam", "on", "spark", "runner's"]
    assert demo.split_words("") == []
    assert demo.format_count(("beam", 3)) == "beam: 3"


def test_demo_on_spark_counts_like_the_direct_runner(run_python, tmp_path, beam_options):
    spark_output = tmp_path / "spark"
    completed = run_python(
        ["-m", "beam_spark_runner", "demo", "--output", str(spark_output), *beam_options],
        timeout=600,
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr
    pattern = demo.output_pattern(spark_output)
    assert completed.stdout.strip().splitlines()[-1] == f"output written to {pattern}"
    assert "finished on Spark" in completed.stderr  # the runner's own log line
    assert "Discarding unparseable args" not in completed.stderr
    assert demo.output_files(spark_output)

    reference = demo.run_on_direct_runner(tmp_path / "direct")
    expected = demo.read_counts(reference)
    assert len(expected) > 10
    assert demo.read_counts(spark_output) == expected
