"""Fused stages: Beam's bundle processor inside ``mapInArrow``.

A fused stage reads its input buffer's DataFrame and runs it through Beam's SDK worker in
each Spark task (see ``execution.stage_worker``). A stateful stage's input is first shuffled
on the element's key and sorted by it, so that each task runs whole keys. A stage's output
is one DataFrame of (tag, key, element) rows, tag naming which of the stage's outputs a row
belongs to; readers of each output filter on the tag. Side inputs are materialised once on
the driver and broadcast (see ``execution.side_inputs``).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.execution.grouped_stage import run_grouped_stage
from beam_spark_runner.execution.side_inputs import side_input_state_entries
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    KEY,
    OutputSpec,
    StageSpec,
    run_stage,
)
from beam_spark_runner.planning import (
    EXECUTABLE_STAGE_URN,
    GROUP_BY_KEY_URN,
    TEXT_READ_BUFFER_KIND,
    Plan,
    PlannedStage,
)
from beam_spark_runner.spark_compat import named_function
from beam_spark_runner.translators.base import spark_function_name, stage_output_type
from beam_spark_runner.translators.group_by_key import group_spec, sorted_by_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext

_LOGGER = logging.getLogger(__name__)


def _state_backed_coder(plan: Plan, coder_id: str) -> str | None:
    """The runner-safe version of ``coder_id`` if it has a state-backed iterable in it."""
    safe_id = plan.safe_coders.get(coder_id, coder_id)
    coders = plan.components.coders
    pending = [safe_id]
    while pending:
        coder = coders[pending.pop()]
        if coder.spec.urn == bi.STATE_BACKED_ITERABLE_CODER_URN:
            return safe_id
        pending.extend(coder.component_coder_ids)
    return None


def _text_line_header(node: PlannedStage, context: TranslationContext) -> bytes:
    """What the stage's input coder writes before a line's length (see execution.text_read).

    Planning reads natively only lines coded as ``str`` in the global window; this checks
    that the input coder writes every line as this header, a varint length and its bytes.
    """
    from apache_beam.transforms.window import GlobalWindows

    impl = context.pipeline_context.coders[node.input_coder_id].get_impl()
    empty = impl.encode_nested(GlobalWindows.windowed_value(""))
    header = empty[:-1]
    line = "é" * 100
    if (
        node.stateful
        or empty[-1:] != b"\x00"
        or impl.encode_nested(GlobalWindows.windowed_value(line))
        != header + b"\xc8\x01" + line.encode()
    ):
        raise UnsupportedFeatureError(
            f"Stage {node.display_name} reads text lines with coder {node.input_coder_id}, "
            "which does not write them as the runner's native text read expects. This is a "
            "bug in SparkStructuredRunner's planning; please report it with the pipeline."
        )
    return header


def groups_in_stage(plan: Plan, node: PlannedStage) -> bool:
    """Whether the stage groups its input itself: the GroupByKey's only reader, stateless.

    A GroupByKey read by more than one stage, or as a side input, keeps its own
    DataFrame (computed once, persisted if read twice); a stateful stage re-shuffles its
    input on the key.
    """
    buffer = plan.buffers[node.input_buffer_id]
    return (
        buffer.urn == GROUP_BY_KEY_URN
        and buffer.main_readers == [node.name]
        and not buffer.side_readers
        and not node.stateful
    )


def stage_spec(
    node: PlannedStage, context: TranslationContext, side_input_state: object | None = None
) -> StageSpec:
    """What a Spark task needs to run the stage (``side_input_state``: a broadcast)."""
    plan = context.plan
    outputs = tuple(
        OutputSpec(
            transform_id=output.transform_id,
            key_coder_id=(
                plan.safe_coders.get(output.coder_id, output.coder_id)
                if plan.is_keyed(output.buffer_id)
                else None
            ),
        )
        for output in node.outputs
    )
    return StageSpec(
        run_id=context.run_id,
        name=node.name,
        display_name=node.display_name,
        descriptor=node.descriptor.SerializeToString(),
        input_transform_id=node.input_transform_id,
        outputs=outputs,
        side_input_state=side_input_state,
        stateful=node.stateful,
        state_backed_input_coder_id=_state_backed_coder(plan, node.input_coder_id),
        pickle_library=context.pickle_library,
        main_session=context.main_session,
        text_read_header=(
            _text_line_header(node, context)
            if plan.buffers[node.input_buffer_id].kind == TEXT_READ_BUFFER_KIND
            else None
        ),
    )


class FusedStageTranslator:
    """``mapInArrow`` of the stage's input through Beam's bundle processor."""

    urn = EXECUTABLE_STAGE_URN

    def translate(self, node: PlannedStage, context: TranslationContext) -> DataFrame:
        """The stage's (tag, key, element) output DataFrame."""
        plan = context.plan
        spec = stage_spec(node, context, self._side_input_state(node, context))
        input_buffer = plan.buffers[node.input_buffer_id]
        if groups_in_stage(plan, node):
            # One Python worker per task for the grouping and the stage (execution.grouped_stage).
            input_frame = sorted_by_key(input_buffer, context)
            body = functools.partial(
                run_grouped_stage, group_spec(input_buffer, context), spec, sinks=context.sinks
            )
        else:
            input_frame = context.buffer_frame(node.input_buffer_id)
            if node.stateful:
                # Each key's elements in one task, in one run: its state lives while it runs.
                input_frame = input_frame.repartition(KEY).sortWithinPartitions(KEY)
            body = functools.partial(run_stage, spec, sinks=context.sinks)
        function = named_function(body, spark_function_name(node.display_name))
        return input_frame.mapInArrow(function, stage_output_type())

    @staticmethod
    def _side_input_state(node: PlannedStage, context: TranslationContext) -> object | None:
        if not node.side_inputs:
            return None
        plan = context.plan
        entries: list[tuple[bytes, bytes]] = []
        for side_input in node.side_inputs:
            elements = context.side_input_elements.get(side_input.buffer_id)
            if elements is None:
                frame = context.buffer_frame(side_input.buffer_id)
                context.spark.sparkContext.setJobDescription(
                    f"Beam side input {side_input.pcollection_id} (for {node.display_name})"
                )
                elements = [bytes(row[0]) for row in frame.select(ELEMENT).collect()]
                context.side_input_elements[side_input.buffer_id] = elements
            data_channel_coder = plan.data_channel_coders[side_input.pcollection_id]
            value_coder = context.pipeline_context.coders[plan.safe_coders[data_channel_coder]]
            entries.extend(
                side_input_state_entries(
                    side_input.transform_id,
                    side_input.tag,
                    side_input.access_pattern_urn,
                    elements,
                    value_coder,
                )
            )
        _LOGGER.info(
            "Stage %s: %d side input(s), %d state entries broadcast",
            node.display_name,
            len(node.side_inputs),
            len(entries),
        )
        broadcast = context.spark.sparkContext.broadcast(entries)
        context.broadcasts.append(broadcast)
        return broadcast
