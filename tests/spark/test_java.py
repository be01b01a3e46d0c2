"""Java detection: a machine without a usable Java gets our message, not a py4j traceback."""

from __future__ import annotations

import os
import shlex
import stat
import textwrap
from pathlib import Path

import pytest

from beam_spark_runner.errors import JavaNotFoundError, SparkRunnerError
from beam_spark_runner.spark import java as session


def fake_java(java_home: Path, version_output: str) -> Path:
    """A ``java_home/bin/java`` that prints ``version_output`` to stderr, as java does.

    It uses only shell builtins, so it works with a PATH that holds nothing else.
    """
    java = java_home / "bin" / "java"
    java.parent.mkdir(parents=True)
    lines = " ".join(shlex.quote(line) for line in version_output.splitlines())
    java.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines} >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    return java


def openjdk_banner(version: str) -> str:
    return (
        f'openjdk version "{version}" 2024-01-16\n'
        "OpenJDK Runtime Environment (build x)\n"
        "OpenJDK 64-Bit Server VM (build x, mixed mode)"
    )


def test_java_home_without_bin_java_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert session.java_executable() is None
    with pytest.raises(JavaNotFoundError) as error:
        session.check_java(17)
    message = str(error.value)
    assert f"JAVA_HOME={tmp_path} has no bin/java" in message
    assert "Java 17+" in message
    assert "openjdk-17" in message
    assert isinstance(error.value, SparkRunnerError)


def test_no_java_on_path_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert session.java_executable() is None
    with pytest.raises(JavaNotFoundError) as error:
        session.check_java(17)
    message = str(error.value)
    assert "JAVA_HOME is not set and no `java` is on PATH" in message
    assert "Install one" in message


def test_java_on_path_is_found_without_java_home(tmp_path, monkeypatch):
    java = fake_java(tmp_path, openjdk_banner("17.0.2"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(java.parent))
    assert session.java_executable() == str(java)
    assert session.check_java(17) == "17.0.2"


def test_java_home_takes_precedence_over_path(tmp_path, monkeypatch):
    on_path = fake_java(tmp_path / "path-jdk", openjdk_banner("21.0.1"))
    home = fake_java(tmp_path / "home-jdk", openjdk_banner("17.0.9"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "home-jdk"))
    assert session.java_executable() == str(home)
    assert session.check_java(17) == "17.0.9"


def test_real_java_passes():
    java = session.java_executable()
    if java is None:
        pytest.skip("no Java on this machine (JAVA_HOME or PATH)")
    version = session.check_java(session.required_java_major())
    assert version == session.java_version(java)
    assert version[0].isdigit()


@pytest.mark.parametrize(
    ("version", "required", "accepted"),
    [
        ("1.8.0_392", 17, False),
        ("1.8.0_392", 8, True),
        ("11.0.22", 17, False),
        ("11.0.22", 11, True),
        ("17.0.15", 17, True),
        ("17", 17, True),
        ("21-ea", 17, True),
        ("25.0.1", 17, True),
    ],
)
def test_java_major_version_is_checked(tmp_path, monkeypatch, version, required, accepted):
    java = fake_java(tmp_path, openjdk_banner(version))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    if accepted:
        assert session.check_java(required) == version
        return
    with pytest.raises(JavaNotFoundError) as error:
        session.check_java(required)
    message = str(error.value)
    assert f"Spark needs Java {required}+, found Java {version} at {java}" in message
    assert "JAVA_HOME" in message


def test_oracle_java_8_banner_is_rejected_for_17(tmp_path, monkeypatch):
    fake_java(tmp_path, 'java version "1.8.0_401"\nJava(TM) SE Runtime Environment')
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match=r"found Java 1\.8\.0_401"):
        session.check_java(17)


def test_java_that_reports_no_version_is_rejected(tmp_path, monkeypatch):
    fake_java(tmp_path, "Error: could not find libjava.so")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="did not report a version"):
        session.check_java(17)


def test_pipeline_without_java_fails_with_our_message(tmp_path, run_python, beam_options):
    """The whole path: ``Pipeline.run`` stops before Spark tries to launch a JVM."""
    empty_java_home = tmp_path / "jdk"
    empty_java_home.mkdir()
    script = textwrap.dedent(
        f"""
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions

        with beam.Pipeline(options=PipelineOptions({beam_options!r})) as p:
            _ = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x + 1)
        """
    )
    completed = run_python(
        ["-c", script],
        env={"JAVA_HOME": str(empty_java_home), "PYSPARK_SUBMIT_ARGS": None},
        timeout=120,
        cwd=tmp_path,
    )
    assert completed.returncode != 0, completed.stdout
    last_line = completed.stderr.strip().splitlines()[-1]
    assert last_line.startswith("beam_spark_runner.errors.JavaNotFoundError: "), completed.stderr
    assert f"JAVA_HOME={empty_java_home} has no bin/java" in last_line
    assert "py4j" not in completed.stderr
    assert "JAVA_GATEWAY_EXITED" not in completed.stderr
    assert not os.listdir(empty_java_home)
