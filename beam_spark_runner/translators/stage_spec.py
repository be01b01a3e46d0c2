"""What a Spark task needs to run one fused stage (``execution.stage_worker.StageSpec``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.execution.partial_aggregation import NativeOutput
from beam_spark_runner.execution.stage_worker import (
    IDLE_TEARDOWN_SECONDS,
    STREAMING_IDLE_TEARDOWN_SECONDS,
    OutputSpec,
    StageSpec,
)
from beam_spark_runner.planning import (
    NATIVE_COMBINE_URN,
    BufferKind,
    Plan,
    PlannedBuffer,
    PlannedStage,
    aggregation_of,
)

if TYPE_CHECKING:
    from beam_spark_runner.translators.base import TranslationContext


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
        environment=context.environment,
        name=node.name,
        display_name=node.display_name,
        descriptor=node.descriptor.SerializeToString(),
        input_transform_id=node.input_transform_id,
        outputs=outputs,
        side_input_state=side_input_state,
        stateful=node.stateful,
        state_backed_input_coder_id=_state_backed_coder(plan, node.input_coder_id),
        batched_steps=plan.batched_steps,
        idle_teardown_seconds=(
            STREAMING_IDLE_TEARDOWN_SECONDS if plan.streaming else IDLE_TEARDOWN_SECONDS
        ),
        text_read_header=(
            _text_line_header(node, context)
            if plan.buffers[node.input_buffer_id].kind == BufferKind.TEXT_READ
            else None
        ),
    )


def native_output(plan: Plan, buffer: PlannedBuffer, coder_id: str) -> NativeOutput | None:
    """What a stage output writing to ``buffer`` with ``coder_id`` aggregates, if native."""
    if buffer.urn != NATIVE_COMBINE_URN:
        return None
    aggregation = aggregation_of(plan, buffer)
    return NativeOutput(aggregation.function, aggregation.value_type, coder_id)
