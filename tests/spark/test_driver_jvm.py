"""A driver JVM that exited is reported as such, with how it ended, not as Py4J's
"Connection refused"."""

from __future__ import annotations

import signal
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from beam_spark_runner.errors import DriverExitedError, PipelineExecutionError
from beam_spark_runner.run.failures import describe_failure
from beam_spark_runner.spark import driver_jvm


class _Process:
    """A ``Popen`` of a driver JVM: running (``status`` None) or exited."""

    def __init__(self, status: int | None, pid: int = 4242) -> None:
        self.status = status
        self.pid = pid
        self.waited: list[float] = []

    def poll(self) -> int | None:
        return self.status

    def wait(self, timeout: float) -> int:
        self.waited.append(timeout)
        if self.status is None:
            raise subprocess.TimeoutExpired("java", timeout)
        return self.status


@pytest.fixture
def jvm(monkeypatch: pytest.MonkeyPatch) -> Callable[[int | None], _Process]:
    def make(status: int | None) -> _Process:
        process = _Process(status)
        monkeypatch.setattr(driver_jvm, "_process", lambda: process)
        return process

    return make


def test_a_kill_names_the_signal_and_the_out_of_memory_killer() -> None:
    text = driver_jvm.describe(-signal.SIGKILL, 4242)
    assert "pid 4242" in text and "SIGKILL" in text and "out-of-memory killer" in text


def test_sparks_out_of_memory_exit_says_to_raise_the_driver_memory() -> None:
    text = driver_jvm.describe(52, 1)
    assert "OutOfMemoryError" in text and "spark.driver.memory" in text


def test_other_signals_and_codes_are_named() -> None:
    assert "SIGABRT" in driver_jvm.describe(-signal.SIGABRT, 1)
    assert "exit code 3" in driver_jvm.describe(3, 1)
    assert "exited normally" in driver_jvm.describe(0, 1)


def test_the_jvms_crash_report_is_pointed_to(tmp_path: Path) -> None:
    assert "crash report" not in driver_jvm.describe(-signal.SIGABRT, 77, str(tmp_path))
    (tmp_path / "hs_err_pid77.log").write_text("#  SIGSEGV")
    text = driver_jvm.describe(-signal.SIGABRT, 77, str(tmp_path))
    assert f"crash report: {tmp_path / 'hs_err_pid77.log'}" in text


def test_a_running_jvm_has_not_ended(jvm: Callable[[int | None], _Process]) -> None:
    process = jvm(None)
    assert driver_jvm.running() and driver_jvm.how_it_ended() is None
    assert driver_jvm.how_it_ended(grace=0.5) is None and process.waited == [0.5]


def test_an_exited_jvm_says_how(jvm: Callable[[int | None], _Process]) -> None:
    jvm(-signal.SIGKILL)
    assert not driver_jvm.running()
    assert "pid 4242" in (driver_jvm.how_it_ended() or "")


def test_no_jvm_of_this_processs_own_counts_as_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_jvm, "_process", lambda: None)
    assert driver_jvm.running() and driver_jvm.how_it_ended(grace=1.0) is None


def test_a_lost_connection_waits_for_the_jvm_and_says_how_it_ended(
    jvm: Callable[[int | None], _Process],
) -> None:
    process = jvm(52)
    error = describe_failure(ConnectionRefusedError(111, "Connection refused"))
    assert isinstance(error, DriverExitedError) and isinstance(error, PipelineExecutionError)
    assert "spark.driver.memory" in str(error) and process.waited
    assert "the next pipeline this process runs starts a new one" in str(error)


def test_a_failure_while_the_jvm_runs_is_described_as_before(
    jvm: Callable[[int | None], _Process],
) -> None:
    jvm(None)
    error = describe_failure(RuntimeError("boom"))
    assert type(error) is PipelineExecutionError and "boom" in str(error)


@pytest.mark.spark
def test_a_jvm_killed_mid_pipeline_fails_it_saying_how_and_the_next_gets_a_new_one(
    run_python: Callable[..., Any], tmp_path: Path
) -> None:
    # A fresh interpreter: killing the test process's own JVM would end the suite.
    script = tmp_path / "kill_jvm.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal
            import apache_beam as beam
            from apache_beam.options.pipeline_options import PipelineOptions
            from apache_beam.testing.util import assert_that, equal_to
            from pyspark import SparkContext
            from beam_spark_runner.errors import DriverExitedError

            ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[1]"]
            with beam.Pipeline(options=PipelineOptions(ARGS)) as p:
                _ = p | beam.Create([1]) | beam.Map(lambda x: x)
            pid = SparkContext._gateway.proc.pid

            def kill(x):
                os.kill(pid, signal.SIGKILL)
                return x

            try:
                with beam.Pipeline(options=PipelineOptions(ARGS)) as p:
                    _ = p | beam.Create([1, 2]) | beam.Map(kill)
            except DriverExitedError as error:
                print("during ::", error)
            with beam.Pipeline(options=PipelineOptions(ARGS)) as p:
                tens = p | beam.Create([1, 2]) | beam.Map(lambda x: x * 10)
                assert_that(tens, equal_to([10, 20]))
            print("after ::", SparkContext._gateway.proc.pid != pid)
            """
        )
    )
    done = run_python([str(script)], timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" :: ", 1) for line in done.stdout.splitlines() if " :: " in line)
    assert set(lines) == {"during", "after"}, done.stdout + done.stderr[-3000:]
    assert "has exited; it was killed by SIGKILL" in lines["during"]
    assert lines["after"] == "True"  # ran, on a JVM of its own
    assert "has exited; it was killed by SIGKILL" in done.stderr  # the restart's warning
    assert "Starting a new one." in done.stderr
