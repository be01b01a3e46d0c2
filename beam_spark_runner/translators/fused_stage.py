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
from beam_spark_runner.execution.inline_side_inputs import (
    GroupedWriter,
    InlineSideInput,
    run_stage_with_inline_side_inputs,
    side_input_marker,
)
from beam_spark_runner.execution.native_combine import run_native_combined_stage
from beam_spark_runner.execution.side_inputs import side_input_state_entries
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    IDLE_TEARDOWN_SECONDS,
    KEY,
    STREAMING_IDLE_TEARDOWN_SECONDS,
    OutputSpec,
    StageSpec,
    has_typed_outputs,
    run_stage,
)
from beam_spark_runner.planning import (
    CREATE_BUFFER_KIND,
    EXECUTABLE_STAGE_URN,
    GROUP_BY_KEY_URN,
    NATIVE_COMBINE_BUFFER_KIND,
    TEXT_READ_BUFFER_KIND,
    Plan,
    PlannedStage,
    decode_create_payload,
)
from beam_spark_runner.spark.compat import InlineValue, named_function
from beam_spark_runner.translators.base import (
    coder_closure,
    spark_function_name,
    stage_output_type,
)
from beam_spark_runner.translators.driver_side_inputs import (
    side_input_elements as driver_side_input_elements,
)
from beam_spark_runner.translators.group_by_key import group_spec, grouped_as_read, sorted_by_key
from beam_spark_runner.translators.map_in_arrow import map_in_arrow
from beam_spark_runner.translators.native_combine import (
    aggregated,
    combined_in_stage,
    native_combine_spec,
    native_output,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext

_LOGGER = logging.getLogger(__name__)

# A stage reading side inputs whose main input is at most this many literal rows (an
# Impulse, a small Create) may read them in its own task, in the pipeline's one Spark job
# (execution.inline_side_inputs), instead of in a collect-and-broadcast job of their own.
INLINE_SIDE_INPUTS_MAX_MAIN_ROWS = 64
_MERGE_ACCUMULATORS_URN: str = (
    bi.common_urns.combine_components.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn
)


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
            native=native_output(plan, plan.buffers[output.buffer_id], output.coder_id),
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
        batched_steps=plan.batched_steps,
        idle_teardown_seconds=(
            STREAMING_IDLE_TEARDOWN_SECONDS if plan.streaming else IDLE_TEARDOWN_SECONDS
        ),
        text_read_header=(
            _text_line_header(node, context)
            if plan.buffers[node.input_buffer_id].kind == TEXT_READ_BUFFER_KIND
            else None
        ),
    )


def _literal_row_count(plan: Plan, node: PlannedStage) -> int | None:
    """How many rows the stage's main input has, if it is literal (Impulse, Create)."""
    buffer = plan.buffers[node.input_buffer_id]
    if buffer.kind == "impulse":
        return 1
    if buffer.kind == CREATE_BUFFER_KIND:
        return len(decode_create_payload(plan.components.transforms[buffer.name].spec.payload))
    return None


def _merges_combined_groups(plan: Plan, stage_name: str) -> bool:
    """Whether a stage reads a GroupByKey and merges combiner accumulators per key.

    Or reads a native combine's output: the combine's aggregation ran in Spark.

    Such a stage (the second half of a lifted ``CombinePerKey``) does little per key, so
    running all its partitions in one task costs little.
    """
    stage = plan.stage(stage_name)
    kind = plan.buffers[stage.input_buffer_id].kind
    if kind == NATIVE_COMBINE_BUFFER_KIND:
        return True  # the JVM merged them: the stage writes one element per key
    return kind == "group" and any(
        transform.spec.urn == _MERGE_ACCUMULATORS_URN
        for transform in stage.descriptor.transforms.values()
    )


def reads_side_inputs_inline(plan: Plan, node: PlannedStage) -> bool:
    """Whether the stage reads its side inputs from its own input (one task, no extra job).

    It does when its main input is a few literal rows and every side input is written by a
    stage that merges combined groups: ``CombineGlobally``'s default value, read by a
    ``Map`` over ``Create([None])``, is the common case. The stage's input and the side
    inputs' writers then run in one Spark task (``coalesce(1)``, no shuffle); any other
    side input keeps the collect-and-broadcast job, so the stages computing it keep their
    parallelism.
    """
    if not node.side_inputs or node.stateful:
        return False
    if not all(_inline_side_buffer(plan, node, s.buffer_id) for s in node.side_inputs):
        return False
    rows = _literal_row_count(plan, node)  # decodes a Create's payload: checked last
    return rows is not None and rows <= INLINE_SIDE_INPUTS_MAX_MAIN_ROWS


def grouped_side_input_writer(plan: Plan, node: PlannedStage) -> PlannedStage | None:
    """The stage writing an inline-read stage's only side input, run in the stage's task.

    So where that writer groups its own input (``groups_in_stage``), reads no side input and
    writes nothing else: a ``CombineGlobally``'s merge, read by its default value's stage.
    """
    if len(node.side_inputs) != 1:
        return None
    writers = plan.buffers[node.side_inputs[0].buffer_id].writers
    if len(writers) != 1:
        return None
    writer = plan.stage(writers[0][0])
    if len(writer.outputs) != 1 or writer.side_inputs or not groups_in_stage(plan, writer):
        return None
    return writer


def _inline_side_buffer(plan: Plan, node: PlannedStage, buffer_id: bytes) -> bool:
    """Whether ``node`` alone reads the buffer, and only stages merging groups write it.

    Read by another stage too, the buffer would be computed once per reader.
    """
    buffer = plan.buffers[buffer_id]
    return (
        bool(buffer.writers)
        and not buffer.main_readers
        and set(buffer.side_readers) == {node.name}
        and all(_merges_combined_groups(plan, writer) for writer, _ in buffer.writers)
    )


class FusedStageTranslator:
    """``mapInArrow`` of the stage's input through Beam's bundle processor."""

    urn = EXECUTABLE_STAGE_URN

    def translate(self, node: PlannedStage, context: TranslationContext) -> DataFrame:
        """The stage's (tag, key, element) output DataFrame."""
        plan = context.plan
        inline = reads_side_inputs_inline(plan, node)
        spec = stage_spec(node, context, None if inline else broadcast_side_inputs(node, context))
        input_buffer = plan.buffers[node.input_buffer_id]
        if combined_in_stage(plan, node):
            # The combine's output elements are written in this stage's own task.
            input_frame = aggregated(input_buffer, context)
            body = functools.partial(
                run_native_combined_stage,
                native_combine_spec(input_buffer, context),
                spec,
                sinks=context.sinks,
            )
        elif groups_in_stage(plan, node):
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
            writer = grouped_side_input_writer(plan, node)
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
            if node.stateful:
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
        :func:`reads_side_inputs_inline`) run in the same task, and the pipeline has one
        stage boundary less.
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


def broadcast_side_inputs(
    node: PlannedStage, context: TranslationContext, inline: bool = False
) -> object | None:
    """The stage's side inputs, collected (one Spark job each) and broadcast as state entries.

    None for a stage without side inputs. Batch stages read them so; in a streaming run, so
    do stages whose side inputs are all bounded (``streaming.bounded_side_inputs``), with
    ``inline`` for stateful ones: the entries travel with the stage
    (``spark_compat.InlineValue``), as ``transformWithState`` workers load no broadcasts.
    """
    if not node.side_inputs:
        return None
    plan = context.plan
    entries: list[tuple[bytes, bytes]] = []
    for side_input in node.side_inputs:
        elements = context.side_input_elements.get(side_input.buffer_id)
        if elements is None:
            elements = driver_side_input_elements(side_input.buffer_id, context)
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
    if inline:
        return InlineValue(entries)
    broadcast = context.spark.sparkContext.broadcast(entries)
    context.broadcasts.append(broadcast)
    return broadcast
