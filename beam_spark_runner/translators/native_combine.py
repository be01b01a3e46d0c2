"""Native combines: a CombinePerKey of Beam's sum, min, max, count or mean as a Spark aggregation.

Planning (``planning.phases.native_combines``) turns such a combine into a
``nativecombine:`` buffer whose writers send the grouping key and a typed value
(``coders.typed_values``). Here the rows become ``groupBy(key).agg(...)``, aggregated in the
JVM, and each key's row becomes the element Beam's lifted combine would give
(``execution.native_combine``): in the reading stage's task where it is the only reader, in
a ``mapInArrow`` of its own otherwise. Integer sums are exact (``decimal(38, 0)``); float
sums may add in another order than Beam's bundles; Spark orders NaN above every float, so a
float max with a NaN is NaN and a min ignores it, where Python's depend on value order.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.arrow_columns import KEY
from beam_spark_runner.execution.native_combine import (
    COUNT,
    RESULT,
    NativeCombineSpec,
    encode_results,
)
from beam_spark_runner.execution.partial_aggregation import VALUE_COLUMNS, VALUE_COUNT
from beam_spark_runner.planning import (
    NATIVE_COMBINE_URN,
    NativeAggregation,
    PlannedBuffer,
    aggregation_of,
)
from beam_spark_runner.spark.compat import named_function
from beam_spark_runner.spark.map_in_arrow import map_in_arrow
from beam_spark_runner.translators.base import (
    coder_closure,
    keyed_rows_type,
    spark_function_name,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from beam_spark_runner.translators.base import TranslationContext

_VALUE = "value"


def _aggregates(aggregation: NativeAggregation) -> list[Column]:
    """Spark's merge of the writers' partial aggregates (execution.partial_aggregation)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType

    value = F.col(_VALUE)
    counts = F.sum(F.col(VALUE_COUNT))
    if aggregation.function == "count":
        return [counts.alias(RESULT)]
    # Python's sum of integers does not overflow: an exact decimal sum.
    total = F.sum(value.cast(DecimalType(38, 0)) if aggregation.value_type == "int" else value)
    if aggregation.function == "sum":
        return [total.alias(RESULT)]
    if aggregation.function == "mean":
        return [total.alias(RESULT), counts.alias(COUNT)]
    if aggregation.function == "min":
        return [F.min(value).alias(RESULT)]
    if aggregation.function == "max":
        return [F.max(value).alias(RESULT)]
    raise ValueError(
        f"Expected a native aggregation of sum, min, max, count or mean, found "
        f"{aggregation.function!r}. This is a bug in SparkStructuredRunner's planning."
    )


def aggregated(node: PlannedBuffer, context: TranslationContext) -> DataFrame:
    """One row per key: the key, the aggregate (``RESULT``) and, for a mean, ``COUNT``."""
    aggregation = aggregation_of(context.plan, node)
    frames = []
    for stage_name, index in node.writers:
        frame = context.output_frame(stage_name, index)
        columns = [frame[KEY], frame[VALUE_COUNT]]
        if aggregation.value_type in VALUE_COLUMNS:
            columns.append(frame[VALUE_COLUMNS[aggregation.value_type]].alias(_VALUE))
        frames.append(frame.select(*columns))
    union = context.union_frames(frames)
    return union.groupBy(union[KEY]).agg(*_aggregates(aggregation))


def native_combine_spec(node: PlannedBuffer, context: TranslationContext) -> NativeCombineSpec:
    """What a task needs to turn the aggregated rows into the combine's output elements."""
    plan = context.plan
    transform = plan.components.transforms[node.name]
    input_pcoll = bi.only_element(list(transform.inputs.values()))
    output_pcoll = bi.only_element(list(transform.outputs.values()))
    written = plan.group_input_coders.get(node.buffer_id, plan.data_channel_coders[input_pcoll])
    output = plan.data_channel_coders[output_pcoll]
    aggregation = aggregation_of(plan, node)
    coder_ids = (
        plan.safe_coders.get(written, written),
        output,
        plan.safe_coders.get(output, output),
    )
    return NativeCombineSpec(
        environment=context.environment,
        name=transform.unique_name,
        function=aggregation.function,
        value_type=aggregation.value_type,
        components=coder_closure(plan, *coder_ids),
        input_coder_id=coder_ids[0],
        output_coder_id=coder_ids[1],
        safe_output_coder_id=coder_ids[2],
    )


class NativeCombineTranslator:
    """``groupBy(key).agg(...)``, then the combine's output elements."""

    urn = NATIVE_COMBINE_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """The (key, element) DataFrame of the combine's output."""
        spec = native_combine_spec(node, context)
        function = named_function(
            functools.partial(encode_results, spec), spark_function_name(spec.name)
        )
        return map_in_arrow(aggregated(node, context), function, keyed_rows_type())
