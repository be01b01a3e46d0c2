"""Fused stages: Beam's bundle processor inside ``mapInArrow``.

A fused stage reads its input buffer's DataFrame and runs it through Beam's SDK worker in
each Spark task (see ``execution.stage_worker``). A stateful stage's input is first shuffled
on the element's key and sorted by it, so that each task runs whole keys. A stage's output
is one DataFrame of (tag, key, element) rows, tag naming which of the stage's outputs a row
belongs to; readers of each output filter on the tag. Side inputs are materialised once on
the driver and broadcast (see ``driver_side_inputs``). How the stage gets its input is the
plan's decision (``planning.physical``): the translator only follows it.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from beam_spark_runner.execution.grouped_stage import run_grouped_stage
from beam_spark_runner.execution.inline_side_inputs import (
    GroupedWriter,
    InlineSideInput,
    run_stage_with_inline_side_inputs,
    side_input_marker,
)
from beam_spark_runner.execution.native_combine import run_native_combined_stage
from beam_spark_runner.execution.stage_worker import ELEMENT, KEY, has_typed_outputs, run_stage
from beam_spark_runner.planning import EXECUTABLE_STAGE_URN, PlannedStage, StageInput
from beam_spark_runner.spark.compat import named_function
from beam_spark_runner.spark.map_in_arrow import map_in_arrow
from beam_spark_runner.translators.base import (
    coder_closure,
    spark_function_name,
    stage_output_type,
)
from beam_spark_runner.translators.driver_side_inputs import broadcast_side_inputs, driver_rows
from beam_spark_runner.translators.group_by_key import group_spec, grouped_as_read, sorted_by_key
from beam_spark_runner.translators.native_combine import aggregated, native_combine_spec
from beam_spark_runner.translators.stage_spec import stage_spec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext

_LOGGER = logging.getLogger(__name__)

# Where streaming.query and tests find them.
__all__ = ["FusedStageTranslator", "broadcast_side_inputs", "stage_spec"]


class FusedStageTranslator:
    """``mapInArrow`` of the stage's input through Beam's bundle processor."""

    urn = EXECUTABLE_STAGE_URN

    def translate(self, node: PlannedStage, context: TranslationContext) -> DataFrame:
        """The stage's (tag, key, element) output DataFrame, as the plan decided it runs."""
        plan = context.plan
        strategy = plan.strategy(node.name)
        if strategy.on_driver:
            rows = driver_rows(node.name, context)
            if rows is not None:
                # Written on the driver: its main-input readers read them without running it.
                return context.literal_stage_rows(rows)
        inline = strategy.input is StageInput.INLINE_SIDE_INPUTS
        spec = stage_spec(node, context, None if inline else broadcast_side_inputs(node, context))
        input_buffer = plan.buffers[node.input_buffer_id]
        if strategy.input is StageInput.NATIVE_COMBINED:
            # The combine's output elements are written in this stage's own task.
            input_frame = aggregated(input_buffer, context)
            body = functools.partial(
                run_native_combined_stage,
                native_combine_spec(input_buffer, context),
                spec,
                sinks=context.sinks,
            )
        elif strategy.input is StageInput.GROUPED:
            # One Python worker per task for the grouping and the stage (execution.grouped_stage).
            input_frame = sorted_by_key(input_buffer, context)
            body = functools.partial(
                run_grouped_stage,
                group_spec(input_buffer, context),
                spec,
                sinks=context.sinks,
                as_values=grouped_as_read(input_buffer, plan),
            )
        elif inline:
            writer = (
                None
                if strategy.side_input_writer is None
                else plan.stage(strategy.side_input_writer)
            )
            input_frame = (
                self._with_side_input_rows(node, context)
                if writer is None
                else self._with_writer_rows(node, writer, context)
            )
            body = functools.partial(
                run_stage_with_inline_side_inputs,
                spec,
                self._inline_side_inputs(node, context),
                sinks=context.sinks,
                writer=None if writer is None else self._grouped_writer(writer, context),
            )
        else:
            input_frame = context.buffer_frame(node.input_buffer_id)
            if strategy.input is StageInput.KEY_SORTED:
                # Each key's elements in one task, in one run: its state lives while it runs.
                input_frame = input_frame.repartition(KEY).sortWithinPartitions(KEY)
            body = functools.partial(run_stage, spec, sinks=context.sinks)
        function = named_function(body, spark_function_name(node.display_name))
        return map_in_arrow(
            input_frame, function, stage_output_type(has_typed_outputs(spec.outputs))
        )

    @staticmethod
    def _inline_side_inputs(
        node: PlannedStage, context: TranslationContext
    ) -> tuple[InlineSideInput, ...]:
        plan = context.plan
        side_inputs = []
        for side_input in node.side_inputs:
            data_channel_coder = plan.data_channel_coders[side_input.pcollection_id]
            coder_id = plan.safe_coders[data_channel_coder]
            side_inputs.append(
                InlineSideInput(
                    transform_id=side_input.transform_id,
                    tag=side_input.tag,
                    access_pattern_urn=side_input.access_pattern_urn,
                    coder_id=coder_id,
                    coder_components=coder_closure(plan, coder_id),
                )
            )
        return tuple(side_inputs)

    @staticmethod
    def _with_writer_rows(
        node: PlannedStage, writer: PlannedStage, context: TranslationContext
    ) -> DataFrame:
        """The main rows (null key) and the side input writer's key-sorted input, one partition.

        The writer's input partitions follow one another, each sorted: each key's rows stay
        together, as grouping needs.
        """
        writer_input = context.plan.buffers[writer.input_buffer_id]
        _LOGGER.info(
            "Stage %s: its side input's stage %s runs in the stage's own task",
            node.display_name,
            writer.display_name,
        )
        frames = [context.buffer_frame(node.input_buffer_id), sorted_by_key(writer_input, context)]
        return context.union_frames(frames).coalesce(1)

    @staticmethod
    def _grouped_writer(writer: PlannedStage, context: TranslationContext) -> GroupedWriter:
        writer_input = context.plan.buffers[writer.input_buffer_id]
        return GroupedWriter(
            group_spec(writer_input, context),
            stage_spec(writer, context),
            grouped_as_read(writer_input, context.plan),
        )

    @staticmethod
    def _with_side_input_rows(node: PlannedStage, context: TranslationContext) -> DataFrame:
        """The main rows (null key) and each side input's rows (its marker), one partition.

        A coalesce, not a shuffle: the side inputs' writers (see
        ``planning.physical.reads_side_inputs_inline``) run in the same task, and the
        pipeline has one stage boundary less.
        """
        from pyspark.sql import functions as F

        frames = [context.buffer_frame(node.input_buffer_id)]
        for index, side_input in enumerate(node.side_inputs):
            frame = context.buffer_frame(side_input.buffer_id)
            frames.append(
                frame.select(F.lit(bytearray(side_input_marker(index))).alias(KEY), frame[ELEMENT])
            )
        _LOGGER.info(
            "Stage %s: %d side input(s) read in the stage's own task",
            node.display_name,
            len(node.side_inputs),
        )
        return context.union_frames(frames).coalesce(1)
