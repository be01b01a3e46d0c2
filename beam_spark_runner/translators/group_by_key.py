"""GroupByKey: shuffle and sort on the key column, then Beam's grouping per key.

The producing stage computes each element's grouping key (see ``coders.keys``); Spark
shuffles on it and sorts each partition by it; ``mapInArrow`` runs Beam's
``GroupingBuffer`` over each key's run of elements (see ``execution.grouping``): windows,
merging windows and triggers as Beam does.

*Why not* ``groupBy().applyInArrow``: it makes one Python call and one Arrow stream per key
(and converts through pandas on Spark 3.5, which lacks it). Spark sorts within partitions
for grouped maps anyway; walking the sorted partition ourselves costs one call per batch.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.arrow_columns import KEY
from beam_spark_runner.execution.grouping import GroupSpec, group_sorted
from beam_spark_runner.planning import GROUP_BY_KEY_URN, Plan, PlannedBuffer
from beam_spark_runner.spark.compat import named_function
from beam_spark_runner.spark.map_in_arrow import map_in_arrow
from beam_spark_runner.translators.base import keyed_rows_type, spark_function_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


def grouping_coder_id(plan: Plan, data_channel_coder_id: str) -> str:
    """The coder grouping decodes with: the runner-safe one, unless windows would be opaque.

    Runner-safe coders read user-coded keys and values as opaque bytes, so grouping never
    unpickles user objects (as in FnApiRunner). For a custom window coder the safe coder
    makes the windows opaque too; merging them needs the real windows, so then the SDK
    coder is used.
    """
    safe_id = plan.safe_coders.get(data_channel_coder_id, data_channel_coder_id)
    safe = plan.components.coders[safe_id]
    if safe.spec.urn == bi.common_urns.coders.WINDOWED_VALUE.urn:
        window_coder = plan.components.coders[safe.component_coder_ids[1]]
        if window_coder.spec.urn == bi.python_urns.TIMESTAMP_PREFIXED_OPAQUE_WINDOW_CODER:
            return data_channel_coder_id
    return safe_id


def grouped_as_read(node: PlannedBuffer, plan: Plan) -> bool:
    """Whether grouping decodes the GroupByKey's output as its reading stage would.

    So where no key or value is read as opaque bytes (the runner-safe coder is the stage's
    own): the stage can then take the grouped windowed values as they are.
    """
    transform = plan.components.transforms[node.name]
    output_pcoll = bi.only_element(list(transform.outputs.values()))
    channel_coder_id = plan.data_channel_coders[output_pcoll]
    return grouping_coder_id(plan, channel_coder_id) == channel_coder_id


def group_spec(node: PlannedBuffer, context: TranslationContext) -> GroupSpec:
    """What grouping the buffer of one GroupByKey needs in each task."""
    plan = context.plan
    transform = plan.components.transforms[node.name]
    input_pcoll = bi.only_element(list(transform.inputs.values()))
    output_pcoll = bi.only_element(list(transform.outputs.values()))
    components = bi.beam_runner_api_pb2.Components(
        coders=dict(plan.components.coders.items()),
        windowing_strategies=dict(plan.components.windowing_strategies.items()),
        environments=dict(plan.components.environments.items()),
    )
    return GroupSpec(
        environment=context.environment,
        name=transform.unique_name,
        components=components.SerializeToString(),
        pre_grouping_coder_id=grouping_coder_id(
            plan,
            plan.group_input_coders.get(node.buffer_id, plan.data_channel_coders[input_pcoll]),
        ),
        post_grouping_coder_id=grouping_coder_id(plan, plan.data_channel_coders[output_pcoll]),
        windowing_strategy_id=plan.components.pcollections[input_pcoll].windowing_strategy_id,
    )


def sorted_by_key(node: PlannedBuffer, context: TranslationContext) -> DataFrame:
    """The writers' (key, element) rows, shuffled on the key and sorted by it.

    Rows that all have one key (``planning.physical.has_one_key``) go to one partition,
    unsorted: hashed over every core they would still all land in one partition, and each
    of the others would be a task starting a Python worker for nothing.
    """
    union = context.union(context.writer_frames(node))
    if node.buffer_id in context.plan.physical.single_key_groups:
        return union.repartition(1)
    return union.repartition(union[KEY]).sortWithinPartitions(union[KEY])


class GroupByKeyTranslator:
    """Shuffle by key and group with Beam's trigger driver."""

    urn = GROUP_BY_KEY_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """The grouped (key, element) DataFrame of one GroupByKey."""
        spec = group_spec(node, context)
        function = named_function(
            functools.partial(group_sorted, spec), spark_function_name(spec.name)
        )
        return map_in_arrow(sorted_by_key(node, context), function, keyed_rows_type())
