"""Tests for worker_warmup and the workers' environment: one daemon, started with the session."""

from __future__ import annotations

import os
import textwrap
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from unittest import mock

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import FixedWindows
from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.spark.session import SIMPLIFIED_TRACEBACK, worker_environment
from beam_spark_runner.streaming import jvm_warmup
from beam_spark_runner.workers import warmup as worker_warmup
from beam_spark_runner.workers.warmup import OncePerContext


class _FakeRdd:
    def __init__(self, context: _FakeContext, data: range, partitions: int) -> None:
        self._context = context
        self._data = data
        self._partitions = partitions
        self._function: Callable[..., Any] | None = None

    def mapPartitions(self, function: Callable[..., Any]) -> _FakeRdd:  # noqa: N802 - Spark's
        self._function = function
        return self

    def collect(self) -> list[Any]:
        assert self._function is not None
        self._context.jobs.append((self._context.description, self._partitions))
        return list(self._function(iter(self._data)))


class _JavaContext:
    """Stands for the context's JVM side: Py4J compares and hashes it in the JVM, which
    fails once that JVM has exited."""

    def __eq__(self, other: object) -> bool:
        raise ConnectionRefusedError(111, "Connection refused")

    def __hash__(self) -> int:
        raise ConnectionRefusedError(111, "Connection refused")


class _FakeContext:
    def __init__(self, daemon_module: str | None) -> None:
        self._jsc = _JavaContext()
        self._conf = {} if daemon_module is None else {worker_warmup.DAEMON_CONF: daemon_module}
        self.defaultParallelism = 2
        self.description: str | None = None
        self.jobs: list[tuple[str | None, int]] = []
        self.master = "local[2]"
        self.environment: dict[str, str] = {}

    def getConf(self) -> Any:  # noqa: N802 - Spark's name
        return SimpleNamespace(get=self._conf.get)

    def setJobDescription(self, description: str) -> None:  # noqa: N802 - Spark's name
        self.description = description

    def parallelize(self, data: range, partitions: int) -> _FakeRdd:
        return _FakeRdd(self, data, partitions)


def test_a_context_running_the_runners_daemon_is_warmed_once_with_a_named_job() -> None:
    context = _FakeContext(worker_warmup.DAEMON_MODULE)
    thread = worker_warmup.start(context)  # type: ignore[arg-type]
    assert thread is not None
    thread.join(timeout=10)
    assert context.jobs == [(worker_warmup.DESCRIPTION, 2)]
    assert worker_warmup.start(context) is None  # type: ignore[arg-type]
    assert len(context.jobs) == 1


def test_settling_waits_for_the_warm_up_job_of_the_context() -> None:
    """Before the runner stops its session: a task still running then logs Spark's ERROR."""
    context = _FakeContext(worker_warmup.DAEMON_MODULE)
    # None started yet: nothing to wait for.
    assert worker_warmup.settle(context, timeout=0)  # type: ignore[arg-type]
    release = threading.Event()
    warm = worker_warmup._warm

    def slow_warm(*args: Any) -> None:
        release.wait(10)
        warm(*args)

    with mock.patch.object(worker_warmup, "_warm", slow_warm):
        thread = worker_warmup.start(context)  # type: ignore[arg-type]
    assert thread is not None
    assert not worker_warmup.settle(context, timeout=0.05)  # type: ignore[arg-type]
    release.set()
    assert worker_warmup.settle(context, timeout=10)  # type: ignore[arg-type]
    assert context.jobs == [(worker_warmup.DESCRIPTION, 2)]


def test_a_new_context_is_warmed_without_asking_any_jvm() -> None:
    # After a driver JVM exited (driver_jvm.forget), the next context's warm-up must not
    # compare its JVM side with the old one's: Py4J would ask the dead JVM.
    for context in (_FakeContext(worker_warmup.DAEMON_MODULE) for _ in range(2)):
        thread = worker_warmup.start(context)  # type: ignore[arg-type]
        assert thread is not None
        thread.join(timeout=10)
        assert context.jobs == [(worker_warmup.DESCRIPTION, 2)]


def test_a_context_without_the_runners_daemon_is_not_warmed() -> None:
    for module in (None, "pyspark.daemon"):
        context = _FakeContext(module)
        assert worker_warmup.start(context) is None  # type: ignore[arg-type]
        assert context.jobs == []


def test_only_settings_that_run_the_runners_daemon_are_warmed() -> None:
    assert worker_warmup.applies({worker_warmup.DAEMON_CONF: worker_warmup.DAEMON_MODULE})
    assert not worker_warmup.applies({})
    assert not worker_warmup.applies({worker_warmup.DAEMON_CONF: "pyspark.daemon"})


def test_every_worker_of_the_session_gets_the_driver_path_and_the_simplified_traceback() -> None:
    context = _FakeContext(worker_warmup.DAEMON_MODULE)
    worker_environment(context)  # type: ignore[arg-type]
    assert context.environment[SIMPLIFIED_TRACEBACK] == "1"
    assert os.getcwd() in context.environment["PYTHONPATH"].split(os.pathsep)


def _worker_daemons(jvm_pid: int) -> list[int]:
    """The JVM's child processes running the runner's worker daemon (not their forks)."""
    daemons = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        if parent == jvm_pid and worker_warmup.DAEMON_MODULE in command:
            daemons.append(int(entry))
    return daemons


class _RecordDaemon(beam.DoFn):
    """Passes elements on; appends the pid of its worker's parent (the daemon) to a file."""

    def __init__(self, path: str) -> None:
        self._path = path

    def process(self, element: Any) -> Any:
        with open(self._path, "a") as record:
            record.write(f"{os.getppid()}\n")
        yield element


def test_batch_and_streaming_pipelines_share_the_sessions_one_worker_daemon(
    beam_options: list[str], tmp_path: Any, spark_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the session's worker environment, a streaming query's workers (theirs lack
    ``SPARK_SIMPLIFIED_TRACEBACK``) forked from a second daemon, which imported Beam again.

    The query also warms the local JVM (``jvm_warmup``) while it plans."""
    monkeypatch.setattr(jvm_warmup, "_warmed", OncePerContext("test"))
    options = PipelineOptions(beam_options)
    batch, streaming = str(tmp_path / "batch"), str(tmp_path / "streaming")
    with beam.Pipeline(options=options) as pipeline:
        assert_that(
            pipeline | beam.Create([1, 2]) | beam.ParDo(_RecordDaemon(batch)), equal_to([1, 2])
        )
    events = [(Timestamp(i), i) for i in (1, 2, 7)]
    if pyspark_version() < OLDEST_STREAMING_SPARK:
        # This PySpark cannot stream, and no batch run is proven to give a PeriodicImpulse's
        # streaming result: refused before Spark starts.
        with pytest.raises(UnsupportedFeatureError, match="needs Spark"):
            with beam.Pipeline(options=options) as pipeline:
                _ = pipeline | PeriodicImpulse(data=events, fire_interval=1)
        with open(batch) as record:
            assert len(set(record.read().split())) == 1
        return
    with beam.Pipeline(options=options) as pipeline:
        windowed = (
            pipeline
            | PeriodicImpulse(data=events, fire_interval=1)
            | "Routed" >> beam.ParDo(_RecordDaemon(streaming))
            | beam.WithKeys(0)
            | beam.WindowInto(FixedWindows(5))
            | beam.GroupByKey()
            | "Grouped" >> beam.ParDo(_RecordDaemon(streaming))
            | beam.MapTuple(lambda _, values: sorted(values))
        )
        assert_that(windowed, equal_to([[1, 2], [7]]))
    with open(batch) as record:
        batch_daemons = set(record.read().split())
    with open(streaming) as record:
        streaming_daemons = set(record.read().split())
    assert len(batch_daemons) == 1
    assert streaming_daemons == batch_daemons
    assert spark_session.sparkContext in jvm_warmup._warmed


_WARMED_BEFORE_ANY_JOB = textwrap.dedent(
    """
    import os, sys, time
    from apache_beam.options.pipeline_options import PipelineOptions
    from beam_spark_runner.options import spark_settings
    from beam_spark_runner.spark.session import obtain_session
    from tests.workers.test_warmup import _worker_daemons

    options = PipelineOptions(["--runner=SparkStructuredRunner", "--spark_master=local[2]"])
    session, _ = obtain_session(spark_settings(options))
    jvm_pid = session.sparkContext._gateway.proc.pid
    deadline = time.monotonic() + 90
    while not _worker_daemons(jvm_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    print("daemons", len(_worker_daemons(jvm_pid)))
    """
)


@pytest.mark.spark
def test_a_new_local_session_starts_its_worker_daemon_before_any_pipeline_runs(
    run_python: Callable[..., Any],
) -> None:
    """The daemon imports Beam while the SQL session starts, not after the first job."""
    result = run_python(["-c", _WARMED_BEFORE_ANY_JOB], cwd=os.getcwd())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "daemons 1" in result.stdout, result.stdout + result.stderr[-3000:]


@pytest.mark.spark
def test_the_worker_daemon_imports_what_a_streaming_levels_and_routers_tasks_run(
    run_python: Callable[..., Any],
) -> None:
    # Imported, not run: the module's imports are what every forked worker starts with.
    code = textwrap.dedent(
        """
        import sys
        import beam_spark_runner.spark.worker_daemon
        from beam_spark_runner.spark.compat import has_state_processor
        names = [
            "beam_spark_runner.execution.stage_worker",
            "beam_spark_runner.streaming.levels",
            "beam_spark_runner.streaming.router",
        ]
        if not has_state_processor():  # PySpark 3.5's applyInPandasWithState runs the levels
            names += [
                "beam_spark_runner.spark.group_state",
                "beam_spark_runner.streaming.level_chain",
            ]
        for name in names:
            assert name in sys.modules, name
        """
    )
    completed = run_python(["-c", code])
    assert completed.returncode == 0, completed.stderr
