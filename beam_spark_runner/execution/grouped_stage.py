"""A GroupByKey and the one fused stage that reads it, in one Spark task.

When a GroupByKey's output is read by a single stateless stage (the common case: a
GroupByKey followed by a ParDo), grouping and the stage run in the same ``mapInArrow``:
the sorted partition is grouped (``execution.grouping``) and the grouped batches go
straight into the stage's bundle processor (``execution.stage_worker``). That saves
sending every group back to the JVM and out to a second Python worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from beam_spark_runner.execution.grouping import GroupSpec, group_sorted
from beam_spark_runner.execution.stage_worker import NO_SINKS, StageSpec, TaskSinks, run_stage


def run_grouped_stage(
    group: GroupSpec,
    spec: StageSpec,
    batches: Iterable[pa.RecordBatch],
    sinks: TaskSinks = NO_SINKS,
) -> Iterator[pa.RecordBatch]:
    """Groups a key-sorted partition and runs the reading stage over the groups."""
    yield from run_stage(spec, group_sorted(group, batches), sinks)
