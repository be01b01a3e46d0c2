"""Pipeline proto -> Beam's fusion phases -> a plan of Spark stages and buffers.

Beam's ``FnApiRunner`` graph phases fuse the pipeline into *stages*: chains of SDK
transforms that run inside one bundle processor, reading one data input and writing to
data outputs. Stages talk to each other through *buffers* named by id:

* ``impulse``                 -- the single impulse element that starts a root stage;
* ``group:<transform id>``    -- a GroupByKey: writers' elements are shuffled by key;
* ``reshuffle:<transform id>`` -- a Reshuffle (our phase): elements are repartitioned;
* ``materialize:<name>``      -- a plain PCollection or a Flatten: the union of writers;
* ``textread:<transform id>`` -- the lines of a plain ``ReadFromText``, read by the stage
  that consumes them (our phase; see :func:`native_text_reads`);
* ``create:<transform id>``   -- the encoded values of a ``beam.Create`` the runner
  replaced (``native_create``), read by the stage that decodes them;
* ``nativecombine:<transform id>`` -- a CombinePerKey of Beam's sum, min, max, count or
  mean over numbers, under default windowing, run as a Spark aggregation (our phase; see
  :func:`native_combines`): writers send each element's key and its value as a typed column;
* ``teststream:<pcollection>`` -- one output of a TestStream, in a streaming run: the
  query's source steps through its events (``streaming.test_stream``).

A GroupByKey under default windowing (the global window, the default trigger, output at
the end of the window) ignores its input's timestamps and panes, and every element is in
the global window. Its writers then send values only: their data output coder becomes a
``param_windowed_value`` coder (:func:`value_only_group_coders`), which Beam's
``GroupingBuffer`` suggests in a TODO ("a window-dropping coder for the data plane"). A
``(int, int)`` pair then takes ~4 bytes on the shuffle instead of 17.

The runner keeps that model. A :class:`Plan` lists the fused stages in execution order,
each with its input buffer, its output buffers and its side inputs, and the buffers with
their writers and readers. Translators (``beam_spark_runner.translators``) turn buffers
and stages into DataFrames.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError

_LOGGER = logging.getLogger(__name__)

RESHUFFLE_URN: str = bi.common_urns.composites.RESHUFFLE.urn
GROUP_BY_KEY_URN: str = bi.common_urns.primitives.GROUP_BY_KEY.urn
FLATTEN_URN: str = bi.common_urns.primitives.FLATTEN.urn
IMPULSE_URN: str = bi.common_urns.primitives.IMPULSE.urn
EXECUTABLE_STAGE_URN: str = bi.common_urns.executable_stage

# Transforms the runner executes itself; everything else runs in the bundle processor.
RUNNER_PRIMITIVE_URNS: frozenset[str] = frozenset([FLATTEN_URN, GROUP_BY_KEY_URN, RESHUFFLE_URN])

RESHUFFLE_BUFFER_KIND = "reshuffle"

# A plain ReadFromText the runner reads itself (see native_text_reads); its payload is the
# JSON list of the matched files' [path, size].
TEXT_READ_URN = "beam:runner:spark:text_read:v1"
TEXT_READ_BUFFER_KIND = "textread"

# A beam.Create's values, held by the runner (see native_create); its payload is the
# encoded values, encoded as a Beam iterable of bytes (encode_create_payload).
CREATE_URN = "beam:runner:spark:create:v1"
CREATE_BUFFER_KIND = "create"

# A TestStream in a streaming run: each of its outputs is a buffer the query's source fills.
TEST_STREAM_URN: str = bi.common_urns.primitives.TEST_STREAM.urn
TEST_STREAM_BUFFER_KIND = "teststream"

# A Spark streaming source read in a streaming run (``beam_spark_runner.io``); its payload
# is a JSON ``SparkStreamSpec``. The query reads it beside its own source.
SPARK_STREAM_URN = "beam:runner:spark:read_spark_stream:v1"
SPARK_STREAM_BUFFER_KIND = "sparkstream"

# A CombinePerKey the runner runs as a Spark aggregation (see native_combines); its payload
# is a JSON NativeAggregation.
NATIVE_COMBINE_URN = "beam:runner:spark:native_combine:v1"
NATIVE_COMBINE_BUFFER_KIND = "nativecombine"
COMBINE_PER_KEY_URN: str = bi.common_urns.composites.COMBINE_PER_KEY.urn

# Runner transforms without inputs whose output a stage reads as its data input.
_RUNNER_SOURCE_BUFFER_KINDS: dict[str, str] = {
    TEXT_READ_URN: TEXT_READ_BUFFER_KIND,
    CREATE_URN: CREATE_BUFFER_KIND,
    TEST_STREAM_URN: TEST_STREAM_BUFFER_KIND,
    SPARK_STREAM_URN: SPARK_STREAM_BUFFER_KIND,
}


def _create_payload_coder() -> object:
    from apache_beam.coders import coders

    return coders.IterableCoder(coders.BytesCoder())


def encode_create_payload(encoded_values: list[bytes]) -> bytes:
    """The payload of a ``CREATE_URN`` transform holding these encoded values."""
    return _create_payload_coder().encode(encoded_values)  # type: ignore[attr-defined,no-any-return]


def decode_create_payload(payload: bytes) -> list[bytes]:
    """The encoded values of a ``CREATE_URN`` transform's payload."""
    return list(_create_payload_coder().decode(payload))  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True)
class NativeAggregation:
    """What a native combine computes: a function over the values of one Arrow type.

    ``function`` is ``sum``, ``min``, ``max``, ``count`` or ``mean``; ``value_type`` is
    ``int`` (Beam's ``VarIntCoder``), ``float`` (``FloatCoder``) or ``none`` (``count``
    reads no values, whatever their coder).
    """

    function: str
    value_type: str

    def payload(self) -> bytes:
        """The ``NATIVE_COMBINE_URN`` transform's payload."""
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_payload(cls, payload: bytes) -> NativeAggregation:
        """The aggregation a ``NATIVE_COMBINE_URN`` transform's payload names."""
        return cls(**json.loads(payload))


# Value coders whose values become a typed column, and the column's type.
_TYPED_VALUE_CODERS: dict[str, str] = {
    bi.common_urns.coders.VARINT.urn: "int",
    bi.common_urns.coders.DOUBLE.urn: "float",
}


def native_aggregation(
    transform: bi.beam_runner_api_pb2.PTransform, components: bi.beam_runner_api_pb2.Components
) -> NativeAggregation | None:
    """The aggregation a CombinePerKey can run as in Spark, or None to keep Beam's path.

    It can where its CombineFn is Beam's ``sum``, ``min``, ``max`` (of the builtins),
    ``CountCombineFn`` or ``MeanCombineFn`` (``bi.builtin_aggregation``), its input has
    Beam's default windowing (the global window, the default trigger: one output per key,
    at the end of the window), and its values are coded as integers (``VarIntCoder``) or
    floats (``FloatCoder``), which every value then is; ``count`` takes any values.
    """
    if transform.spec.urn != COMBINE_PER_KEY_URN or len(transform.inputs) != 1:
        return None
    payload = bi.beam_runner_api_pb2.CombinePayload.FromString(transform.spec.payload)
    function = bi.builtin_aggregation(payload.combine_fn)
    if function is None:
        return None
    pcollection = components.pcollections[bi.only_element(list(transform.inputs.values()))]
    strategies = bi.PipelineContext(components).windowing_strategies
    if not strategies[pcollection.windowing_strategy_id].is_default():
        return None
    kv_coder = components.coders[pcollection.coder_id]
    if kv_coder.spec.urn != bi.common_urns.coders.KV.urn:
        return None
    value_coder = components.coders[kv_coder.component_coder_ids[1]]
    if value_coder.spec.urn == bi.common_urns.coders.LENGTH_PREFIX.urn:
        value_coder = components.coders[value_coder.component_coder_ids[0]]
    value_type = _TYPED_VALUE_CODERS.get(value_coder.spec.urn)
    if function == "count":
        return NativeAggregation(function, "none")
    if value_type is None:
        return None
    return NativeAggregation(function, value_type)


@dataclasses.dataclass(frozen=True)
class StageOutput:
    """One data output of a fused stage."""

    transform_id: str
    buffer_id: bytes
    coder_id: str


@dataclasses.dataclass(frozen=True)
class SideInput:
    """A side input read by one ParDo of a fused stage."""

    transform_id: str
    tag: str
    pcollection_id: str
    buffer_id: bytes
    access_pattern_urn: str


@dataclasses.dataclass
class PlannedStage:
    """A fused stage: one data input, any number of outputs and side inputs."""

    name: str
    descriptor: bi.beam_fn_api_pb2.ProcessBundleDescriptor
    input_transform_id: str
    input_buffer_id: bytes
    input_coder_id: str
    outputs: list[StageOutput]
    side_inputs: list[SideInput]
    stateful: bool
    user_transform_names: list[str]

    @property
    def display_name(self) -> str:
        """A readable name: the Beam transforms the stage runs, in order."""
        names = self.user_transform_names
        if not names:
            return self.name
        if len(names) > 4:
            names = [*names[:2], f"... {len(names) - 3} more ...", names[-1]]
        return " -> ".join(names)


@dataclasses.dataclass
class PlannedBuffer:
    """A buffer between stages and the runner primitive that fills it."""

    buffer_id: bytes
    urn: str
    writers: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    main_readers: list[str] = dataclasses.field(default_factory=list)
    side_readers: list[str] = dataclasses.field(default_factory=list)

    @property
    def kind(self) -> str:
        """The buffer id's kind prefix (``group``, ``materialize``, ...)."""
        if self.buffer_id == bi.IMPULSE_BUFFER:
            return "impulse"
        return bi.split_buffer_id(self.buffer_id)[0]

    @property
    def name(self) -> str:
        """The transform or PCollection the buffer belongs to."""
        if self.buffer_id == bi.IMPULSE_BUFFER:
            return "Impulse"
        return bi.split_buffer_id(self.buffer_id)[1]


@dataclasses.dataclass
class Plan:
    """Everything the translators need, built on the driver before Spark starts."""

    stages: list[PlannedStage]
    buffers: dict[bytes, PlannedBuffer]
    components: bi.beam_runner_api_pb2.Components
    # PCollection id -> data-channel coder id (the SDK side, length-prefixed as needed).
    data_channel_coders: dict[str, str]
    # Coder id -> the runner-safe coder id (opaque bytes for unknown user coders).
    safe_coders: dict[str, str]
    # Group buffer id -> the value-only coder its writers use (value_only_group_coders).
    group_input_coders: dict[bytes, str] = dataclasses.field(default_factory=dict)
    # Stages run their stateless steps batched (--spark_batched_steps).
    batched_steps: bool = True
    # Planned for a streaming query (its stages run micro-batch after micro-batch).
    streaming: bool = False

    def is_keyed(self, buffer_id: bytes) -> bool:
        """Whether the buffer's writers must compute each element's key.

        They must for a GroupByKey, a native combine, and a stateful stage: Spark shuffles
        (and sorts) their input by key.
        """
        buffer = self.buffers[buffer_id]
        return buffer.kind in ("group", NATIVE_COMBINE_BUFFER_KIND) or any(
            self.stage(reader).stateful for reader in buffer.main_readers
        )

    def stage(self, name: str) -> PlannedStage:
        """The stage with this name."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


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
        side_inputs = _side_input_pcollections(components)
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
        buffer_id = bi.create_buffer_id(transform_id, kind=RESHUFFLE_BUFFER_KIND)
        yield from _through_buffer(stage, transform, written_pcoll, buffer_id)


def _side_input_pcollections(components: bi.beam_runner_api_pb2.Components) -> set[str]:
    return {
        transform.inputs[tag]
        for _, transform, payload in bi.par_do_payloads(components.transforms)
        for tag in payload.side_inputs
    }


def _text_files(pattern: str, compression: str) -> list[tuple[str, int]] | None:
    """The files a text read matches, as (path, size), if all are uncompressed."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    try:
        metadata = FileSystems.match([pattern])[0].metadata_list
    except Exception:  # noqa: BLE001 - Beam's own read reports it, at run time, as Beam does
        _LOGGER.debug("Could not match %s; Beam's read will", pattern, exc_info=True)
        return None
    if not metadata:
        return None  # Beam's read raises its own error for an empty match
    files = []
    for file in metadata:
        resolved = compression
        if compression == CompressionTypes.AUTO:
            resolved = CompressionTypes.detect_compression_type(file.path)
        if resolved != CompressionTypes.UNCOMPRESSED:
            return None
        files.append((file.path, file.size_in_bytes))
    return files


def native_text_reads(pipeline_proto: bi.beam_runner_api_pb2.Pipeline) -> list[str]:
    """Makes each plain ``ReadFromText`` a runner transform; returns their ids.

    Beam reads a text file through a splittable DoFn, which costs several µs per line
    (restriction claims, watermark estimation, an 8 KiB read buffer). A ``Read`` of Beam's
    ``_TextSource`` with default settings (``bi.plain_text_source``), uncompressed files
    and lines not read as a side input becomes ``TEXT_READ_URN`` with the matched files as
    payload: planning gives its output a ``textread:`` buffer, the translator splits the
    files into byte ranges, and the consuming stage's worker reads the lines
    (``execution.text_read``), with Beam's exact record boundaries. Other reads keep
    Beam's expansion. Changes ``pipeline_proto`` in place.
    """
    components = pipeline_proto.components
    side_inputs = _side_input_pcollections(components)
    rewritten = []
    for transform_id, transform in list(components.transforms.items()):
        source = bi.plain_text_source(transform)
        if source is None or len(transform.outputs) != 1:
            continue
        output = bi.only_element(list(transform.outputs.values()))
        pcollection = components.pcollections[output]
        windowing = components.windowing_strategies[pcollection.windowing_strategy_id]
        if (
            output in side_inputs
            or components.coders[pcollection.coder_id].spec.urn
            != bi.common_urns.coders.STRING_UTF8.urn
            or windowing.window_fn.urn != bi.common_urns.global_windows.urn
        ):
            continue
        files = _text_files(*source)
        if files is None:
            continue
        pending = list(transform.subtransforms)
        while pending:
            removed = components.transforms.pop(pending.pop())
            pending.extend(removed.subtransforms)
        del transform.subtransforms[:]
        transform.spec.CopyFrom(
            bi.beam_runner_api_pb2.FunctionSpec(
                urn=TEXT_READ_URN, payload=json.dumps(files).encode()
            )
        )
        rewritten.append(transform_id)
    if rewritten:
        _LOGGER.info("Reading %d text source(s) natively: %s", len(rewritten), rewritten)
    return rewritten


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
            _RUNNER_SOURCE_BUFFER_KINDS.get(stage.transforms[0].spec.urn)
            if len(stage.transforms) == 1
            else None
        )
        if kind is None:
            yield stage
            continue
        transform = stage.transforms[0]
        if kind in (TEST_STREAM_BUFFER_KIND, SPARK_STREAM_BUFFER_KIND):
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
        if transform is None or transform.spec.urn != bi.common_urns.composites.COMBINE_PER_KEY.urn:
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
        buffer_id = bi.create_buffer_id(transform_id, kind=NATIVE_COMBINE_BUFFER_KIND)
        _LOGGER.info(
            "Running %s (%s) as a Spark aggregation",
            transform.unique_name,
            aggregation.function
            + ("" if aggregation.value_type == "none" else f" of {aggregation.value_type}s"),
        )
        yield from _through_buffer(stage, transform, input_pcoll, buffer_id)


def _phases(streaming: bool = False, native_combine: bool = False) -> list:
    phases = bi.fn_api_runner_phases()
    if native_combine:
        phases.insert(phases.index(bi.translations.pack_combiners), native_combines)
    # Our Reshuffle expansion runs next to Beam's GroupByKey expansion, before fusion.
    phases.insert(phases.index(bi.translations.expand_gbk) + 1, expand_reshuffle)
    phases.insert(phases.index(expand_reshuffle) + 1, expand_runner_sources)
    if streaming:
        lift = phases.index(bi.translations.lift_combiners)
        phases.insert(lift, unlift_early_timestamp_combines)
    return phases


def create_stages(
    pipeline_proto: bi.beam_runner_api_pb2.Pipeline,
    is_drain: bool = False,
    use_state_iterables: bool = False,
    streaming: bool = False,
    native_combine: bool = False,
) -> tuple[bi.TransformContext, list[bi.Stage]]:
    """Runs Beam's graph phases (and ours) over a copy of the pipeline proto.

    With ``is_drain``, Beam's ``expand_sdf`` adds the truncate step to splittable DoFns.
    With ``use_state_iterables``, stages read iterables (GroupByKey values) through
    state-backed iterable coders, as in ``FnApiRunner(use_state_iterables=True)``.
    With ``streaming``, TestStreams stay runner sources (the streaming query's source
    steps through their events) and text reads keep Beam's expansion.
    With ``native_combine`` (batch only), CombinePerKeys Spark can aggregate become
    ``nativecombine:`` buffers (:func:`native_combines`).
    """
    pipeline_proto = copy.deepcopy(pipeline_proto)
    if not streaming:
        native_text_reads(pipeline_proto)
    return bi.create_and_optimize_stages(
        pipeline_proto,
        phases=_phases(streaming, native_combine and not streaming),
        known_runner_urns=RUNNER_PRIMITIVE_URNS
        | ({TEST_STREAM_URN, SPARK_STREAM_URN} if streaming else set()),
        use_state_iterables=use_state_iterables,
        is_drain=is_drain,
    )


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
                "group",
                NATIVE_COMBINE_BUFFER_KIND,
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
    if buffer_id == bi.IMPULSE_BUFFER:
        return IMPULSE_URN
    kind, name = bi.split_buffer_id(buffer_id)
    if kind == "group":
        return components.transforms[name].spec.urn
    if kind == NATIVE_COMBINE_BUFFER_KIND:
        return NATIVE_COMBINE_URN
    if kind == RESHUFFLE_BUFFER_KIND:
        return RESHUFFLE_URN
    if kind == "materialize":
        return FLATTEN_URN
    for urn, source_kind in _RUNNER_SOURCE_BUFFER_KINDS.items():
        if kind == source_kind:
            return urn
    raise UnsupportedFeatureError(
        "Expected a buffer of kind impulse, group, reshuffle, materialize, textread or "
        "create; found "
        f"{buffer_id!r}. This is a bug in SparkStructuredRunner's planning; please report it."
    )


def build_plan(
    pipeline_proto: bi.beam_runner_api_pb2.Pipeline,
    is_drain: bool = False,
    use_state_iterables: bool = False,
    streaming: bool = False,
    batched_steps: bool = True,
    native_combines: bool = False,
) -> Plan:
    """Fuses the pipeline and wires stages to buffers (the flags: see create_stages).

    ``batched_steps``: the stages' workers run stateless steps batched
    (``execution.batched_steps``).

    A streaming run keeps Beam's windowed-value coders into every GroupByKey: its trigger
    driver holds the watermark by the elements' timestamps.
    """
    context, stages = create_stages(
        pipeline_proto, is_drain, use_state_iterables, streaming, native_combines
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
    _LOGGER.debug("Stages: %s", "; ".join(s.display_name for s in planned))
    return Plan(
        stages=planned,
        buffers=buffers,
        components=context.components,
        data_channel_coders=dict(context.data_channel_coders),
        safe_coders=dict(context.safe_coders),
        group_input_coders=group_coders,
        batched_steps=batched_steps,
        streaming=streaming,
    )
