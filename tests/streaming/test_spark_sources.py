"""``ReadFromSparkStream`` in running queries: a directory files keep arriving in, and ``rate``.

Each test runs an unbounded query that never ends by itself: it waits for the windows it
expects to be written, then cancels the query. A micro-batch costs a second or more, so
these are small.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms import window
from pyspark.sql import SparkSession

from beam_spark_runner.io import ReadFromSparkStream
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.translators.base import spark_function_name
from tests.conftest import SPARK_TEST_MASTER

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip(
        "streaming runs need PySpark 3.5+; this is older",
        allow_module_level=True,
    )

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
# The first micro-batch starts the Python workers and can take a minute on a loaded machine.
WAIT_SECONDS = 240


class _WriteWindow(beam.DoFn):  # type: ignore[misc]
    """Writes each (key, count) pane to ``<out>/<window start>-<key>``, with the wall time.

    The name depends only on the pane, so a retried micro-batch rewrites the same file.
    """

    def __init__(self, out: str) -> None:
        self.out = out

    def process(self, kv: tuple[str, int], w: Any = beam.DoFn.WindowParam) -> None:
        key, count = kv
        name = f"{int(w.start)}-{key}"
        temporary = os.path.join(self.out, f".{name}")
        with open(temporary, "w") as f:
            json.dump({"count": count, "written": time.time()}, f)
        os.replace(temporary, os.path.join(self.out, name))


def _written(out: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in out.iterdir() if not p.name.startswith(".")}


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {WAIT_SECONDS} s waiting for {what}")
        time.sleep(0.5)


def _options() -> PipelineOptions:
    return PipelineOptions(
        [
            "--runner=SparkStructuredRunner",
            f"--spark_master={SPARK_TEST_MASTER}",
            "--spark_trigger_interval=1",
        ]
    )


def _drop(inbox: Path, name: str, events: list[tuple[str, int]]) -> None:
    """A JSON-lines file of (user, second after T0) events, appearing whole (a rename)."""
    temporary = inbox.parent / f".{name}"
    temporary.write_text(
        "".join(
            json.dumps({"user": user, "ts": f"2026-01-01T00:{s // 60:02d}:{s % 60:02d}Z"}) + "\n"
            for user, s in events
        )
    )
    os.replace(temporary, inbox / f"{name}.json")


@pytest.mark.spark
def test_counts_per_window_over_arriving_files_equal_a_batch_run(tmp_path: Path) -> None:
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    out.mkdir()
    rounds = [
        [("ann", 1), ("bo", 2), ("ann", 9), ("cy", 11), ("ann", 12)],
        [("bo", 14), ("bo", 21), ("ann", 25), ("cy", 29)],
        # The last file moves the watermark past 30 s: every earlier window fires.
        [("ann", 31), ("bo", 33)],
    ]
    _drop(inbox, "round-0", rounds[0])
    pipeline = beam.Pipeline(options=_options())
    _ = (
        pipeline
        | ReadFromSparkStream(
            "json", "user STRING, ts TIMESTAMP", timestamp_column="ts", path=str(inbox)
        )
        | beam.Map(lambda row: (row.user, 1))
        | beam.WindowInto(window.FixedWindows(10))
        | beam.CombinePerKey(sum)
        | beam.ParDo(_WriteWindow(str(out)))
    )
    result = pipeline.run()
    try:
        assert result.state == PipelineState.RUNNING
        # Round 0 reaches 12 s: window [0, 10) fires, [10, 20) waits for the watermark.
        _wait_for(lambda: len(_written(out)) >= 2, "the first window")
        time.sleep(3)  # a few more micro-batches: nothing else may fire without new files
        assert sorted(_written(out)) == [f"{T0}-ann", f"{T0}-bo"]
        _drop(inbox, "round-1", rounds[1])
        _wait_for(lambda: any(k.startswith(f"{T0 + 10}-") for k in _written(out)), "[10, 20)")
        _drop(inbox, "round-2", rounds[2])
        batch = _batch_counts(inbox)
        # Every pane of [20, 30) (one per key, each written by its shard's task as it runs),
        # not just the first, before the query is cancelled.
        _wait_for(lambda: set(_written(out)) >= set(batch), "every window's panes")
    finally:
        result.cancel()
    assert result.state == PipelineState.CANCELLED
    streamed = {name: pane["count"] for name, pane in _written(out).items()}
    assert streamed == batch
    assert sum(streamed.values()) == 9  # the two events past 30 s are in an open window


def _batch_counts(inbox: Path) -> dict[str, int]:
    """The same files in a Spark batch job, windows below the last watermark (33 s)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.getOrCreate()  # the runner's session
    frame = spark.read.schema("user STRING, ts TIMESTAMP").json(str(inbox))
    return {
        f"{int(row.start.timestamp())}-{row.user}": row["count"]
        for row in frame.groupBy(F.window("ts", "10 seconds").start.alias("start"), "user")
        .count()
        .collect()
        if row.start.timestamp() < T0 + 30
    }


@pytest.mark.spark
def test_rate_windows_fire_as_its_watermark_passes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pipeline = beam.Pipeline(options=_options())
    _ = (
        pipeline
        | ReadFromSparkStream("rate", options={"rowsPerSecond": 5})
        | beam.Map(lambda row: ("rows", row.value))
        | beam.WindowInto(window.FixedWindows(2))
        | beam.combiners.Count.PerKey()
        | beam.ParDo(_WriteWindow(str(out)))
    )
    result = pipeline.run()
    try:
        _wait_for(lambda: len(_written(out)) >= 4, "four windows of the rate source")
        (query,) = SparkSession.getActiveSession().streams.active
        plan = query._jsq.explainInternal(False)
    finally:
        result.cancel()
    # The first router (the Map's stage) runs in each source's own Python step, the rate's
    # and the runner's, not in a step of its own after their union.
    python_steps = re.findall(r"MapInArrow \[?(\w+)", plan)
    assert len(python_steps) == 3, plan  # the two sources' and the router after the Count
    read = spark_function_name("ReadFromSparkStream")
    assert any(s.startswith(f"{read}_then_beam_") for s in python_steps), plan
    assert any(s.startswith("beam_source_then_beam_") for s in python_steps), plan
    panes = sorted((int(name.split("-")[0]), pane) for name, pane in _written(out).items())
    starts = [start for start, _ in panes]
    assert starts == list(range(starts[0], starts[0] + 2 * len(starts), 2))  # none skipped
    # 5 rows a second, evenly spaced in event time: every window after the first (which the
    # source started inside of) holds 10; one pane per window, as the watermark passes it.
    assert [pane["count"] for _, pane in panes[1:]] == [10] * (len(panes) - 1)
    # A window fires once the source's rows have moved past its end (its event times are the
    # wall clock), not at the end of the run.
    for start, pane in panes:
        assert pane["written"] >= start + 2
    assert panes[0][1]["written"] < panes[-1][1]["written"]
