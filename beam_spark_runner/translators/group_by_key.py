"""GroupByKey: shuffle on the key column, then Beam's grouping per key.

The producing stage computes each element's grouping key (see ``coders.keys``); Spark
shuffles on it; a grouped Arrow function runs Beam's ``GroupingBuffer`` over each key's
elements (see ``execution.grouping``): windows, merging windows and triggers as Beam does.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.grouping import (
    GROUPED_DDL,
    GroupSpec,
    group_key,
    group_key_pandas,
)
from beam_spark_runner.execution.stage_worker import KEY
from beam_spark_runner.planning import GROUP_BY_KEY_URN, PlannedBuffer
from beam_spark_runner.spark_compat import group_apply_arrow
from beam_spark_runner.translators.base import spark_function_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


class GroupByKeyTranslator:
    """Shuffle by key and group with Beam's trigger driver."""

    urn = GROUP_BY_KEY_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """The grouped (key, element) DataFrame of one GroupByKey."""
        plan = context.plan
        transform = plan.components.transforms[node.name]
        input_pcoll = bi.only_element(list(transform.inputs.values()))
        output_pcoll = bi.only_element(list(transform.outputs.values()))
        components = bi.beam_runner_api_pb2.Components(
            coders=dict(plan.components.coders.items()),
            windowing_strategies=dict(plan.components.windowing_strategies.items()),
            environments=dict(plan.components.environments.items()),
        )
        spec = GroupSpec(
            run_id=context.run_id,
            name=transform.unique_name,
            components=components.SerializeToString(),
            pre_grouping_coder_id=plan.data_channel_coders[input_pcoll],
            post_grouping_coder_id=plan.data_channel_coders[output_pcoll],
            windowing_strategy_id=plan.components.pcollections[input_pcoll].windowing_strategy_id,
        )
        return group_apply_arrow(
            context.union(context.writer_frames(node)),
            KEY,
            functools.partial(group_key, spec),
            functools.partial(group_key_pandas, spec),
            GROUPED_DDL,
            spark_function_name(transform.unique_name),
        )
