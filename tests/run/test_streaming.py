"""What a person running a streaming pipeline sees at Python's default logging level.

One driver process (no logging configuration) runs a ``PeriodicImpulse`` query until its
progress has been logged, cancels it, starts a second one and exits while it runs. Its
console must hold the runner's progress lines (element rates, user names) and no Spark
ERROR or WARN line from the cancel, the exit or the session's stop, and its temporary
directory no checkpoint. A failing DoFn's error is shown once, naming its step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from tests.conftest import SPARK_TEST_MASTER

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(
        pyspark_version() < OLDEST_STREAMING_SPARK, reason="streaming needs PySpark 3.5+"
    ),
]

_DRIVER = """
import sys
import time

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

ticks = Metrics.counter("console", "ticks")


def key(at):
    ticks.inc()
    return (int(at * 100) % 7, 1)


def start(name):
    options = PipelineOptions(
        [*sys.argv[1:], "--streaming", "--spark_trigger_interval=0.2", f"--job_name={name}"]
    )
    pipeline = beam.Pipeline(options=options)
    now = time.time()
    _ = (
        pipeline
        | "Ticks" >> PeriodicImpulse(
            start_timestamp=now - 3, stop_timestamp=now + 3600, fire_interval=0.01
        )
        | "Key" >> beam.Map(key)
        | "Window" >> beam.WindowInto(window.FixedWindows(2))
        | "Count" >> beam.CombinePerKey(sum)
        | "Show" >> beam.Map(str)
    )
    return pipeline.run()


result = start("console")
deadline = time.monotonic() + 240
while time.monotonic() < deadline:
    counters = result.metrics().query(MetricsFilter().with_name("ticks"))["counters"]
    if sum(c.committed for c in counters) > 0:
        break
    time.sleep(1)
# Two progress lines with elements counted, then the cancel.
time.sleep(11)
result.cancel()
start("exits-running")
time.sleep(8)
"""

# A line of Spark's console layout (log4j's PatternLayout of the runner's profile).
_SPARK_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (ERROR|WARN) ")


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The driver's console lines and its private temporary directory."""
    root = tmp_path_factory.mktemp("console")
    temp = root / "tmp"
    temp.mkdir()
    script = root / "driver.py"
    script.write_text(_DRIVER, encoding="utf-8")
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--runner=SparkStructuredRunner",
            f"--spark_master={SPARK_TEST_MASTER}",
        ],
        capture_output=True,
        text=True,
        timeout=420,
        env={**os.environ, "TMPDIR": str(temp)},
        check=False,
    )
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0, "\n".join(lines[-60:])
    return lines, temp


def test_progress_shows_element_rates_and_user_names(console: tuple[list[str], Path]) -> None:
    lines, _ = console
    progress = [line for line in lines if "Beam pipeline console (streaming): " in line]
    assert progress, "\n".join(lines)
    counted = [
        line
        for line in progress
        if re.search(r"source 'Ticks' [1-9][0-9.]* elements/s out", line)
        and re.search(r"slowest transform '[^']*(Ticks|Count)[^']*' [0-9.]+ elements/s in", line)
    ]
    assert counted, "\n".join(progress)
    assert not [line for line in progress if "ref_" in line], "\n".join(progress)
    assert "behind the clock" in counted[-1]


def test_no_spark_error_or_warning_from_the_cancel_or_the_exit(
    console: tuple[list[str], Path],
) -> None:
    lines, _ = console
    spark = [line for line in lines if _SPARK_LINE.match(line) or line.startswith("\tat ")]
    assert not spark, "\n".join(lines)
    assert not [line for line in lines if "Current batch is falling behind" in line]
    # The runner's own warning, once per query at most.
    assert len([line for line in lines if "cannot keep up" in line]) <= 2


def test_no_temporary_checkpoint_is_left(console: tuple[list[str], Path]) -> None:
    lines, temp = console
    left = sorted(p.name for p in temp.glob("beam-spark-checkpoint-*"))
    assert not left, (left, "\n".join(lines[-40:]))


FAILING_STREAM = textwrap.dedent(
    """
    import sys

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream

    stream = (
        TestStream().add_elements(["1", "2"]).advance_watermark_to(10).add_elements(["oops"])
    )
    pipeline = beam.Pipeline(options=PipelineOptions(sys.argv[1:]))
    _ = pipeline | stream | "ToInt" >> beam.Map(int)
    pipeline.run().wait_until_finish()
    """
)


def test_a_failing_dofn_in_a_streaming_query_shows_its_traceback_once_with_the_step(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
) -> None:
    """Neither Py4J's log of the ``foreachBatch`` error nor Spark's of the query repeats it."""
    script = tmp_path / "failing_stream.py"
    script.write_text(FAILING_STREAM, encoding="utf-8")
    result = run_python([str(script), *beam_options, "--streaming"], timeout=300)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("ValueError: invalid literal for int()") == 1, output
    assert "PipelineExecutionError: Beam stage 'ToInt' failed on Spark" in output
    assert "[while running 'ToInt']" in output
    assert "at org.apache.spark" not in output  # no JVM frames
    assert "Python Proxy" not in output, output  # Py4J's log of the callback's error


def test_the_watcher_outlasts_a_stopped_querys_last_micro_batch() -> None:
    """A query is inactive from the moment stop() begins; the watcher, which then releases
    the run's quiet log of the interrupted callback, first awaits the query's end."""
    import threading
    from types import SimpleNamespace

    from beam_spark_runner.run import streaming as run_streaming

    awaited: list[float] = []

    class StoppingQuery:
        isActive = False  # noqa: N815 - PySpark's name

        def awaitTermination(self, timeout: float) -> bool:  # noqa: N802 - PySpark's name
            awaited.append(timeout)
            return True

    watch = SimpleNamespace(finished=threading.Event())
    run_streaming._watch(StoppingQuery(), watch, None, None)  # type: ignore[arg-type]
    assert awaited == [run_streaming._END_SECONDS]
