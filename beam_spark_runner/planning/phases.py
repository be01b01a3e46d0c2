"""The runner's graph phases: Beam's fusion phases with ours among them, as one list.

Beam's ``FnApiRunner`` phases fuse the pipeline into *stages*: chains of SDK transforms
that run inside one bundle processor, reading one data input and writing to data outputs.
Ours turn the transforms the runner executes itself (a Reshuffle, a native text read or
Create, a streaming source, a native combine) into writes to and reads from runner buffers
(``urns.BufferKind``). :func:`phases` is the whole list, in order, as Beam's
``fn_runner.create_stages`` gives it.
"""

from __future__ import annotations

import collections
import copy
import logging
from collections.abc import Callable, Iterable, Iterator

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning.aggregation import native_aggregation
from beam_spark_runner.planning.text_reads import native_text_reads, side_input_pcollections
from beam_spark_runner.planning.urns import (
    COMBINE_PER_KEY_URN,
    NATIVE_COMBINE_URN,
    RESHUFFLE_URN,
    RUNNER_PRIMITIVE_URNS,
    RUNNER_SOURCE_BUFFER_KINDS,
    STREAMING_SOURCE_URNS,
    BufferKind,
)

_LOGGER = logging.getLogger(__name__)

Phase = Callable[[Iterable[bi.Stage], bi.TransformContext], Iterable[bi.Stage]]


def _buffer_read_stage(
    transform: bi.beam_runner_api_pb2.PTransform,
    buffer_id: bytes,
    downstream_side_inputs: frozenset | None,
    must_follow: frozenset,
    name: str | None = None,
) -> bi.Stage:
    """A stage whose one transform reads ``transform``'s outputs from a runner buffer.

    The read is named ``name``, by default the transform's name plus ``/Read``.
    """
    name = name or transform.unique_name + "/Read"
    return bi.Stage(
        name,
        [
            bi.beam_runner_api_pb2.PTransform(
                unique_name=name,
                outputs=transform.outputs,
                spec=bi.beam_runner_api_pb2.FunctionSpec(urn=bi.DATA_INPUT_URN, payload=buffer_id),
            )
        ],
        downstream_side_inputs=downstream_side_inputs,
        must_follow=must_follow,
    )


def _buffer_write_stage(
    transform: bi.beam_runner_api_pb2.PTransform,
    pcollection: str,
    buffer_id: bytes,
    must_follow: frozenset,
) -> bi.Stage:
    """A stage whose one transform writes ``pcollection`` to a runner buffer."""
    name = transform.unique_name + "/Write"
    return bi.Stage(
        name,
        [
            bi.beam_runner_api_pb2.PTransform(
                unique_name=name,
                inputs={"in": pcollection},
                spec=bi.beam_runner_api_pb2.FunctionSpec(urn=bi.DATA_OUTPUT_URN, payload=buffer_id),
            )
        ],
        downstream_side_inputs=frozenset(),
        must_follow=must_follow,
    )


def _through_buffer(
    stage: bi.Stage,
    transform: bi.beam_runner_api_pb2.PTransform,
    pcollection: str,
    buffer_id: bytes,
) -> Iterator[bi.Stage]:
    """``stage`` as a write of ``pcollection`` to a runner buffer and a read from it.

    The read gives ``transform``'s outputs.
    """
    write = _buffer_write_stage(transform, pcollection, buffer_id, stage.must_follow)
    yield write
    yield _buffer_read_stage(
        transform,
        buffer_id,
        stage.downstream_side_inputs,
        frozenset([write]) | stage.must_follow,
    )


def _reshuffled_input(
    transform: bi.beam_runner_api_pb2.PTransform, components: bi.beam_runner_api_pb2.Components
) -> str:
    """The PCollection a Reshuffle moves: its only input that is not a side input.

    The Reshuffle ``expand_sdf`` inserts before a splittable DoFn's process step copies
    all of the DoFn's inputs, its side inputs included (a DataFrame API reader's DoFn has
    one); only the split restrictions are reshuffled.
    """
    inputs = list(transform.inputs.values())
    if len(inputs) > 1:
        side_inputs = side_input_pcollections(components)
        inputs = [pcoll for pcoll in inputs if pcoll not in side_inputs]
    if len(inputs) != 1:
        raise ValueError(
            f"Expected the Reshuffle {transform.unique_name!r} to have one main input, found "
            f"{len(inputs)} among its inputs {dict(transform.inputs)}. This is a bug in the "
            "runner's planning; please report it with the pipeline."
        )
    return inputs[0]


def expand_reshuffle(
    stages: Iterable[bi.Stage], context: bi.TransformContext
) -> Iterator[bi.Stage]:
    """Turns each Reshuffle into a write to and a read from a ``reshuffle:`` buffer.

    With Reshuffle among the known runner URNs, Beam keeps it as a leaf stage (both the
    user's ``beam.Reshuffle()`` and the one ``expand_sdf`` inserts between splitting and
    processing restrictions). The runner executes it as a Spark repartition, moving encoded
    bytes: where the input and output PCollections' coders differ (the output of a
    Reshuffle feeding a GroupByKey has a deterministic key coder), an identity transform
    re-encodes the elements with the output's coder before the write, as Beam's
    ``fix_flatten_coders`` does for Flatten.
    """
    for stage in stages:
        if len(stage.transforms) != 1 or stage.transforms[0].spec.urn != RESHUFFLE_URN:
            yield stage
            continue
        transform = stage.transforms[0]
        input_pcoll = _reshuffled_input(transform, context.components)
        output_pcoll = bi.only_element(list(transform.outputs.values()))
        pcollections = context.components.pcollections
        context.length_prefix_pcoll_coders(input_pcoll)
        context.length_prefix_pcoll_coders(output_pcoll)
        written_pcoll = input_pcoll
        if pcollections[input_pcoll].coder_id != pcollections[output_pcoll].coder_id:
            written_pcoll = bi.unique_name(pcollections, transform.unique_name + "/Transcoded")
            pcollections[written_pcoll].CopyFrom(pcollections[input_pcoll])
            pcollections[written_pcoll].unique_name = written_pcoll
            pcollections[written_pcoll].coder_id = pcollections[output_pcoll].coder_id
            transcode_name = bi.unique_name(
                context.components.transforms, transform.unique_name + "/Transcode"
            )
            yield bi.Stage(
                transcode_name,
                [
                    bi.beam_runner_api_pb2.PTransform(
                        unique_name=transcode_name,
                        inputs={"in": input_pcoll},
                        outputs={"out": written_pcoll},
                        spec=bi.beam_runner_api_pb2.FunctionSpec(urn=bi.IDENTITY_DOFN_URN),
                        environment_id=transform.environment_id,
                    )
                ],
                downstream_side_inputs=frozenset(),
                must_follow=stage.must_follow,
            )
        transform_id = stage.name
        if transform != context.components.transforms.get(transform_id):
            transform_id = bi.unique_name(context.components.transforms, stage.name)
            context.components.transforms[transform_id].CopyFrom(transform)
        buffer_id = bi.create_buffer_id(transform_id, kind=BufferKind.RESHUFFLE)
        yield from _through_buffer(stage, transform, written_pcoll, buffer_id)


def expand_runner_sources(
    stages: Iterable[bi.Stage], context: bi.TransformContext
) -> Iterator[bi.Stage]:
    """Turns each native text read and native Create into a read from its buffer.

    The stage that fuses with the read gets the buffer (``textread:`` or ``create:``) as
    its data input: for a text read its worker turns the buffer's byte ranges into the
    lines PCollection's elements; a Create's buffer holds its elements themselves. The read
    keeps the source's name, as Beam's ``impulse_to_input`` does for an Impulse, so its
    per-step metrics (execution times, element counts) are reported under that name.
    """
    for stage in stages:
        kind = (
            RUNNER_SOURCE_BUFFER_KINDS.get(stage.transforms[0].spec.urn)
            if len(stage.transforms) == 1
            else None
        )
        if kind is None:
            yield stage
            continue
        transform = stage.transforms[0]
        if kind in (BufferKind.TEST_STREAM, BufferKind.SPARK_STREAM):
            # One read per output: a stage has one data input, and the source fills each.
            for tag, pcoll in sorted(transform.outputs.items()):
                context.length_prefix_pcoll_coders(pcoll)
                output = copy.deepcopy(transform)
                output.outputs.clear()
                output.outputs[tag] = pcoll
                yield _buffer_read_stage(
                    output,
                    bi.create_buffer_id(pcoll, kind=kind),
                    stage.downstream_side_inputs,
                    stage.must_follow,
                    name=transform.unique_name
                    if len(transform.outputs) == 1
                    else f"{transform.unique_name}/{tag}",
                )
            continue
        context.length_prefix_pcoll_coders(bi.only_element(list(transform.outputs.values())))
        yield _buffer_read_stage(
            transform,
            bi.create_buffer_id(stage.name, kind=kind),
            stage.downstream_side_inputs,
            stage.must_follow,
            name=transform.unique_name,
        )


def unlift_early_timestamp_combines(
    stages: Iterable[bi.Stage], context: bi.TransformContext
) -> Iterator[bi.Stage]:
    """Keeps a CombinePerKey whose timestamp combiner is not end-of-window unlifted.

    A streaming run only. Beam's precombine gives a bundle's accumulator the combined
    timestamp of all its elements, late ones included, so the GroupByKey after it cannot
    leave late elements out of its watermark hold as Beam's trigger driver does for
    unlifted input: with OUTPUT_AT_EARLIEST a pane came out at the window's end, not at its
    earliest on-time element (Beam's ``known_late_data_watermark`` transcript). Such a
    combine is expanded into its GroupByKey and combining ParDo instead, as Beam's
    ``lift_combiners`` does where the trigger forbids lifting.
    """
    components = context.components
    end_of_window = bi.beam_runner_api_pb2.OutputTime.END_OF_WINDOW
    for stage in stages:
        transform = stage.transforms[0] if len(stage.transforms) == 1 else None
        if transform is None or transform.spec.urn != COMBINE_PER_KEY_URN:
            yield stage
            continue
        pcoll = components.pcollections[bi.only_element(list(transform.inputs.values()))]
        strategy = components.windowing_strategies[pcoll.windowing_strategy_id]
        if strategy.output_time == end_of_window:
            yield stage
            continue
        for sub in transform.subtransforms:
            subtransform = components.transforms[sub]
            yield bi.Stage(
                subtransform.unique_name,
                [subtransform],
                downstream_side_inputs=stage.downstream_side_inputs,
                must_follow=stage.must_follow,
                parent=stage.name,
                environment=stage.environment,
            )


def native_combines(stages: Iterable[bi.Stage], context: bi.TransformContext) -> Iterator[bi.Stage]:
    """Turns each CombinePerKey Spark can aggregate into a write to and a read from a buffer.

    A CombinePerKey with a ``native_aggregation`` becomes a ``nativecombine:`` buffer,
    as a GroupByKey becomes a ``group:`` buffer: its writers send each element's key (the
    grouping key a GroupByKey's writers compute) and its value as a typed Arrow column,
    Spark aggregates them per key in the JVM (``translators.native_combine``), and the
    stage reading the buffer gets each key's ``KV`` in the global window, at its end, in
    its only pane, as Beam's lifted combine gives it. Runs before Beam's
    ``pack_combiners`` and ``lift_combiners``, which keep every other CombinePerKey.
    """
    components = context.components
    for stage in stages:
        transform = stage.transforms[0] if len(stage.transforms) == 1 else None
        aggregation = native_aggregation(transform, components) if transform else None
        if transform is None or aggregation is None:
            yield stage
            continue
        # The input's coder is not length-prefixed, as a GroupByKey's is: the writers' worker
        # reads its values (another reader of the same PCollection may still prefix it).
        input_pcoll = bi.only_element(list(transform.inputs.values()))
        # The buffer names a transform of the runner's URN, beside the user's combine.
        transform_id = bi.unique_name(components.transforms, f"{stage.name}/Native")
        native = components.transforms[transform_id]
        native.CopyFrom(transform)
        del native.subtransforms[:]
        native.spec.CopyFrom(
            bi.beam_runner_api_pb2.FunctionSpec(
                urn=NATIVE_COMBINE_URN, payload=aggregation.payload()
            )
        )
        buffer_id = bi.create_buffer_id(transform_id, kind=BufferKind.NATIVE_COMBINE)
        _LOGGER.info(
            "Running %s (%s) as a Spark aggregation",
            transform.unique_name,
            aggregation.function
            + ("" if aggregation.value_type == "none" else f" of {aggregation.value_type}s"),
        )
        yield from _through_buffer(stage, transform, input_pcoll, buffer_id)


_SDF_PROCESS_URN: str = bi.common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn
_UNBOUNDED = bi.beam_runner_api_pb2.IsBounded.UNBOUNDED


def side_input_readers_apart_from_splittable(
    stages: Iterable[bi.Stage], context: bi.TransformContext
) -> list[bi.Stage]:
    """Starts a new stage at each ParDo reading side inputs that would fuse into an SDF's.

    A streaming run only. The stage processing an unbounded splittable DoFn's restrictions
    keeps its residuals in state; a stage reading streamed side inputs keeps its main
    elements waiting for them. Fused, one stage would need both; apart, the reader is a
    stage with side inputs downstream of the splittable DoFn's (``streaming.side_inputs``).
    Only readers fusion would put into such a stage start their own, so no other stage
    changes (its identity keys a checkpoint's state).
    """
    stages = list(stages)
    pcollections = context.components.pcollections
    readers: dict[str, list[bi.Stage]] = collections.defaultdict(list)
    for stage in stages:
        sides = set(stage.side_inputs())
        for transform in stage.transforms:
            for pcollection in transform.inputs.values():
                if pcollection not in sides:
                    readers[pcollection].append(stage)
    pending = [
        stage
        for stage in stages
        if any(
            t.spec.urn == _SDF_PROCESS_URN
            and any(pcollections[p].is_bounded == _UNBOUNDED for p in t.outputs.values())
            for t in stage.transforms
        )
    ]
    reached: set[str] = set()
    while pending:
        stage = pending.pop()
        if stage.name in reached:
            continue
        reached.add(stage.name)
        for transform in stage.transforms:
            for pcollection in transform.outputs.values():
                for reader in readers[pcollection]:
                    if reader.forced_root or not reader.is_all_sdk_urns(context):
                        continue
                    if any(True for _ in reader.side_inputs()):
                        reader.forced_root = True
                    else:
                        pending.append(reader)
    return stages


def phases(streaming: bool = False, native_combine: bool = False) -> list[Phase]:
    """The graph phases of a run, in order: Beam's batch phases with ours among them.

    ``native_combine``: before Beam's ``pack_combiners`` and ``lift_combiners``, which keep
    every other CombinePerKey. ``streaming``: combines with an early timestamp stay
    unlifted, and a ParDo reading side inputs does not fuse into an unbounded splittable
    DoFn's stage. Our Reshuffle and runner-source expansions run next to Beam's GroupByKey
    expansion, before fusion.
    """
    t = bi.translations
    return [
        t.annotate_downstream_side_inputs,
        # A stateful ParDo starts its own stage, so the runner can shuffle its input by key.
        t.annotate_stateful_dofns_as_roots,
        t.fix_side_input_pcoll_coders,
        *([native_combines] if native_combine else []),
        t.pack_combiners,
        *([unlift_early_timestamp_combines] if streaming else []),
        t.lift_combiners,
        t.expand_sdf,
        t.expand_gbk,
        expand_reshuffle,
        expand_runner_sources,
        t.sink_flattens,
        *([side_input_readers_apart_from_splittable] if streaming else []),
        t.greedily_fuse,
        t.read_to_impulse,
        t.impulse_to_input,
        t.sort_stages,
        t.add_impulse_to_dangling_transforms,
        t.setup_timer_mapping,
        t.populate_data_channel_coders,
    ]


def expand_reshuffles_as_beam(pipeline_proto: bi.beam_runner_api_pb2.Pipeline) -> None:
    """Makes each user Reshuffle run as Beam expanded it, not as the runner's repartition.

    Its URN becomes a generic composite's, so fusion takes its subtransforms (random keys,
    a GroupByKey) with their coders: the expansion of an update-compatible pipeline
    (``bi.reshuffles_expand_as_older_beam``) pickles the elements or resets their panes,
    as Beam's does.
    """
    for transform in pipeline_proto.components.transforms.values():
        if transform.spec.urn == RESHUFFLE_URN and transform.subtransforms:
            transform.spec.urn = bi.python_urns.GENERIC_COMPOSITE_TRANSFORM
            transform.spec.payload = b""


def create_stages(
    pipeline_proto: bi.beam_runner_api_pb2.Pipeline,
    is_drain: bool = False,
    use_state_iterables: bool = False,
    streaming: bool = False,
    native_combine: bool = False,
    beam_reshuffles: bool = False,
) -> tuple[bi.TransformContext, list[bi.Stage]]:
    """Runs Beam's graph phases (and ours) over a copy of the pipeline proto.

    With ``is_drain``, Beam's ``expand_sdf`` adds the truncate step to splittable DoFns.
    With ``use_state_iterables``, stages read iterables (GroupByKey values) through
    state-backed iterable coders, as in ``FnApiRunner(use_state_iterables=True)``.
    With ``streaming``, TestStreams stay runner sources (the streaming query's source
    steps through their events) and text reads keep Beam's expansion.
    With ``native_combine`` (batch only), CombinePerKeys Spark can aggregate become
    ``nativecombine:`` buffers (:func:`native_combines`).
    With ``beam_reshuffles``, Reshuffles run as Beam expanded them
    (:func:`expand_reshuffles_as_beam`).
    """
    pipeline_proto = copy.deepcopy(pipeline_proto)
    if beam_reshuffles:
        expand_reshuffles_as_beam(pipeline_proto)
    if not streaming:
        native_text_reads(pipeline_proto)
    return bi.create_and_optimize_stages(
        pipeline_proto,
        phases=phases(streaming, native_combine and not streaming),
        known_runner_urns=RUNNER_PRIMITIVE_URNS
        | (STREAMING_SOURCE_URNS if streaming else frozenset()),
        use_state_iterables=use_state_iterables,
        is_drain=is_drain,
    )
