"""From fused stages to a :class:`Plan`: descriptors, buffer wiring and group coders.

A GroupByKey under default windowing (the global window, the default trigger, output at
the end of the window) ignores its input's timestamps and panes, and every element is in
the global window. Its writers then send values only: their data output coder becomes a
``param_windowed_value`` coder (:func:`value_only_group_coders`), which Beam's
``GroupingBuffer`` suggests in a TODO ("a window-dropping coder for the data plane").
"""

from __future__ import annotations

import copy
import logging

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning.phases import create_stages
from beam_spark_runner.planning.physical import decide
from beam_spark_runner.planning.plan import (
    Plan,
    PlannedBuffer,
    PlannedStage,
    SideInput,
    StageOutput,
)
from beam_spark_runner.planning.urns import (
    BUFFER_KIND_URNS,
    GROUP_BY_KEY_URN,
    NATIVE_COMBINE_URN,
    BufferKind,
)

_LOGGER = logging.getLogger(__name__)


def _remote_grpc_port(coder_id: str) -> bytes:
    port = bi.beam_fn_api_pb2.RemoteGrpcPort(coder_id=coder_id)
    # The embedded bundle processor ignores the address; it must only be non-empty.
    port.api_service_descriptor.url = "spark-arrow"
    return port.SerializeToString()


def _user_transform_name(transform: bi.beam_runner_api_pb2.PTransform) -> str | None:
    if transform.spec.urn in (bi.DATA_INPUT_URN, bi.DATA_OUTPUT_URN):
        return None
    return transform.unique_name


def _value_only_coder(context: bi.TransformContext, windowed_coder_id: str) -> str | None:
    """A ``param_windowed_value`` coder for a windowed coder in the global window, or None."""
    coders = context.components.coders
    coder = coders[windowed_coder_id]
    if coder.spec.urn != bi.WINDOWED_VALUE_CODER_URN:
        return None
    value_coder_id, window_coder_id = coder.component_coder_ids
    if coders[window_coder_id].spec.urn != bi.GLOBAL_WINDOW_CODER_URN:
        return None
    coder_id = bi.unique_name(coders, f"{windowed_coder_id}_value_only")
    coders[coder_id].CopyFrom(
        bi.beam_runner_api_pb2.Coder(
            spec=bi.beam_runner_api_pb2.FunctionSpec(
                urn=bi.PARAM_WINDOWED_VALUE_CODER_URN, payload=bi.global_window_param_payload()
            ),
            component_coder_ids=[value_coder_id, window_coder_id],
        )
    )
    return coder_id


def value_only_group_coders(
    context: bi.TransformContext, stages: list[bi.Stage]
) -> dict[bytes, str]:
    """Value-only data output coders for the GroupByKeys that ignore all but values.

    A GroupByKey whose input has Beam's default windowing gives each key one output, in
    the global window, at its end, in the only pane: its input's timestamps and panes
    never reach its output, and its elements are all in the global window. Its writers
    then encode each element's value only. Returns, per such group buffer, the coder its
    writers write and its grouping reads; the coders (and their runner-safe versions) are
    added to ``context``. Any other buffer keeps Beam's windowed-value coder, as does one
    whose writers do not all use the GroupByKey input's data-channel coder.
    """
    components = context.components
    pipeline_context = bi.PipelineContext(components)
    writer_coders: dict[bytes, set[str]] = {}
    for stage in stages:
        for transform in stage.transforms:
            if transform.spec.urn != bi.DATA_OUTPUT_URN:
                continue
            buffer_id = transform.spec.payload
            if buffer_id == bi.IMPULSE_BUFFER or bi.split_buffer_id(buffer_id)[0] not in (
                BufferKind.GROUP,
                BufferKind.NATIVE_COMBINE,
            ):
                continue
            pcoll = bi.only_element(list(transform.inputs.values()))
            writer_coders.setdefault(buffer_id, set()).add(context.data_channel_coders[pcoll])
    chosen: dict[bytes, str] = {}
    for buffer_id, coder_ids in writer_coders.items():
        group = components.transforms[bi.split_buffer_id(buffer_id)[1]]
        if group.spec.urn not in (GROUP_BY_KEY_URN, NATIVE_COMBINE_URN):
            continue
        input_id = bi.only_element(list(group.inputs.values()))
        strategy_id = components.pcollections[input_id].windowing_strategy_id
        if not pipeline_context.windowing_strategies[strategy_id].is_default():
            continue
        windowed_coder_id = context.data_channel_coders.get(input_id)
        if coder_ids != {windowed_coder_id} or windowed_coder_id is None:
            continue
        coder_id = _value_only_coder(context, windowed_coder_id)
        if coder_id is None:
            continue
        safe_id = context.safe_coders.get(windowed_coder_id, windowed_coder_id)
        safe_value_only = (
            coder_id if safe_id == windowed_coder_id else _value_only_coder(context, safe_id)
        )
        if safe_value_only is None:
            continue
        context.safe_coders[coder_id] = safe_value_only
        chosen[buffer_id] = coder_id
    return chosen


def _plan_stage(
    stage: bi.Stage,
    context: bi.TransformContext,
    uid: int,
    group_coders: dict[bytes, str] | None = None,
) -> PlannedStage:
    """Builds the process bundle descriptor and the I/O wiring of one fused stage.

    ``group_coders`` are the value-only coders of group buffers (value_only_group_coders).
    """
    transforms = [copy.deepcopy(t) for t in stage.transforms]
    inputs: list[tuple[str, bytes, str]] = []
    outputs: list[StageOutput] = []
    side_inputs: list[SideInput] = []
    for transform in transforms:
        urn = transform.spec.urn
        if urn == bi.DATA_INPUT_URN:
            pcoll = bi.only_element(list(transform.outputs.values()))
            coder_id = context.data_channel_coders[pcoll]
            inputs.append((transform.unique_name, transform.spec.payload, coder_id))
            transform.spec.payload = _remote_grpc_port(coder_id)
        elif urn == bi.DATA_OUTPUT_URN:
            pcoll = bi.only_element(list(transform.inputs.values()))
            coder_id = (group_coders or {}).get(
                transform.spec.payload, context.data_channel_coders[pcoll]
            )
            outputs.append(StageOutput(transform.unique_name, transform.spec.payload, coder_id))
            transform.spec.payload = _remote_grpc_port(coder_id)
    stateful = False
    for _, transform, payload in bi.par_do_payloads({t.unique_name: t for t in transforms}):
        stateful = stateful or bool(payload.state_specs or payload.timer_family_specs)
        # Sorted: a protobuf map's order follows the process's hash seed, and a streaming
        # restart must number the side inputs as the run that wrote its state did.
        for tag, spec in sorted(payload.side_inputs.items()):
            pcoll = transform.inputs[tag]
            side_inputs.append(
                SideInput(
                    transform.unique_name,
                    tag,
                    pcoll,
                    bi.create_buffer_id(pcoll),
                    spec.access_pattern.urn,
                )
            )
    if len(inputs) != 1:
        raise UnsupportedFeatureError(
            f"Expected fused stage '{stage.name}' to have exactly one data input, found "
            f"{len(inputs)}. This pipeline shape is not supported by SparkStructuredRunner "
            "yet; please report it with the pipeline."
        )
    input_transform_id, input_buffer_id, input_coder_id = inputs[0]
    components = context.components
    descriptor = bi.beam_fn_api_pb2.ProcessBundleDescriptor(
        id=f"stage-{uid}",
        transforms={t.unique_name: t for t in transforms},
        pcollections=dict(components.pcollections.items()),
        coders=dict(components.coders.items()),
        windowing_strategies=dict(components.windowing_strategies.items()),
        environments=dict(components.environments.items()),
        # The bundle processor needs a timer endpoint to build timer info; any
        # non-empty URL selects the channel our data channel factory returns.
        timer_api_service_descriptor=bi.endpoints_pb2.ApiServiceDescriptor(url="spark-arrow"),
    )
    return PlannedStage(
        name=stage.name,
        descriptor=descriptor,
        input_transform_id=input_transform_id,
        input_buffer_id=input_buffer_id,
        input_coder_id=input_coder_id,
        outputs=outputs,
        side_inputs=side_inputs,
        stateful=stateful,
        user_transform_names=[n for t in transforms if (n := _user_transform_name(t))],
    )


def _buffer_urn(buffer_id: bytes, components: bi.beam_runner_api_pb2.Components) -> str:
    """The URN of the runner primitive (or GroupByKey) filling the buffer."""
    if buffer_id == bi.IMPULSE_BUFFER:
        return BUFFER_KIND_URNS[BufferKind.IMPULSE]
    kind, name = bi.split_buffer_id(buffer_id)
    if kind == BufferKind.GROUP:
        return components.transforms[name].spec.urn
    if kind in BUFFER_KIND_URNS:
        return BUFFER_KIND_URNS[kind]
    raise UnsupportedFeatureError(
        f"Expected a buffer of kind group or one of {sorted(BUFFER_KIND_URNS)}; found "
        f"{buffer_id!r}. This is a bug in SparkStructuredRunner's planning; please report it."
    )


def build_plan(
    pipeline_proto: bi.beam_runner_api_pb2.Pipeline,
    is_drain: bool = False,
    use_state_iterables: bool = False,
    streaming: bool = False,
    batched_steps: bool = True,
    native_combines: bool = False,
    beam_reshuffles: bool = False,
) -> Plan:
    """Fuses the pipeline, wires stages to buffers, and decides how each stage runs.

    The flags: see ``phases.create_stages``.

    ``batched_steps``: the stages' workers run stateless steps batched
    (``execution.batched_steps``).

    A streaming run keeps Beam's windowed-value coders into every GroupByKey: its trigger
    driver holds the watermark by the elements' timestamps.
    """
    context, stages = create_stages(
        pipeline_proto, is_drain, use_state_iterables, streaming, native_combines, beam_reshuffles
    )
    group_coders = {} if streaming else value_only_group_coders(context, stages)
    planned = [_plan_stage(stage, context, uid, group_coders) for uid, stage in enumerate(stages)]
    buffers: dict[bytes, PlannedBuffer] = {}

    def buffer(buffer_id: bytes) -> PlannedBuffer:
        if buffer_id not in buffers:
            buffers[buffer_id] = PlannedBuffer(
                buffer_id, _buffer_urn(buffer_id, context.components)
            )
        return buffers[buffer_id]

    for stage in planned:
        buffer(stage.input_buffer_id).main_readers.append(stage.name)
        for index, output in enumerate(stage.outputs):
            buffer(output.buffer_id).writers.append((stage.name, index))
        for side_input in stage.side_inputs:
            readers = buffer(side_input.buffer_id).side_readers
            if stage.name not in readers:
                readers.append(stage.name)
    _LOGGER.info("Planned %d fused stages and %d buffers", len(planned), len(buffers))
    plan = Plan(
        stages=planned,
        buffers=buffers,
        components=context.components,
        data_channel_coders=dict(context.data_channel_coders),
        safe_coders=dict(context.safe_coders),
        group_input_coders=group_coders,
        batched_steps=batched_steps,
        streaming=streaming,
    )
    # The physical pass: how each stage runs, decided once for every translator.
    plan.physical = decide(plan)
    if _LOGGER.isEnabledFor(logging.DEBUG):
        _LOGGER.debug("Physical plan:\n  %s", "\n  ".join(plan.describe()))
    return plan
