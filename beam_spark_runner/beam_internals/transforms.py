"""What Beam's transforms, DoFns and CombineFns are, read where Beam keeps it privately."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam import coders
from apache_beam.internal import pickler
from apache_beam.io import textio
from apache_beam.options.pipeline_options import StreamingOptions
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import (
    beam_runner_api_pb2,
)
from apache_beam.runners import common as runners_common
from apache_beam.runners.pipeline_context import PipelineContext
from apache_beam.transforms import sideinputs, trigger, userstate, util, window

_LOGGER = logging.getLogger(__name__)


READ_URN: str = common_urns.deprecated_primitives.READ.urn


def plain_text_source(transform: beam_runner_api_pb2.PTransform) -> tuple[str, str] | None:
    """(file pattern, compression type) of a plain ``ReadFromText``'s ``Read``, else None.

    Plain: Beam's own ``_TextSource`` (not a subclass such as ReadFromTextWithFilename's)
    with the default separators, newlines stripped, no header handling, the default
    ``StrUtf8Coder`` and a file pattern known at construction.
    """
    if transform.spec.urn != READ_URN:
        return None
    payload = beam_runner_api_pb2.ReadPayload.FromString(transform.spec.payload)
    if payload.source.urn != python_urns.PICKLED_SOURCE:
        return None
    try:
        source = pickler.loads(payload.source.payload)
    except Exception:  # noqa: BLE001 - not ours to read; Beam's path will report it
        return None
    if type(source) is not textio._TextSource:  # noqa: SLF001 - Beam internal
        return None
    fields = vars(source)
    plain = (
        fields.get("_strip_trailing_newlines") is True
        and fields.get("_skip_header_lines") == 0
        and fields.get("_header_matcher") is None
        and fields.get("_header_processor") is None
        and fields.get("_delimiter") is None
        and fields.get("_escapechar") is None
        and type(fields.get("_coder")) is coders.StrUtf8Coder
    )
    pattern = fields.get("_pattern")
    if not plain or pattern is None or not pattern.is_accessible():
        return None
    return str(pattern.get()), str(fields.get("_compression_type"))


# Beam's Reshuffle keeps panes since this release (an update of an older one resets them).
_RESHUFFLE_KEEPS_PANES_SINCE = "2.65.0"


def reshuffles_expand_as_older_beam(options: Any) -> bool:
    """Whether ``options`` give Beam's Reshuffle an older expansion than the runner's own.

    A pipeline updating a job of an older Beam (``--update_compatibility_version``) gets
    Beam's expansion of that release: before the typed one, elements encoded as ``Any``
    (pickled, so elements that cannot be pickled fail there); before 2.65, every pane
    reset to UNKNOWN. The runner's repartition does neither, so such Reshuffles keep Beam's.
    """
    # Compared here, so no newer PipelineOptions method (is_compat_version_prior_to) is needed.
    version = options.view_as(StreamingOptions).update_compatibility_version
    if not version:
        return False

    def release(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in (text.split(".") + ["0", "0", "0"])[:3])

    typed_since = getattr(util, "RESHUFFLE_TYPEHINT_BREAKING_CHANGE_VERSION", "2.64.0")
    newest = max(release(typed_since), release(_RESHUFFLE_KEEPS_PANES_SINCE))
    return release(version) < newest


def python_transforms(pipeline: Any) -> Iterator[Any]:
    """Every transform of a Python pipeline (composites and their parts), outermost first.

    Walks the applied transforms' parts directly: ``Pipeline.visit`` also visits each
    transform's inputs, side inputs and outputs, and visiting a pipeline before
    ``to_runner_api`` changed the element types Beam then checked (a stateful DoFn's input
    read from a TestStream was no longer seen as key-value pairs).
    """
    stack = [pipeline._root_transform()]  # noqa: SLF001 - Beam has no public walk
    while stack:
        applied = stack.pop()
        if applied.transform is not None:
            yield applied.transform
        stack.extend(reversed(applied.parts))


def dofn_state_and_timer_domains(dofn: Any) -> tuple[bool, frozenset[str]]:
    """Whether a DoFn declares user state, and its timers' time domains.

    The domains are a subset of {"event", "processing"}.
    """
    state_specs, timer_specs = userstate.get_dofn_specs(dofn)
    domains = frozenset(
        "event" if spec.time_domain == userstate.TimeDomain.WATERMARK else "processing"
        for spec in timer_specs
    )
    return bool(state_specs), domains


def trigger_uses_processing_time(trigger_fn: trigger.TriggerFn) -> bool:
    """Whether a trigger, or any trigger inside it, fires on processing time."""
    processing = {"after_processing_time", "after_synchronized_processing_time"}

    def walk(message: Any) -> bool:
        for field, value in message.ListFields():
            if field.name in processing:
                return True
            if field.message_type is None:
                continue
            values = [value] if hasattr(value, "ListFields") else list(value)
            if any(walk(item) for item in values):
                return True
        return False

    return walk(trigger_fn.to_runner_api(PipelineContext()))


def is_unbounded_per_element(dofn: Any) -> bool:
    """Whether a DoFn's output is unbounded whatever its input (``unbounded_per_element``)."""
    return bool(runners_common.DoFnSignature(dofn).is_unbounded_per_element())


def global_window_param_payload() -> bytes:
    """The payload of a ``param_windowed_value`` coder: the global window, no timestamp.

    Such a coder encodes only an element's value; decoding gives the value in the global
    window at the minimum timestamp with no pane (as Beam reads it: the payload is a
    windowed empty ``bytes`` in the outer context).
    """
    windowed_bytes = coders.coders.WindowedValueCoder(
        coders.BytesCoder(), coders.coders.GlobalWindowCoder()
    )
    return windowed_bytes.encode(window.GlobalWindows.windowed_value(b""))  # type: ignore[no-any-return]


def window_mapping_fn(spec: beam_runner_api_pb2.FunctionSpec) -> Callable[[Any], Any]:
    """A side input's window mapping function (main window -> side input window)."""
    if spec.urn != python_urns.PICKLED_WINDOW_MAPPING_FN:
        raise ValueError(
            f"Expected a side input window mapping of {python_urns.PICKLED_WINDOW_MAPPING_FN}, "
            f"found {spec.urn}."
        )
    return pickler.loads(spec.payload)  # type: ignore[no-any-return]


# Beam's own window mappings (``sideinputs.default_window_mapping_fn``), by qualified name.
_DEFAULT_MAPPINGS = frozenset(
    {"_global_window_mapping_fn", "default_window_mapping_fn.<locals>.map_via_end"}
)


def maps_via_end(mapping: Callable[[Any], Any]) -> bool:
    """Whether ``mapping`` is Beam's default: the side window holding the main window's end.

    Such a side window ends no earlier than any main window mapped to it: in Java's terms
    its maximum lookback is zero. A user's mapping may look back any distance.
    """
    return (
        getattr(mapping, "__module__", None) == sideinputs.__name__
        and getattr(mapping, "__qualname__", None) in _DEFAULT_MAPPINGS
    )


def read_test_stream_service(
    url: str, output_ids: list[str], timeout: float
) -> list[beam_runner_api_pb2.TestStreamPayload.Event]:
    """Every event a TestStream service (``TestStreamServiceController``) streams.

    The service's events carry microseconds where a TestStream payload's carry
    milliseconds (DirectRunner reads them so, and Beam's interactive cache writes them so).
    ``timeout`` bounds the whole read: the service must end its stream.
    """
    import grpc
    from apache_beam.portability.api import (
        beam_interactive_api_pb2,
        beam_interactive_api_pb2_grpc,
    )

    with grpc.insecure_channel(url) as channel:
        stub = beam_interactive_api_pb2_grpc.TestStreamServiceStub(channel)
        request = beam_interactive_api_pb2.EventsRequest(output_ids=output_ids)
        return list(stub.Events(request, timeout=timeout))


def pickled_dofn_info(payload: beam_runner_api_pb2.ParDoPayload) -> tuple[Any, ...] | None:
    """A ParDo's (dofn, args, kwargs, side-input tags, windowing), if a pickled Python DoFn."""
    if payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO:
        return None
    return tuple(pickler.loads(payload.do_fn.payload))


# The aggregations the runner can run as Spark aggregations (planning.native_aggregation).
_BUILTIN_CALLABLE_AGGREGATIONS: dict[Any, str] = {sum: "sum", min: "min", max: "max"}


def builtin_aggregation(combine_fn_spec: beam_runner_api_pb2.FunctionSpec) -> str | None:
    """``sum``, ``min``, ``max``, ``count`` or ``mean`` for Beam's CombineFns of these, else None.

    Recognised: ``CombinePerKey(sum)`` (and ``min``, ``max``: Beam's wrapper of the builtin,
    without extra arguments), ``CountCombineFn`` (``Count.PerKey``, ``Count.PerElement``,
    ``Count.Globally``) and ``MeanCombineFn`` (``Mean.PerKey``, ``Mean.Globally``): exactly
    these classes, not subclasses, whose behaviour a user may have changed.
    """
    from apache_beam.transforms import combiners, core

    if combine_fn_spec.urn != python_urns.PICKLED_COMBINE_FN:
        return None
    try:
        combine_fn: Any = core.CombineFn.from_runner_api(combine_fn_spec, PipelineContext())
    except Exception:  # noqa: BLE001 - not ours to judge: Beam's own path will report it
        _LOGGER.debug("Could not unpickle a CombineFn", exc_info=True)
        return None
    kind = type(combine_fn)
    if kind is combiners.CountCombineFn:
        return "count"
    if kind is combiners.MeanCombineFn:
        return "mean"
    if kind in (core.CallableWrapperCombineFn, core.NoSideInputsCallableWrapperCombineFn):
        function = combine_fn._fn  # noqa: SLF001 - Beam internal
        for builtin, name in _BUILTIN_CALLABLE_AGGREGATIONS.items():
            if function is builtin:
                return name
    return None


def test_stream_events(test_stream: Any) -> list[Any]:
    """A ``TestStream``'s script: its element, watermark and processing-time events, in order."""
    return list(test_stream._events)  # noqa: SLF001 - TestStream keeps its script here


def test_stream_endpoint(test_stream: Any) -> str | None:
    """The service a ``TestStream`` reads its events from, if any (None: its own script)."""
    return test_stream._endpoint or None  # noqa: SLF001 - Beam internal


def create_coder(create: Any) -> Any:
    """The coder ``beam.Create``'s own expansion encodes its values with."""
    return create._coder  # noqa: SLF001 - Beam internal


# The ParDos through which Beam's ``iobase.WriteImpl`` calls ``sink.initialize_write()``,
# which makes the write's temporary directory.
_INITIALIZE_WRITES = ("/InitializeWrite", "/InitializeWindowedWrite")
# What ``FileBasedSink._create_temp_dir`` names a temporary directory: this, the prefix's
# last component, '-', and a ``uuid1`` in hex, beside the prefix.
FILE_SINK_TEMP_DIR_PREFIX = "beam-temp-"


def file_sink_temp_prefixes(components: beam_runner_api_pb2.Components) -> list[str]:
    """'<directory>/beam-temp-<name>-' for each ``FileBasedSink`` the pipeline writes with.

    Read from the sinks passed to the writes' initialize steps; a sink whose prefix is not
    known yet (a value provider without a value) is left out.
    """
    from apache_beam.io.filebasedsink import FileBasedSink
    from apache_beam.io.filesystems import FileSystems

    prefixes: list[str] = []
    for transform in components.transforms.values():
        if transform.spec.urn != common_urns.primitives.PAR_DO.urn or not (
            transform.unique_name.endswith(_INITIALIZE_WRITES)
        ):
            continue
        try:
            info = pickled_dofn_info(
                beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            )
        except Exception:  # noqa: BLE001 - not a sink this can read
            _LOGGER.debug("Cannot read the sink of %s", transform.unique_name, exc_info=True)
            continue
        arguments = [*info[1], *info[2].values()] if info is not None else []
        for sink in arguments:
            if not isinstance(sink, FileBasedSink):
                continue
            prefix = sink.file_path_prefix
            if prefix.is_accessible():
                directory, name = FileSystems.split(prefix.get())
                prefixes.append(FileSystems.join(directory, f"{FILE_SINK_TEMP_DIR_PREFIX}{name}-"))
    return sorted(set(prefixes))
