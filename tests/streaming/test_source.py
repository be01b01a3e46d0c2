"""streaming.source: Spark's micro-batch ticks turned into the roots' rows of each batch.

The processing time of a batch is the one Spark records in the batch's offsets, so a batch
run again after a failure or a restart sees the same time.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.source import BATCH, WALL_CLOCK, batch_rows, source_frame
from beam_spark_runner.streaming.source_plan import SourcePlan, SourceStep
from beam_spark_runner.streaming.topology import STAGE, Node, Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS


def _plan() -> SourcePlan:
    """A TestStream of two steps read by one stateless stage."""
    reader = Node(0, "reader", STAGE, False, 0, ((),))
    topology = Topology((reader,), {"ts": (0,)}, 0, 2, frozenset())
    steps = (
        SourceStep(elements=(("ts", (b"a", b"b")),), watermarks=(("ts", 5),), advance=7),
        SourceStep(elements=(("ts", (b"c",)),), watermarks=(("ts", 9),), advance=3),
    )
    return SourcePlan(topology, None, (steps,))


def test_each_tick_becomes_its_batchs_rows() -> None:
    plan = _plan()
    ticks = pa.record_batch({BATCH: pa.array([0, 1, 2]), WALL_CLOCK: pa.array([10, 20, 30])})
    out = list(batch_rows(plan, [ticks]))
    assert [b.to_pylist() for b in out] == [
        routed.to_batch(plan.rows(batch, clock)).to_pylist()
        for batch, clock in ((0, 10), (1, 20), (2, 30))
    ]
    # The TestStream's elements in their batches, then its watermark; +inf after its end.
    elements = [[r[routed.ELEMENT] for r in b.to_pylist() if r[routed.ELEMENT]] for b in out]
    assert elements == [[b"ab"], [b"c"], []]
    assert [[r[routed.WATERMARK] for r in b.to_pylist() if r[routed.PRODUCER]] for b in out] == [
        [5],
        [9],
        [MAX_MICROS],
    ]


@pytest.mark.skipif(
    pyspark_version() < OLDEST_STREAMING_SPARK, reason="streaming needs PySpark 3.5 or newer"
)
def test_a_batchs_processing_time_is_the_one_spark_records_in_its_offsets(
    spark_session: Any, tmp_path: Path
) -> None:
    """An Impulse root: its element in batch 0 only; each marker's processing time is the
    batch timestamp of the batch's offset-log entry (what a re-run batch reads again)."""
    reader = Node(0, "reader", STAGE, False, 0, ((),))
    plan = SourcePlan(Topology((reader,), {"impulse": (0,)}, 0, 2, frozenset()), "impulse", ())
    seen: dict[int, list[Any]] = {}
    two = threading.Event()

    def collect(frame: Any, batch_id: int) -> None:
        seen[batch_id] = [row.asDict() for row in frame.collect()]
        if len(seen) >= 2:
            two.set()

    checkpoint = tmp_path / "checkpoint"
    query = (
        source_frame(spark_session, plan)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        assert two.wait(120), "no two micro-batches in 120 s"
    finally:
        query.stop()
    for batch in (0, 1):
        rows = seen[batch]
        assert [r[routed.ELEMENT] is not None for r in rows] == [True, False][batch:]
        marker = rows[-1]
        assert (marker[routed.PRODUCER], marker[routed.WATERMARK]) == ("impulse", MAX_MICROS)
        # The offset log: a version line, the metadata, then the source's offset.
        metadata = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[1])
        assert marker[routed.PTIME] == metadata["batchTimestampMs"] * 1000
