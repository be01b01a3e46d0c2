"""The streaming query's one source: the roots' rows, micro-batch by micro-batch.

Spark's own ``rate-micro-batch`` source, one row per micro-batch (its ``value`` counts the
batches from 0), turned into the batch's rows (``source_plan.SourcePlan``, pickled with the
function) by a ``mapInArrow`` in the workers. It offers a batch every trigger, so every
micro-batch runs and carries each root's watermark marker: timers and windows fire without
new data. A batch's processing time is Spark's batch timestamp, recorded in its offsets, so
a batch recomputed after a failure or a restart sees the same time. Spark's own source,
unlike a PySpark ``DataSource``, starts no Python process to serve offsets or plan a query.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from beam_spark_runner.spark.compat import named_function
from beam_spark_runner.spark.map_in_arrow import ArrowFunction, map_in_arrow, then
from beam_spark_runner.streaming.rows import routed_type, to_batch
from beam_spark_runner.streaming.source_plan import SourcePlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TICKS_FORMAT = "rate-micro-batch"
BATCH = "batch"
WALL_CLOCK = "wall_clock"


def source_frame(
    spark: SparkSession, plan: SourcePlan, router: ArrowFunction | None = None
) -> DataFrame:
    """The rows of every micro-batch: ``plan``'s, as ``rows.routed_type()``.

    Through ``router`` (the query's first router, in the same ``mapInArrow``) if given.
    """
    ticks = (
        spark.readStream.format(TICKS_FORMAT)
        .option("rowsPerBatch", 1)
        .option("numPartitions", 1)
        .load()
    )
    ticks = ticks.selectExpr(
        f"value AS {BATCH}", f"unix_micros(current_timestamp()) AS {WALL_CLOCK}"
    )
    body: ArrowFunction = functools.partial(batch_rows, plan)
    name = "beam_source"
    if router is not None:
        body, name = then(body, router), f"{name}_then_{router.__name__}"
    return map_in_arrow(ticks, named_function(body, name), routed_type())


def batch_rows(plan: SourcePlan, ticks: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The rows of the micro-batches ``ticks`` name (a batch number and its time each)."""
    for tick in ticks:
        for batch, wall_clock in zip(
            tick.column(BATCH).to_pylist(), tick.column(WALL_CLOCK).to_pylist(), strict=True
        ):
            yield to_batch(plan.rows(batch, wall_clock))
