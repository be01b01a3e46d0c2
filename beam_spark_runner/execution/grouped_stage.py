"""A GroupByKey and the one stage reading its output, in one Python function.

Where a GroupByKey's output is read by a single stateless stage, the runner groups in
that stage's ``mapInArrow`` instead of a ``mapInArrow`` of its own: each task then starts
one Python worker, not two, and the grouped elements go straight to the bundle processor
instead of back to the JVM and out again (``translators.fused_stage``). Where grouping
decodes keys and values as the stage does (no user type read as opaque bytes), they go as
the windowed values grouping made: the stage's batched steps take them as they are, and
the bundle processor's input is their encoding (``grouping.GroupedValues``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from beam_spark_runner.execution.grouping import GroupSpec, group_sorted, group_sorted_values
from beam_spark_runner.execution.stage_worker import (
    NO_SINKS,
    StageSpec,
    TaskSinks,
    run_stage,
    run_stage_bundles,
)

# Keys per bundle: what the stage read per Arrow batch when grouping ran on its own
# (Spark's default spark.sql.execution.arrow.maxRecordsPerBatch). A bundle has a fixed
# cost (start and finish, the state sampler's thread), so the 1024-key batches grouping
# hands to Spark would make more of them.
BUNDLE_KEYS = 10_000


def run_grouped_stage(
    group: GroupSpec,
    stage: StageSpec,
    batches: Iterable[pa.RecordBatch],
    sinks: TaskSinks = NO_SINKS,
    as_values: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Groups a key-sorted partition and runs ``stage`` over the groups, a bundle per batch.

    With ``as_values`` (``translators.group_by_key.grouped_as_read``) the groups are handed
    over as windowed values, else encoded.
    """
    if as_values:
        bundles = group_sorted_values(group, batches, BUNDLE_KEYS)
        yield from run_stage_bundles(stage, bundles, sinks)
    else:
        yield from run_stage(stage, group_sorted(group, batches, batch_keys=BUNDLE_KEYS), sinks)
