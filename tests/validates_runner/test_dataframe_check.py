"""validates_runner.dataframe: how DirectRunner's and this runner's results are compared."""

from __future__ import annotations

from pathlib import Path

from validates_runner import dataframe

_CASE = '<testcase classname=".venv.lib.apache_beam.dataframe.io_test.IOTest" name="{name}">'


def _junit(path: Path, cases: dict[str, tuple[str, list[str]]]) -> Path:
    body = []
    for name, (outcome, runners) in cases.items():
        props = "".join(
            f'<property name="{dataframe.RUNNER_PROPERTY}" value="{runner}"/>' for runner in runners
        )
        inner = {"failed": '<failure message="boom"/>', "skipped": "<skipped/>"}.get(outcome, "")
        body.append(_CASE.format(name=name) + f"<properties>{props}</properties>{inner}</testcase>")
    path.write_text(
        "<testsuites><testsuite>" + "".join(body) + "</testsuite></testsuites>", encoding="utf-8"
    )
    return path


def test_a_test_passing_on_direct_runner_must_pass_on_spark(tmp_path: Path) -> None:
    direct = dataframe.read_results(
        _junit(
            tmp_path / "direct.xml",
            {
                "both": ("passed", ["SwitchingDirectRunner"]),
                "spark_fails": ("passed", ["SwitchingDirectRunner"]),
                "beam_fails": ("failed", ["SwitchingDirectRunner"]),
                "not_on_spark": ("passed", ["SwitchingDirectRunner"]),
                "no_pipeline": ("passed", []),
            },
        )
    )
    spark = dataframe.read_results(
        _junit(
            tmp_path / "spark.xml",
            {
                "both": ("passed", ["SparkStructuredRunner"]),
                "spark_fails": ("failed", ["SparkStructuredRunner"]),
                "beam_fails": ("failed", ["SparkStructuredRunner"]),
                "not_on_spark": ("passed", ["FnApiRunner"]),
                "no_pipeline": ("passed", []),
            },
        )
    )
    prefix = "apache_beam.dataframe.io_test.IOTest::"
    assert direct[prefix + "both"] == ("passed", frozenset({"SwitchingDirectRunner"}))
    assert dataframe.runner_failures(direct, spark) == [
        f"{prefix}not_on_spark: ran pipelines on ['FnApiRunner'], not only Spark",
        f"{prefix}spark_fails: passes on DirectRunner, failed on Spark",
    ]
