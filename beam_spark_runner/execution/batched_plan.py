"""Which steps of a fused stage run batched (``execution.batched_steps``), from its descriptor.

Decided once per stage worker. A step qualifies if it is a ParDo with one main input and one
output, iterable side inputs only, no state, timers, restriction or finalization, and a DoFn
the batched path can run (``batched_policy.unbatchable_dofn_reason``); a standard
``WindowInto``; a one-input Flatten; or a lifted combine's phase or ``KeyWithVoid``
(``batched_dofns``). From the stage's input, a PCollection whose readers all qualify runs
batched; one read by a step that does not is the *hand-off*, from which the bundle processor
runs the rest from a trimmed copy of the descriptor. A stage with no steps whose outputs
write its input's coder passes encoded elements through (``pass_through_coder_id``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import (
    batched_dofns,
    batched_policy,
    batched_precombine,
    batched_side_inputs,
)

_LOGGER = logging.getLogger(__name__)

DATA_INPUT_URN = bi.DATA_INPUT_URN
DATA_OUTPUT_URN = bi.DATA_OUTPUT_URN
WINDOW_INTO_URN = "beam:transform:window_into:v1"
FLATTEN_URN = "beam:transform:flatten:v1"
PAR_DO_URN = "beam:transform:pardo:v1"


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One batched step: a qualifying transform of the descriptor."""

    transform_id: str
    step_name: str
    input_pcollection: str
    output_pcollection: str
    # Builds a fresh DoFn instance, its windowing and its extra arguments (Map(fn, *args,
    # **kwargs): plain values), a new instance after each teardown.
    make_dofn: Callable[[], tuple[Any, Any, tuple[Any, ...], dict[str, Any]]]
    # How the step runs (``batched_step_kinds.STEP_KINDS``): "runner" (Beam's DoFnRunner
    # per element), "pass", "precombine", "window_into", "combine_phase", or a direct call:
    # "direct", "params" (taking its timestamp or window), "global_sides" or
    # "window_sides" (with side inputs read for the global window, or per window).
    kind: str = "runner"
    # A ParDo with side inputs (read as iterables): its side-input maps, given the stage's
    # state handler (``batched_side_inputs.side_input_maps``).
    side_inputs: Callable[[Any], list[Any]] | None = None


@dataclasses.dataclass(frozen=True)
class BatchedPlan:
    """What runs batched in a stage, and the descriptor of the rest."""

    input_transform_id: str
    input_coder_id: str
    input_pcollection: str
    steps: tuple[StepSpec, ...]
    # Data output transform id -> (its input PCollection, its windowed coder id).
    direct_outputs: dict[str, tuple[str, str]]
    # The PCollection handed to the bundle processor, and its hand-off coder id.
    handoff: tuple[str, str] | None
    # Names this stage worker's hand-off (beam_internals.hand_off).
    token: str
    # The descriptor for the rest of the stage (None: everything runs batched).
    remainder: Any
    # PCollection id -> its windowed coder id, for sampled sizes.
    coder_ids: dict[str, str]
    # A copy of the descriptor holding every coder above.
    coders: Any
    # A stage of no steps whose outputs all write the input's coder: the coder that reads
    # where each input element ends (its length-prefixed parts as bytes), and the batch
    # hands the encoded elements through. None for any other stage.
    pass_through_coder_id: str | None = None


def _consumers(descriptor: Any) -> dict[str, list[str]]:
    """PCollection -> the transforms reading it as their main input.

    A ParDo may read a PCollection as a side input too, even the one it reads as its main
    input (Beam's ``test_pardo_unfusable_side_inputs``): side inputs come from state, so
    they are not readers here (else the ParDo would run once per input).
    """
    side_inputs = set(bi.side_input_ids(descriptor.transforms))
    consumers: dict[str, list[str]] = {}
    for transform_id, transform in descriptor.transforms.items():
        for tag, pcollection in transform.inputs.items():
            if (transform_id, tag) not in side_inputs:
                consumers.setdefault(pcollection, []).append(transform_id)
    return consumers


def _windowed_coder_id(descriptor: Any, pcollection_id: str) -> str:
    """A windowed-value coder id for the PCollection, added to ``descriptor`` if needed."""
    pcollection = descriptor.pcollections[pcollection_id]
    strategy = descriptor.windowing_strategies[pcollection.windowing_strategy_id]
    coder_id = f"batched_windowed_{pcollection.coder_id}_{strategy.window_coder_id}"
    if coder_id not in descriptor.coders:
        coder = descriptor.coders[coder_id]
        coder.spec.urn = bi.WINDOWED_VALUE_CODER_URN
        coder.component_coder_ids.extend([pcollection.coder_id, strategy.window_coder_id])
    return coder_id


def _opaque_coder_id(descriptor: Any, coder_id: str) -> str:
    """A coder reading exactly what ``coder_id`` writes, its length-prefixed parts as bytes.

    A data channel's coder length-prefixes every coder the runner may not know (Beam's
    ``TransformContext.maybe_length_prefixed_coder``), so reading those parts as bytes, as
    Beam's runner-side safe coders do, finds where each element ends without running user
    coders (unpickling user objects). ``LengthPrefixCoder(BytesCoder)`` reads a
    length-prefixed part in every context. Added to ``descriptor`` if needed.
    """
    coders = descriptor.coders
    coder = bi.beam_runner_api_pb2.Coder()
    coder.CopyFrom(coders[coder_id])  # a copy: the map may change below
    if coder.spec.urn == bi.LENGTH_PREFIX_CODER_URN:
        components = [_bytes_coder_id(descriptor)]
    else:
        components = [_opaque_coder_id(descriptor, c) for c in coder.component_coder_ids]
    if components == list(coder.component_coder_ids):
        return coder_id
    opaque_id = f"batched_opaque_{coder_id}"
    if opaque_id not in coders:
        coders[opaque_id].spec.CopyFrom(coder.spec)
        coders[opaque_id].component_coder_ids.extend(components)
    return opaque_id


def _bytes_coder_id(descriptor: Any) -> str:
    coder_id = "batched_bytes"
    if coder_id not in descriptor.coders:
        descriptor.coders[coder_id].spec.urn = bi.BYTES_CODER_URN
    return coder_id


def _input_windowed(
    new_dofn: Callable[[], Any], windowing: Any
) -> Callable[[], tuple[Any, Any, tuple[Any, ...], dict[str, Any]]]:
    """A step's ``make_dofn`` for a DoFn the runner makes: a fresh one, in ``windowing``."""

    def make() -> tuple[Any, Any, tuple[Any, ...], dict[str, Any]]:
        return new_dofn(), windowing, (), {}

    return make


def _step_spec(descriptor: Any, context: Any, transform_id: str) -> StepSpec | str:
    """The step for a transform, or why it does not qualify."""
    transform = descriptor.transforms[transform_id]
    urn = transform.spec.urn
    payload = None
    if urn == PAR_DO_URN:
        payload = bi.proto_utils.parse_Bytes(
            transform.spec.payload, bi.beam_runner_api_pb2.ParDoPayload
        )
    side_tags = set(payload.side_inputs) if payload is not None else set()
    main_inputs = [pc for tag, pc in transform.inputs.items() if tag not in side_tags]
    if len(main_inputs) != 1 or len(transform.outputs) != 1:
        return "not one input and one output"
    (input_pcollection,) = main_inputs
    (output_pcollection,) = transform.outputs.values()
    input_windowing = bi.windowing_from_proto(
        descriptor.windowing_strategies[
            descriptor.pcollections[input_pcollection].windowing_strategy_id
        ],
        context,
    )
    side_inputs = None
    kind = "runner"
    if urn == WINDOW_INTO_URN:
        windowing = bi.windowing_from_proto(
            bi.beam_runner_api_pb2.WindowingStrategy.FromString(transform.spec.payload), context
        )
        if not bi.is_standard_window_fn(windowing.windowfn):
            return f"a custom window function {type(windowing.windowfn).__name__}"

        make = _input_windowed(
            functools.partial(batched_dofns.window_into_dofn, windowing), input_windowing
        )
        kind = "window_into"
    elif urn == FLATTEN_URN:
        # One input inside the stage (Beam's fusion gives each input its own transcode).
        make = _input_windowed(batched_dofns.flatten_dofn, input_windowing)
        kind = "pass"
    elif urn == bi.PRECOMBINE_URN or urn in bi.COMBINE_PHASE_URNS:
        # A lifted combine's partial aggregation (Beam's PGBKCVOperation), chunk by chunk,
        # or its merge or extract phase (Beam's CombineOperation), per element.
        combine_payload = transform.spec.payload
        make = _input_windowed(
            functools.partial(
                batched_precombine.precombine_dofn, combine_payload, context, input_windowing
            )
            if urn == bi.PRECOMBINE_URN
            else functools.partial(batched_dofns.combine_phase_dofn, urn, combine_payload, context),
            input_windowing,
        )
        kind = "precombine" if urn == bi.PRECOMBINE_URN else "combine_phase"
    elif payload is not None and payload.do_fn.urn == bi.KEY_WITH_NONE_DOFN_URN:
        make = _input_windowed(batched_dofns.key_with_none_dofn, input_windowing)
        kind = "direct"
    elif payload is not None:
        if any(
            side.access_pattern.urn != bi.common_urns.side_inputs.ITERABLE.urn
            for side in payload.side_inputs.values()
        ):
            return "a side input read as a multimap"
        if (
            payload.state_specs
            or payload.timer_family_specs
            or payload.restriction_coder_id
            or payload.requests_finalization
            or payload.requires_time_sorted_input
            or payload.on_window_expiration_timer_family_spec
        ):
            return "state, timers, a restriction or finalization"
        info = bi.pickled_dofn_info(payload)
        if info is None:
            return f"a DoFn of {payload.do_fn.urn}"
        dofn, args, kwargs, _, windowing = info
        reason = batched_policy.unbatchable_dofn_reason(
            dofn, args, kwargs, len(payload.side_inputs)
        )
        if reason is not None:
            return reason
        if payload.side_inputs:
            side_inputs = batched_side_inputs.side_input_maps(
                payload, transform_id, descriptor, context
            )
        kind = _pardo_kind(dofn, bool(args or kwargs), payload, context)
        step_windowing = windowing or input_windowing
        pardo_payload = payload
        # The copy just checked serves the step's first set-up: each copy is unpickled
        # from the payload: no second unpickling per step and task.
        unused = [info]

        def make_pardo() -> tuple[Any, Any, tuple[Any, ...], dict[str, Any]]:
            fresh = unused.pop() if unused else bi.pickled_dofn_info(pardo_payload)
            if fresh is None:  # pragma: no cover - checked when planned
                raise ValueError(f"{transform.unique_name}: the DoFn is no longer readable")
            return fresh[0], step_windowing, tuple(fresh[1] or ()), dict(fresh[2] or {})

        make = make_pardo
    else:
        return f"a transform of {urn}"
    return StepSpec(
        transform_id=transform_id,
        step_name=transform.unique_name,
        input_pcollection=input_pcollection,
        output_pcollection=output_pcollection,
        make_dofn=make,
        kind=kind,
        side_inputs=side_inputs,
    )


def _pardo_kind(dofn: Any, has_arguments: bool, payload: Any, context: Any) -> str:
    """How a batchable ParDo's step runs (see ``StepSpec.kind``)."""
    if batched_policy.is_simple_callable(dofn):
        sides = payload.side_inputs.values()
        if not sides:
            return "direct"
        if all(bi.is_globally_windowed_side_input(side, context) for side in sides):
            return "global_sides"
        return "window_sides"
    if payload.side_inputs or has_arguments:
        return "runner"
    return "params" if batched_policy.timestamp_window_params(dofn) is not None else "runner"


# A stage that hands elements to the bundle processor runs batched only with at least this
# many batched steps before the hand-off: handing off costs about what three steps save
# (docs/performance.md).
MIN_STEPS_BEFORE_HANDOFF = 4


def plan_batched_steps(
    descriptor: Any, input_transform_id: str, token: str = "batched"
) -> BatchedPlan | None:
    """The batched part of a stage, or None when no step of it qualifies.

    Walks from the stage's input: a PCollection whose readers all qualify (or are the
    stage's outputs) is processed batched; one read by a step that does not qualify is the
    hand-off, and everything from there runs in the bundle processor. A stage that would
    need two hand-offs, or a hand-off after fewer than ``MIN_STEPS_BEFORE_HANDOFF`` steps,
    runs as before, unbatched. A stage whose input only its outputs read has no steps and
    runs batched (see the module doc). ``token`` names the stage worker's
    hand-off (see ``beam_internals.HandoffCoder``).
    """
    context = bi.PipelineContext(descriptor)
    consumers = _consumers(descriptor)
    input_transform = descriptor.transforms[input_transform_id]
    if input_transform.spec.urn != DATA_INPUT_URN or len(input_transform.outputs) != 1:
        return None
    (input_pcollection,) = input_transform.outputs.values()
    input_coder_id = bi.remote_grpc_port(input_transform.spec.payload).coder_id
    steps: list[StepSpec] = []
    direct_outputs: dict[str, tuple[str, str]] = {}
    handoffs: list[str] = []
    pending = [input_pcollection]
    while pending:
        pcollection = pending.pop(0)
        readers = consumers.get(pcollection, [])
        specs: list[StepSpec] = []
        outputs: dict[str, tuple[str, str]] = {}
        reasons: list[str] = []
        for reader in readers:
            transform = descriptor.transforms[reader]
            if transform.spec.urn == DATA_OUTPUT_URN:
                coder_id = bi.remote_grpc_port(transform.spec.payload).coder_id
                outputs[reader] = (pcollection, coder_id)
                continue
            spec = _step_spec(descriptor, context, reader)
            if isinstance(spec, str):
                reasons.append(f"{transform.unique_name}: {spec}")
            else:
                specs.append(spec)
        if reasons:
            _LOGGER.debug("Not batched: %s", "; ".join(reasons))
            handoffs.append(pcollection)
            continue
        steps.extend(specs)
        direct_outputs.update(outputs)
        pending.extend(spec.output_pcollection for spec in specs)
    if len(handoffs) > 1 or (not steps and (handoffs or not direct_outputs)):
        # Nothing batched. (No steps and no hand-off: the stage only passes elements on.)
        return None
    if handoffs and len(steps) < MIN_STEPS_BEFORE_HANDOFF:
        # Handing each element to the bundle processor costs more than a few steps save.
        return None
    remainder = None
    handoff = None
    sized = bi.beam_fn_api_pb2.ProcessBundleDescriptor()
    sized.CopyFrom(descriptor)
    coder_ids = {
        pcollection: _windowed_coder_id(sized, pcollection)
        for pcollection in {input_pcollection, *handoffs, *(s.output_pcollection for s in steps)}
    }
    if handoffs:
        remainder = bi.beam_fn_api_pb2.ProcessBundleDescriptor()
        remainder.CopyFrom(descriptor)
        (handoff_pcollection,) = handoffs
        handoff_coder_id = f"batched_handoff_{handoff_pcollection}"
        remainder.coders[handoff_coder_id].CopyFrom(
            bi.handoff_coder_proto(token, sized, coder_ids[handoff_pcollection])
        )
        handoff = (handoff_pcollection, handoff_coder_id)
        for spec in steps:
            del remainder.transforms[spec.transform_id]
        for transform_id in direct_outputs:
            del remainder.transforms[transform_id]
        data_input = remainder.transforms[input_transform_id]
        (tag,) = data_input.outputs
        data_input.outputs[tag] = handoff_pcollection
        port = bi.remote_grpc_port(data_input.spec.payload)
        port.coder_id = handoff[1]
        data_input.spec.payload = port.SerializeToString()
    pass_through_coder_id = None
    if not steps and all(coder_id == input_coder_id for _, coder_id in direct_outputs.values()):
        # The bundle processor would decode each element and encode it with the same coder
        # (the same bytes, for a deterministic coder; the same element in any case).
        pass_through_coder_id = _opaque_coder_id(sized, input_coder_id)
    return BatchedPlan(
        input_transform_id=input_transform_id,
        input_coder_id=input_coder_id,
        input_pcollection=input_pcollection,
        steps=tuple(steps),
        direct_outputs=direct_outputs,
        handoff=handoff,
        token=token,
        remainder=remainder,
        coder_ids=coder_ids,
        coders=sized,
        pass_through_coder_id=pass_through_coder_id,
    )
