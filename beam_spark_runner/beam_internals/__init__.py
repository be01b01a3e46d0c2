"""The one place that touches Apache Beam's non-public modules.

The runner reuses Beam's own machinery rather than re-implementing it: the graph phases
of ``FnApiRunner`` (fusion, combiner lifting, SDF expansion), the SDK harness's bundle
processor (which runs user code with Beam's exact semantics), its in-memory state servicer
(which serves side inputs), the batch trigger driver (GroupByKey) and the monitoring-info
helpers (metrics). None of these are public API, so every use goes through the names below.
A Beam upgrade that moves them is fixed here, and ``pyproject.toml`` pins the tested range.
"""

from __future__ import annotations

import argparse
import collections
import copy
import functools
import gc
import inspect
import logging
import operator
import os
import struct
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from apache_beam import coders
from apache_beam.coders import coder_impl
from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.coders.coders import PickleCoder
from apache_beam.internal import cloudpickle_pickler, pickler
from apache_beam.io import textio
from apache_beam.metrics import monitoring_infos
from apache_beam.metrics.monitoring_infos import is_user_monitoring_info
from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_runner_api_pb2,
    endpoints_pb2,
    metrics_pb2,
)
from apache_beam.runners import common as runners_common
from apache_beam.runners.pipeline_context import PipelineContext
from apache_beam.runners.pipeline_utils import (
    group_by_key_input_visitor,
    merge_common_environments,
    merge_superset_dep_environments,
    validate_pipeline_graph,
)
from apache_beam.runners.portability import portable_metrics
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.runners.portability.fn_api_runner.execution import (
    GroupingBuffer,
    WindowGroupingBuffer,
)
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiMetrics, FnApiRunner
from apache_beam.runners.portability.fn_api_runner.worker_handlers import (
    FNAPI_RUNNER_CAPABILITIES,
    SingletonStateHandlerFactory,
    StateServicer,
)
from apache_beam.runners.worker import (
    bundle_processor,
    data_plane,
    sdk_worker,
    statecache,
    statesampler,
)
from apache_beam.transforms import core, environments, trigger, userstate, window
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils import proto_utils
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from apache_beam.utils.windowed_value import create as create_windowed_value

# Graph phases and helpers from FnApiRunner's translations module.
Stage = translations.Stage
TransformContext = translations.TransformContext
create_and_optimize_stages = translations.create_and_optimize_stages
create_buffer_id = translations.create_buffer_id
split_buffer_id = translations.split_buffer_id
only_element = translations.only_element
unique_name = translations.unique_name
IMPULSE_BUFFER: bytes = translations.IMPULSE_BUFFER
PAR_DO_URNS: frozenset[str] = translations.PAR_DO_URNS

# Runner <-> SDK data plane transforms inside a fused stage.
DATA_INPUT_URN: str = bundle_processor.DATA_INPUT_URN
DATA_OUTPUT_URN: str = bundle_processor.DATA_OUTPUT_URN
IDENTITY_DOFN_URN: str = bundle_processor.IDENTITY_DOFN_URN
ENCODED_IMPULSE_VALUE: bytes = runners_common.ENCODED_IMPULSE_VALUE
STATE_BACKED_ITERABLE_CODER_URN: str = common_urns.coders.STATE_BACKED_ITERABLE.urn
WINDOWED_VALUE_CODER_URN: str = common_urns.coders.WINDOWED_VALUE.urn
PARAM_WINDOWED_VALUE_CODER_URN: str = common_urns.coders.PARAM_WINDOWED_VALUE.urn
LENGTH_PREFIX_CODER_URN: str = common_urns.coders.LENGTH_PREFIX.urn
BYTES_CODER_URN: str = common_urns.coders.BYTES.urn
GLOBAL_WINDOW_CODER_URN: str = common_urns.coders.GLOBAL_WINDOW.urn

# The URNs the Python SDK harness can execute inside a fused stage.
SDK_TRANSFORM_URNS: frozenset[str] = frozenset(
    bundle_processor.BeamTransformFactory._known_urns  # noqa: SLF001 - Beam internal
)

ClosableOutputStream = data_plane.ClosableOutputStream
DataChannel = data_plane.DataChannel
DataChannelFactory = data_plane.DataChannelFactory
SdkWorker = sdk_worker.SdkWorker

_LOGGER = logging.getLogger(__name__)

# Monitoring infos of bundles that failed in this process, until a task takes them.
_failed_bundle_infos: list[Any] = []
_failed_bundle_lock = threading.Lock()


class BundleProcessorCache(sdk_worker.BundleProcessorCache):
    """Beam's bundle processor cache, keeping what a failed bundle's metrics had counted.

    (And without Beam's thread per cache: :meth:`_schedule_periodic_shutdown`.)

    When a bundle fails, Beam's ``SdkWorker`` discards its processor and answers with the
    error only: the metrics user code updated before failing are lost. They belong to the
    task attempt's *attempted* metrics, so this cache reads them before the processor is
    shut down; ``take_failed_bundle_monitoring_infos`` hands them to the failing task.
    """

    def _schedule_periodic_shutdown(self) -> None:
        """Starts no thread: the runner tears idle bundle processors down itself.

        Beam's cache starts a thread per cache, to shut down processors idle for 60 s, and
        ``shutdown`` joins it; each stage worker is a cache, built per stage, run and worker
        process (``stage_worker.StageWorker``). ``stage_worker.tear_down_idle_dofns``
        already tears idle processors down, after the run's ``idle_teardown_seconds``, and a
        stage worker's end shuts its cache down.
        """
        self.periodic_shutdown = None

    def discard(self, instruction_id: str, exception: Exception) -> None:
        """Records the failed bundle's monitoring infos, then discards it as Beam does."""
        entry = self.active_bundle_processors.get(instruction_id)
        if entry is not None:
            try:
                infos = entry[1].monitoring_infos()
            except Exception:  # noqa: BLE001 - metrics must never mask the bundle's error
                _LOGGER.debug("Could not read a failed bundle's metrics", exc_info=True)
            else:
                with _failed_bundle_lock:
                    _failed_bundle_infos.extend(infos)
        super().discard(instruction_id, exception)


def bundle_processors_busy(cache: sdk_worker.BundleProcessorCache) -> bool:
    """Whether a bundle processor cache has a bundle running or a processor being built.

    ``processors_being_created`` only exists from Beam 2.69 on.
    """
    return bool(cache.active_bundle_processors or getattr(cache, "processors_being_created", 0))


def take_failed_bundle_monitoring_infos() -> list[Any]:
    """The monitoring infos of bundles that failed in this process since the last call."""
    with _failed_bundle_lock:
        taken = list(_failed_bundle_infos)
        _failed_bundle_infos.clear()
    return taken


GlobalCachingStateHandler = sdk_worker.GlobalCachingStateHandler
StateHandler = sdk_worker.StateHandler
StateCache = statecache.StateCache


def create_trigger_driver(windowing: Any, clock: Any) -> Any:
    """Beam's streaming trigger driver for ``windowing``, tags' combiners cached.

    Over merging windows Beam's driver keeps combining state (``AfterCount``'s count, for
    one) through ``MergeableStateAdapter``, which calls ``without_extraction`` on the tag
    at every read and write; that defines a new ``CombineFn`` class each call. Classes are
    cyclic garbage: on q11 (sessions with an early ``AfterCount``) making and collecting
    them was about a quarter of a worker's time. :func:`_cache_tags_without_extraction`
    makes the call return one tag per tag and combiner.
    """
    _cache_tags_without_extraction()
    return trigger.create_trigger_driver(windowing, clock=clock)


_WITHOUT_EXTRACTION: dict[tuple[str, int], tuple[Any, Any]] = {}
_WITHOUT_EXTRACTION_CACHED = 1024


def _cache_tags_without_extraction() -> None:
    """Makes ``_CombiningValueStateTag.without_extraction`` cached (once per process).

    What it returns only passes its combiner's functions through (and extracts nothing),
    so one per (tag name, combiner) gives the same results. The cache holds the combiner,
    so its id is not reused while cached.
    """
    tag_class = trigger._CombiningValueStateTag  # noqa: SLF001
    beams = tag_class.without_extraction
    if getattr(beams, "_beam_spark_cached", False):
        return

    def without_extraction(self: Any) -> Any:
        key = (self.tag, id(self.combine_fn))
        hit = _WITHOUT_EXTRACTION.get(key)
        if hit is None or hit[0] is not self.combine_fn:
            if len(_WITHOUT_EXTRACTION) >= _WITHOUT_EXTRACTION_CACHED:
                _WITHOUT_EXTRACTION.clear()
            hit = _WITHOUT_EXTRACTION[key] = (self.combine_fn, beams(self))
        return hit[1]

    without_extraction._beam_spark_cached = True  # type: ignore[attr-defined]
    tag_class.without_extraction = without_extraction  # type: ignore[method-assign]


def set_bundle_sampling_period(period_ms: int) -> bool:
    """Makes the bundle processors created from now on sample at most every ``period_ms``.

    Each bundle starts a thread that samples which step runs (Beam's ``StateSampler``); at
    the end of the bundle Beam joins it, which waits out the thread's current sleep, up to
    the sampling period (200 ms by default). A Spark task runs a bundle or two, so that wait
    is on every task's critical path. ``BundleProcessor`` creates its sampler with the
    default period, so the default is what this changes, in this process only. Returns
    False (and changes nothing) if Beam's signature is not the expected one.
    """
    init = statesampler.StateSampler.__init__
    parameter = inspect.signature(init).parameters.get("sampling_period_ms")
    if parameter is None or init.__defaults__ is None or len(init.__defaults__) != 1:
        return False
    init.__defaults__ = (period_ms,)
    return True


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


from_monitoring_infos = portable_metrics.from_monitoring_infos
# FnApiRunner reports its number of fused stages as this pipeline-level counter.
NUM_FUSED_STAGES_URN: str = "internal:" + FnApiRunner.NUM_FUSED_STAGES_COUNTER


def set_pickle_library(library: str) -> None:
    """Sets Beam's process-wide pickler (``--pickle_library``), as ``Pipeline`` does.

    It pickles DoFns, coders and windowing on the driver and unpickles them in workers.
    """
    pickler.set_library(library)


_ArgsDefaults = tuple[list[str], list[Any]]
_SIGNATURES_CACHED = "_beam_spark_runner_cached"


def cache_function_signatures() -> None:
    """Makes Beam's ``get_function_args_defaults`` remember what it found per function.

    Beam inspects the signature of every method of a DoFn each time it builds a
    ``DoFnSignature`` (``get_dofn_specs`` walks ``dir(dofn)``, some 30 methods, twice per
    signature), and a worker builds a few signatures per step and run. Most of those
    methods are Beam's own, the same function objects in every run: without the memo that
    inspection was most of a short pipeline's Python CPU in the workers. The memo is
    exact: it holds plain functions only (not ``functools.wraps`` wrappers, not callables
    with a ``__signature__``), keyed by the function and whether it is bound, and a hit
    counts only while the function's code and defaults are the objects it was inspected
    with. Installed once per process: in the driver when a pipeline runs (its
    ``to_runner_api`` inspects every DoFn again), in a worker on its first task. So is
    the memo of ``get_dofn_specs`` per DoFn instance (:func:`_remember_dofn_specs`).
    """
    from apache_beam.transforms import core

    _remember_dofn_specs()
    original = core.get_function_args_defaults
    if getattr(original, _SIGNATURES_CACHED, False):
        return
    caches: tuple[weakref.WeakKeyDictionary[Any, Any], ...] = (
        weakref.WeakKeyDictionary(),  # plain functions
        weakref.WeakKeyDictionary(),  # functions bound as methods (the first argument taken)
    )

    def get_function_args_defaults(f: Any) -> _ArgsDefaults:
        bound = type(f) is types.MethodType
        func = f.__func__ if bound else f
        if (
            type(func) is not types.FunctionType
            or hasattr(func, "__wrapped__")
            or hasattr(func, "__signature__")
        ):
            return original(f)
        code, defaults, kwdefaults = func.__code__, func.__defaults__, func.__kwdefaults__
        cache = caches[bound]
        hit = cache.get(func)
        if hit is None or hit[0] is not code or hit[1] is not defaults or hit[2] is not kwdefaults:
            hit = (code, defaults, kwdefaults, original(f))
            cache[func] = hit
        names, values = hit[3]
        return list(names), list(values)

    setattr(get_function_args_defaults, _SIGNATURES_CACHED, True)
    core.get_function_args_defaults = get_function_args_defaults


# How many DoFn instances' state and timer specs are remembered at once.
_DOFN_SPECS_KEPT = 1024


def _remember_dofn_specs() -> None:
    """Makes Beam's ``get_dofn_specs`` remember what it found per DoFn instance.

    Beam walks ``dir(dofn)`` (some 30 methods) each time it asks whether a DoFn is
    stateful: twice per ``DoFnSignature``, and again when it translates a ``ParDo``. The
    same instance is asked over and over: some 60 times while a short pipeline is built and
    translated, four times per step and task in a worker (the batched path's check and
    Beam's ``DoFnRunner``). The walk reads the methods' defaults; so a hit counts only for
    the same instance (by a weak reference: DoFns may define ``__eq__``), of the same class,
    whose bound methods held as attributes (``Map(obj.method)`` sets ``process`` so) are
    the same objects. Callers get sets of their own, as from Beam.
    """
    from apache_beam.transforms import userstate

    original = userstate.get_dofn_specs
    if getattr(original, _SIGNATURES_CACHED, False):
        return
    found: dict[int, tuple[Any, ...]] = {}

    def get_dofn_specs(dofn: Any) -> tuple[set[Any], set[Any]]:
        try:
            ref = weakref.ref(dofn)
            methods = tuple(v for v in vars(dofn).values() if type(v) is types.MethodType)
        except TypeError:  # no weak references or no __dict__: not remembered
            return original(dofn)  # type: ignore[no-any-return]
        hit = found.get(id(dofn))
        if (
            hit is None
            or hit[0]() is not dofn
            or hit[1] is not type(dofn)
            or len(hit[2]) != len(methods)
            or any(a is not b for a, b in zip(hit[2], methods, strict=True))
        ):
            if len(found) >= _DOFN_SPECS_KEPT:
                found.clear()
            hit = found[id(dofn)] = (ref, type(dofn), methods, original(dofn))
        states, timers = hit[3]
        return set(states), set(timers)

    setattr(get_dofn_specs, _SIGNATURES_CACHED, True)
    userstate.get_dofn_specs = get_dofn_specs


_VIEWS_REMEMBERED = "_beam_spark_runner_views_remembered"
# How many (options class, command line) parses are remembered at once: a process builds
# pipelines from one or a few command lines, each viewed as some 15 classes.
_REMEMBERED_PARSES = 256


def _flags_key(flags: Any) -> tuple[str, ...] | None:
    """The command line an options view parses, as a key; None if it is not a plain one."""
    if flags is None:  # argparse parses sys.argv then
        flags = sys.argv[1:]
    if not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
        return None
    return tuple(flags)


def remember_option_views() -> None:
    """Makes ``PipelineOptions.view_as`` parse each options class once per command line.

    Beam's ``view_as(cls)`` builds an argument parser for ``cls`` and parses the options'
    flags again on every call, about 0.9 ms, and constructing a short pipeline calls it
    some 130 times (``TypeOptions`` at every ``apply``): about 0.1 s, two thirds of the
    construction of issue 14's 8-element pipeline; and each new options object (a test's,
    or one Beam makes) is viewed as some 15 classes again. A view is its class, the
    options' flags and shared value store, and the parsed namespace, whose option names
    are all Beam reads of it (``_visible_option_list``): values are read from the store,
    where Beam's view puts each name's parsed value unless the store has that name
    already. The parse depends only on the class and the flags, so the memo keeps one per
    (class, flags) and builds later views without parsing: with a namespace of its own
    sharing the parse's values where the store has every name, and with a deep copy of
    them, put in the store as Beam's view would, where it lacks some (another options
    object, or a name taken out). It applies only to classes that keep
    ``PipelineOptions``' own ``__init__`` and ``__new__``, to flags that are a plain list of
    strings (or ``sys.argv``), and to parses whose values copy; otherwise Beam's method
    runs. Installed once per process, when the runner is created (before the pipeline's
    transforms are applied).
    """
    from apache_beam.options import pipeline_options as po

    original = po.PipelineOptions.view_as
    if getattr(original, _VIEWS_REMEMBERED, False):
        return
    base_init = po.PipelineOptions.__init__
    lock = threading.Lock()
    # (cls, flags) -> (option names, the parsed namespace, never handed out), latest last.
    parsed: collections.OrderedDict[tuple[type, tuple[str, ...]], tuple[list[str], Any]] = (
        collections.OrderedDict()
    )

    def view_as(self: Any, cls: Any) -> Any:
        store, flags = self._all_options, self._flags
        key = _flags_key(flags)
        if key is None or cls.__init__ is not base_init or cls.__new__ is not object.__new__:
            return original(self, cls)
        with lock:
            hit = parsed.get((cls, key))
            if hit is not None:
                parsed.move_to_end((cls, key))
        if hit is None:
            view = original(self, cls)
            try:
                kept = copy.deepcopy(view._visible_options)
            except Exception:  # noqa: BLE001 - an option value that does not copy: not remembered
                return view
            with lock:
                parsed[(cls, key)] = (view._visible_option_list(), kept)
                while len(parsed) > _REMEMBERED_PARSES:
                    parsed.popitem(last=False)
            return view
        names, kept = hit
        missing = [name for name in names if name not in store]
        # A namespace object of its own; fresh values for the names the store lacks.
        namespace = copy.deepcopy(kept) if missing else argparse.Namespace(**vars(kept))
        for name in missing:
            store[name] = getattr(namespace, name)
        logging.basicConfig()  # as Beam's __init__ does
        view = object.__new__(cls)
        view.__dict__.update(_flags=flags, _visible_options=namespace, _all_options=store)
        return view

    setattr(view_as, _VIEWS_REMEMBERED, True)
    view_as.__wrapped__ = original  # type: ignore[attr-defined]
    view_as.__doc__ = original.__doc__
    po.PipelineOptions.view_as = view_as  # type: ignore[method-assign]


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


def current_step_name() -> str | None:
    """The Beam step (transform name) running on this thread, as Beam's log handler finds it."""
    tracker = statesampler.get_current_tracker()
    if tracker is None:
        return None
    state = tracker.current_state()
    name_context = getattr(state, "name_context", None) if state is not None else None
    return getattr(name_context, "step_name", None) if name_context is not None else None


def dump_main_session(path: str) -> bytes:
    """The main session, pickled as Beam's stager does for ``--save_main_session``.

    With dill, the whole ``__main__`` module; with cloudpickle, Beam's registries (coders,
    logical types, schemas) only, since cloudpickle pickles ``__main__`` code by value.
    ``path`` is the scratch file Beam's pickler writes. Beam 2.69 and older write nothing
    with cloudpickle (their ``dump_session`` is a no-op): that session is empty bytes.
    """
    pickler.dump_session(path)
    if not os.path.exists(path):
        return b""
    with open(path, "rb") as file:
        return file.read()


def load_main_session(path: str) -> None:
    """Loads a main session in a worker, as Beam's SDK harness does (``sdk_worker_main``).

    An empty file (the session of a Beam whose cloudpickle ``dump_session`` wrote nothing)
    loads nothing.
    """
    if os.path.getsize(path) == 0:
        return
    pickler.load_session(path)


def cloudpickle_dumps(value: Any) -> bytes:
    """Pickles ``value`` with Beam's cloudpickle pickler, whatever ``--pickle_library`` is."""
    return cloudpickle_pickler.dumps(value)


def cloudpickle_loads(data: bytes) -> Any:
    """Unpickles bytes from :func:`cloudpickle_dumps`."""
    return cloudpickle_pickler.loads(data)


class _TypeCacheProbe(NamedTuple):
    """A type only :func:`type_pickle_caches` encodes, to find ``coder_impl``'s caches."""

    value: int


class _DropFallbackWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "_TypeCacheProbe" not in record.getMessage()


@functools.cache
def type_pickle_caches() -> tuple[dict[Any, bytes], dict[bytes, Any]] | None:
    """``coder_impl``'s process-wide caches of pickled "special types", or None if not found.

    A deterministic ``FastPrimitivesCoder`` (a GroupByKey's key coder) encodes a named
    tuple, dataclass, enum or proto by pickling its type, and caches the pickle by type
    (``_pickled_types``) and the type by pickle (``_unpickled_types``), whichever library
    pickled it: cloudpickle, or dill for ``--update_compatibility_version`` 2.67.0 and
    earlier. In the compiled ``coder_impl`` these dicts are C module variables, out of
    Python's reach: they are found as the dicts that hold a probe type after encoding and
    decoding one value of it. Searched once per process; the dicts never change identity.
    """
    pickled = getattr(coder_impl, "_pickled_types", None)
    unpickled = getattr(coder_impl, "_unpickled_types", None)
    if isinstance(pickled, dict) and isinstance(unpickled, dict):  # pure-Python coder_impl
        return pickled, unpickled
    impl = coder_impl.FastPrimitivesCoderImpl(
        PickleCoder().get_impl(), requires_deterministic_step_label="type_pickle_caches"
    )
    quiet = _DropFallbackWarning()
    coder_logger = logging.getLogger(coder_impl.__name__)
    coder_logger.addFilter(quiet)
    try:
        encoded = impl.encode(_TypeCacheProbe(0))
        impl.decode(encoded)
    except Exception:  # noqa: BLE001 - a Beam that encodes differently: report not found
        _LOGGER.debug("Could not encode the type-cache probe", exc_info=True)
        return None
    finally:
        coder_logger.removeFilter(quiet)
    holders = [r for r in gc.get_referrers(_TypeCacheProbe) if type(r) is dict]
    pickled_found = [
        d
        for d in holders
        if isinstance(d.get(_TypeCacheProbe), bytes) and d[_TypeCacheProbe] in encoded
    ]
    if len(pickled_found) != 1:
        return None
    type_pickle = pickled_found[0][_TypeCacheProbe]
    unpickled_found = [d for d in holders if d.get(type_pickle) is _TypeCacheProbe]
    if len(unpickled_found) != 1:
        return None
    return pickled_found[0], unpickled_found[0]


def par_do_payloads(
    transforms: Mapping[str, beam_runner_api_pb2.PTransform],
) -> Iterator[tuple[str, beam_runner_api_pb2.PTransform, beam_runner_api_pb2.ParDoPayload]]:
    """(id, transform, ParDoPayload) of each ParDo (SDF parts included) among ``transforms``."""
    for transform_id, transform in transforms.items():
        if transform.spec.urn in PAR_DO_URNS:
            payload = proto_utils.parse_Bytes(
                transform.spec.payload, beam_runner_api_pb2.ParDoPayload
            )
            yield transform_id, transform, payload


def side_input_ids(
    transforms: Mapping[str, beam_runner_api_pb2.PTransform],
) -> list[tuple[str, str]]:
    """(transform id, tag) of each side input read by a ParDo among ``transforms``."""
    return [
        (transform_id, tag)
        for transform_id, _, payload in par_do_payloads(transforms)
        for tag in payload.side_inputs
    ]


def fn_api_runner_phases() -> list:
    """Beam's batch graph phases, in FnApiRunner's order."""
    t = translations
    return [
        t.annotate_downstream_side_inputs,
        # A stateful ParDo starts its own stage, so the runner can shuffle its input by key.
        t.annotate_stateful_dofns_as_roots,
        t.fix_side_input_pcoll_coders,
        t.pack_combiners,
        t.lift_combiners,
        t.expand_sdf,
        t.expand_gbk,
        t.sink_flattens,
        t.greedily_fuse,
        t.read_to_impulse,
        t.impulse_to_input,
        t.sort_stages,
        t.add_impulse_to_dangling_transforms,
        t.setup_timer_mapping,
        t.populate_data_channel_coders,
    ]


def fn_api_runner_supported_requirements() -> tuple[str, ...]:
    """The pipeline requirements Beam's own FnApiRunner declares support for."""
    return tuple(FnApiRunner.supported_requirements())


def embedded_environment_proto() -> beam_runner_api_pb2.Environment:
    """The environment proto for running Python transforms in this process."""
    return environments.EmbeddedPythonEnvironment.default().to_runner_api(None)  # type: ignore[arg-type]


def default_environment() -> environments.Environment:
    """The environment the runner asks Beam to use for Python transforms."""
    return environments.EmbeddedPythonEnvironment.default()


def resolve_any_environments(
    pipeline_proto: beam_runner_api_pb2.Pipeline,
) -> beam_runner_api_pb2.Pipeline:
    """Resolves ``AnyOf`` environments the way FnApiRunner does."""
    for env_id, env in pipeline_proto.components.environments.items():
        pipeline_proto.components.environments[env_id].CopyFrom(
            environments.resolve_anyof_environment(
                env,
                python_urns.EMBEDDED_PYTHON,
                common_urns.environments.EXTERNAL.urn,
                common_urns.environments.DOCKER.urn,
            )
        )
    return pipeline_proto


def prepare_pipeline_proto(
    pipeline_proto: beam_runner_api_pb2.Pipeline,
) -> beam_runner_api_pb2.Pipeline:
    """Validates the graph and merges environments, as FnApiRunner does first."""
    validate_pipeline_graph(pipeline_proto)
    return merge_common_environments(
        resolve_any_environments(merge_superset_dep_environments(pipeline_proto))
    )


__all__ = [
    "FNAPI_RUNNER_CAPABILITIES",
    "FnApiMetrics",
    "GroupingBuffer",
    "PaneInfo",
    "PaneInfoTiming",
    "WindowedValue",
    "PipelineContext",
    "SingletonStateHandlerFactory",
    "StateServicer",
    "WindowGroupingBuffer",
    "beam_fn_api_pb2",
    "beam_runner_api_pb2",
    "common_urns",
    "monitoring_infos",
    "create_InputStream",
    "create_OutputStream",
    "endpoints_pb2",
    "group_by_key_input_visitor",
    "is_user_monitoring_info",
    "metrics_pb2",
    "proto_utils",
    "python_urns",
]


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


def is_splittable_dofn(dofn: Any) -> bool:
    """Whether a DoFn is splittable (its output may be unbounded whatever its input)."""
    return bool(runners_common.DoFnSignature(dofn).is_splittable_dofn())


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


class WindowedHeaders:
    """Reads encoded windowed values' timestamps and windows, not their values.

    Beam's windowed-value encoding (``WindowedValueCoderImpl``) is the timestamp (8 bytes:
    milliseconds, shifted to sort unsigned), the windows (a count, then each window), the
    pane, then the value. ``header`` gives an element's timestamp in microseconds, as
    Beam's decoding gives it, and its windows' bytes: a key for what depends on the
    windows alone, decoded by ``windows`` once per distinct key.

    Neighbouring elements mostly share their windows. The windows' encoding is
    self-delimiting (a count, then windows that are), so an element whose bytes after the
    timestamp start with the previous element's windows' bytes has exactly those windows:
    only a change of windows is decoded.
    """

    _TIME_SHIFT = 1 << 63
    _MIN_MILLIS = -(abs(MIN_TIMESTAMP.micros) // 1000)
    _MAX_MILLIS = MAX_TIMESTAMP.micros // 1000

    def __init__(self, window_coder: Any) -> None:
        self._windows = coder_impl.TupleSequenceCoderImpl(window_coder.get_impl())
        self._last = b""
        self._unpack = struct.Struct(">Q").unpack_from

    @staticmethod
    def of(coder: Any) -> WindowedHeaders | None:
        """Headers of ``coder``'s elements, if it is Beam's windowed-value coder.

        None for any other (a parameterized windowed value carries no header).
        """
        if type(coder) is not coders.coders.WindowedValueCoder:
            return None
        return WindowedHeaders(coder.window_coder)

    def header(self, element: bytes) -> tuple[int, bytes]:
        """One encoded element's timestamp (microseconds) and its windows' bytes."""
        last = self._last
        if not (last and element.startswith(last, 8)):
            stream = create_InputStream(element)
            stream.read(8)
            self._windows.decode_from_stream(stream, True)
            last = self._last = element[8 : len(element) - stream.size()]
        millis = self._unpack(element)[0] - self._TIME_SHIFT
        if millis <= self._MIN_MILLIS:
            return MIN_TIMESTAMP.micros, last
        if millis >= self._MAX_MILLIS:
            return MAX_TIMESTAMP.micros, last
        return millis * 1000, last

    def windows(self, windows_bytes: bytes) -> tuple[Any, ...]:
        """The windows ``header`` gave the bytes of."""
        return tuple(self._windows.decode_from_stream(create_InputStream(windows_bytes), True))


def trigger_state() -> Any:
    """A fresh state for Beam's streaming trigger driver (``InMemoryUnmergedState``)."""
    return trigger.InMemoryUnmergedState()


# An ``IntervalWindow``'s bounds in microseconds, read from the attributes Beam's compiled
# window class keeps them in (``utils/windowed_value.pxd``): ``window.start.micros`` goes
# through a ``Timestamp`` and a Python property, and hashing or comparing windows reads
# ``MIN_TIMESTAMP.micros`` and ``MAX_TIMESTAMP.micros`` each time.
interval_bounds: Callable[[Any], tuple[int, int]] = operator.attrgetter(
    "_start_micros", "_end_micros"
)
_INTERVAL_WINDOW = window.IntervalWindow


# The installed Beam's ``Timestamp`` attributes, and timestamps (µs) the faster makers and
# readers below are checked against Beam's own constructor and property with.
_TIMESTAMP_LAYOUT = vars(Timestamp(micros=0)).keys()
_SECONDS_AT_PRECISION = {"_precision", "_seconds", "_subseconds"}  # Beam 2.7x
_TIMESTAMP_PROBES = (0, 1, -1, 1_700_000_000_123_456, -62_135_596_800_000_000, MIN_TIMESTAMP.micros)


def _timestamp_maker() -> Callable[[int], Any]:
    """A maker of ``Timestamp(micros=m)`` that skips the constructor's checks.

    That is about half its cost. It sets the attributes of the installed Beam's layout,
    checked against the constructor; the constructor itself for a layout not known here.
    """
    new = Timestamp.__new__
    if _TIMESTAMP_LAYOUT == _SECONDS_AT_PRECISION:
        # Beam 2.7x: seconds and a fraction at a precision (6: microseconds).

        def make(micros: int) -> Any:
            made = new(Timestamp)
            made._precision = 6
            made._seconds, made._subseconds = divmod(micros, 1_000_000)
            return made

    elif _TIMESTAMP_LAYOUT == {"micros"}:
        # Beam 2.69 and before: one attribute.

        def make(micros: int) -> Any:
            made = new(Timestamp)
            made.__dict__["micros"] = micros
            return made

    else:
        return lambda micros: Timestamp(micros=micros)
    if all(vars(make(m)) == vars(Timestamp(micros=m)) for m in _TIMESTAMP_PROBES):
        return make
    return lambda micros: Timestamp(micros=micros)


# ``Timestamp(micros=m)``, faster (a Spark stream's rows make one per timestamp field).
timestamp_of_micros: Callable[[int], Any] = _timestamp_maker()


def _micros_reader() -> Callable[[Any], int]:
    """A reader of ``timestamp.micros`` that skips the property and its method call.

    That is about two thirds of its cost. It reads the attributes of Beam 2.7x's layout,
    checked against the property; the property itself for any other layout (Beam 2.69's
    ``micros`` is an attribute: nothing to skip) and for a timestamp finer than
    microseconds (whose ``micros`` raises, as Beam's does).
    """
    by_property = operator.attrgetter("micros")
    if _TIMESTAMP_LAYOUT != _SECONDS_AT_PRECISION:
        return by_property

    def micros(timestamp: Any) -> int:
        if timestamp._precision == 6:
            return timestamp._seconds * 1_000_000 + timestamp._subseconds  # type: ignore[no-any-return]
        return timestamp.micros  # type: ignore[no-any-return]

    made = [Timestamp(micros=m) for m in _TIMESTAMP_PROBES]
    made += [Timestamp.of(s / 8) for s in range(-9, 9)]
    return micros if all(micros(t) == t.micros for t in made) else by_property


# ``timestamp.micros``, faster (a ``TimestampedValue`` output's windowed value reads it).
micros_of_timestamp: Callable[[Any], int] = _micros_reader()


def forget_expired_windows(state: Any, expired: Callable[[Any], bool]) -> None:
    """Drops from a trigger driver's state the windows ``expired`` says are done.

    Beam's ``GeneralTriggerDriver`` keeps each window's state under an id that
    ``MergeableStateAdapter`` maps from the (merged) window, and never forgets a window,
    not even after its final pane. A window without pending timers whose ``expired`` is true
    loses its state and its id here.
    """
    adapter = trigger.MergeableStateAdapter(state)
    window_ids = adapter.window_ids
    for window_ in list(window_ids):
        ids = window_ids[window_]
        if not expired(window_) or any(state.timers.get(i) for i in ids):
            continue
        for window_id in ids:
            state.state.pop(window_id, None)
            state.timers.pop(window_id, None)
        del window_ids[window_]
    state.set_global_state(trigger.MergeableStateAdapter.WINDOW_IDS, window_ids)


def trigger_state_next_work(state: Any, lateness_micros: int) -> int | None:
    """The input watermark (µs) at which a trigger driver's state next has work.

    That is its earliest event-time timer, or the first watermark past a window's end
    plus the allowed lateness (its garbage-collection time, see
    :func:`forget_expired_windows`), whichever is first. None while it has a
    processing-time timer: that is due whenever processing time moves, every micro-batch.
    A state with neither has no work until it gets elements.
    """
    due: int | None = None
    for timers in state.timers.values():
        for (_name, domain, _tag), timestamp in timers.items():
            if domain != trigger.TimeDomain.WATERMARK:
                return None
            if due is None or timestamp.micros < due:
                due = timestamp.micros
    window_ids = state.get_global_state(trigger.MergeableStateAdapter.WINDOW_IDS, {})
    for window_ in window_ids:
        expires = window_.end.micros + lateness_micros + 1
        if due is None or expires < due:
            due = expires
    return due


def empty_trigger_state(state: Any) -> None:
    """Empties a trigger driver's state in place (its windows, timers and values).

    Over merging windows Beam's driver defines a ``WindowFn.MergeContext`` class per call
    whose method holds the state: a class is cyclic, so the state, every window and
    timestamp in it, waits for the cyclic collector after it is dropped (on q11 that was
    most of each collection, about a sixth of a worker's time). Emptied, it is freed
    when its last reference goes.
    """
    window_ids = state.global_state.get(trigger.MergeableStateAdapter.WINDOW_IDS.tag)
    if isinstance(window_ids, dict):
        window_ids.clear()
    state.timers.clear()
    state.state.clear()
    state.global_state.clear()


def trigger_state_is_empty(state: Any) -> bool:
    """Whether a trigger driver's state holds no window and no timer."""
    window_ids = state.get_global_state(trigger.MergeableStateAdapter.WINDOW_IDS, {})
    return not window_ids and not state.state and not any(state.timers.values())


def servicer_contents(servicer: Any) -> tuple[dict[bytes, list[bytes]], dict[bytes, Any]]:
    """A ``StateServicer``'s cells (state key -> values) and ordered-list indexes, as dicts.

    The value lists are the servicer's own, not copies: the caller drops the servicer
    (``InMemoryStateBackend.export_user_state`` does), so nothing appends to them again.
    A shard of 100 000 keys spent a tenth of its Python time copying them every batch.
    """
    return (
        {key: values for key, values in servicer._state.items() if values},  # noqa: SLF001
        dict(servicer._ordered_list_keys),  # noqa: SLF001
    )


def servicer_with(contents: tuple[dict[bytes, list[bytes]], dict[bytes, Any]] | None) -> Any:
    """A ``StateServicer`` holding what :func:`servicer_contents` returned.

    It takes the value lists as they are (the caller hands over a decoded copy it does not
    read again), in a dict of its own.
    """
    servicer = StateServicer()
    if contents:
        cells, ordered = contents
        servicer._state = collections.defaultdict(list, cells)  # noqa: SLF001
        servicer._ordered_list_keys.update(ordered)  # noqa: SLF001
    return servicer


def window_mapping_fn(spec: beam_runner_api_pb2.FunctionSpec) -> Callable[[Any], Any]:
    """A side input's window mapping function (main window -> side input window)."""
    if spec.urn != python_urns.PICKLED_WINDOW_MAPPING_FN:
        raise ValueError(
            f"Expected a side input window mapping of {python_urns.PICKLED_WINDOW_MAPPING_FN}, "
            f"found {spec.urn}."
        )
    return pickler.loads(spec.payload)  # type: ignore[no-any-return]


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


# --- The batched path for stateless steps (execution/batched_steps.py) ---------------------

_STANDARD_WINDOW_FNS = (
    window.GlobalWindows,
    window.FixedWindows,
    window.SlidingWindows,
    window.Sessions,
)


def _batchable_params() -> dict[str, Any]:
    """What a DoFn may ask for besides its element for the batched path to run it, by name."""
    from apache_beam.transforms import core

    return {"timestamp": core.DoFn.TimestampParam, "window": core.DoFn.WindowParam}


def timestamp_window_params(dofn: Any) -> tuple[str, ...] | None:
    """The timestamp and window parameters ``dofn``'s ``process`` takes after its element.

    Where it takes nothing else (``DoFn.TimestampParam``, ``DoFn.WindowParam``):
    "timestamp" or "window" per parameter, in order; None for any other signature.

    Beam's ``PerWindowInvoker`` calls such a DoFn as ``process(element, timestamp or
    window, ...)``, once per window of the element where it takes its window
    (``has_windowed_inputs``), and handles its outputs as the ``SimpleInvoker``'s.
    """
    method = runners_common.MethodWrapper(dofn, "process")
    defaults = method.defaults
    if not defaults or len(method.args) != len(defaults) + 1:
        return None
    params = _batchable_params().items()
    names = []
    for default in defaults:
        name = next((name for name, param in params if param == default), None)
        if name is None:
            return None
        names.append(name)
    return tuple(names)


def _is_dofn_param(default: Any) -> bool:
    """Whether a ``process`` default is one of Beam's ``DoFn.*Param`` (instance or class).

    Any other default is a plain value: Beam's invoker passes it only when an extra
    argument fills its slot, so the call is ``process(element, *args, **kwargs)`` as
    without it (``runners.common._get_arg_placeholders``). ``FlatMap(str.split)``'s
    signature is ``str.split``'s: ``sep=None, maxsplit=-1``.
    """
    from apache_beam.transforms import core

    param = core._DoFnParam  # noqa: SLF001 - Beam internal: every DoFn.*Param is one
    return isinstance(default, param) or (isinstance(default, type) and issubclass(default, param))


class ListReceiver(runners_common.Receiver):  # type: ignore[misc]
    """A Beam receiver that appends every windowed value it receives to ``values``.

    Once ``values`` holds ``limit`` values, it calls ``full`` (which takes them).
    """

    def __init__(self) -> None:
        self.values: list[WindowedValue] = []
        self.limit = sys.maxsize
        self.full: Callable[[], None] | None = None

    def receive(self, windowed_value: WindowedValue) -> None:
        self.values.append(windowed_value)
        if len(self.values) >= self.limit and self.full is not None:
            self.full()


class _NullReceiver(runners_common.Receiver):  # type: ignore[misc]
    def receive(self, windowed_value: WindowedValue) -> None:
        """Drops the value: an output tag nobody reads, as Beam's ``_TaggedReceivers``."""


class _MainOnlyReceivers(dict):  # type: ignore[type-arg]
    """Tagged receivers of a one-output step: unknown tags go nowhere, as in Beam."""

    def __missing__(self, tag: Any) -> Any:
        return _NullReceiver()


def pickled_dofn_info(payload: beam_runner_api_pb2.ParDoPayload) -> tuple[Any, ...] | None:
    """A ParDo's (dofn, args, kwargs, side-input tags, windowing), if a pickled Python DoFn."""
    if payload.do_fn.urn != python_urns.PICKLED_DOFN_INFO:
        return None
    return tuple(pickler.loads(payload.do_fn.payload))


# Packages of Beam that hold user code Beam ships (its examples and benchmarks, such as
# Nexmark's DoFns), not its machinery: their DoFns are judged as a user's are.
_BEAM_USER_CODE_PACKAGES = ("apache_beam.examples.", "apache_beam.testing.benchmarks.")


def unbatchable_dofn_reason(dofn: Any, args: Any, kwargs: Any, side_inputs: int = 0) -> str | None:
    """Why the batched path cannot run ``dofn`` (None: it can).

    It can run Beam's ``CallableWrapperDoFn`` (Map, FlatMap, Filter, MapTuple,
    FlatMapTuple), with extra arguments that are plain values (``Map(fn, 3, k=v)``), and
    user DoFns whose ``process`` takes the element and, as keyword defaults, only
    ``TimestampParam`` or ``WindowParam``; both with their ``side_inputs`` (how many the
    ParDo has: the caller checks how they are read). Not with DoFn parameters passed as
    arguments, state, timers, restrictions, batched ``process_batch`` or lifecycle
    parameters. Beam's own other DoFns (and wrappers such as the runtime type check's)
    keep the bundle processor, except those of its examples and benchmarks (user code
    that Beam ships).
    """
    from apache_beam.internal.util import ArgumentPlaceholder
    from apache_beam.transforms import core

    extra = [*args, *kwargs.values()]
    # Side inputs stand in the arguments as placeholders, one each.
    if sum(isinstance(a, ArgumentPlaceholder) for a in extra) != side_inputs:
        return "arguments the runner cannot tell from side inputs"
    plain = [a for a in extra if not isinstance(a, ArgumentPlaceholder)]
    if plain and type(dofn) is not core.CallableWrapperDoFn:
        return "a DoFn with extra arguments"
    if any(isinstance(a, core._DoFnParam) for a in plain):  # noqa: SLF001 - Beam internal
        return "DoFn parameters passed as arguments"
    positional_sides = sum(isinstance(a, ArgumentPlaceholder) for a in args)
    if not isinstance(dofn, core.DoFn):
        return "not a DoFn"
    module = type(dofn).__module__
    if (
        type(dofn) is not core.CallableWrapperDoFn
        and module.startswith("apache_beam.")
        and not module.startswith(_BEAM_USER_CODE_PACKAGES)
    ):
        return f"Beam's own {type(dofn).__name__}"
    try:
        signature = runners_common.DoFnSignature(dofn)
    except Exception as error:  # noqa: BLE001 - the bundle processor will say what is wrong
        return f"no signature ({error})"
    if signature.is_splittable_dofn() or signature.is_stateful_dofn():
        return "splittable or stateful"
    if getattr(dofn, "_process_batch_defined", False) or getattr(
        signature.process_method.method_value, "_beam_yields_batches", False
    ):
        return "processes batches"
    process = signature.process_method
    # Without extra arguments Beam calls process(element) whatever its signature: its
    # SimpleInvoker, or its PerWindowInvoker filling no plain default (``Map(float)``:
    # ``float(x=0, /)``). With them, their slots must be the ones after the element.
    if (
        extra
        and process.defaults
        and len(process.args) - len(process.defaults) != 1 + positional_sides
    ):
        return "process takes other arguments than the element (and its side inputs)"
    allowed = _batchable_params().values()
    # Unpickled parameters are copies: compare as Beam does (by the parameter's id).
    if any(_is_dofn_param(d) and not any(p == d for p in allowed) for d in process.defaults):
        return "process takes parameters other than timestamp and window"
    for method in (
        signature.setup_lifecycle_method,
        signature.start_bundle_method,
        signature.finish_bundle_method,
        signature.teardown_lifecycle_method,
    ):
        if method.args or method.defaults:
            return "a lifecycle method takes parameters"
    contexts = [
        getattr(signature, name, lambda: ())()
        for name in ("get_setup_contexts", "get_bundle_contexts")  # Beam 2.70+
    ]
    if any(any(found) for found in contexts):
        return "setup or bundle contexts"
    return None


def is_simple_callable(dofn: Any) -> bool:
    """Whether Beam calls ``dofn``'s ``process`` with the element and extra arguments alone.

    A Map/FlatMap/Filter whose callable takes only the element, or a user DoFn whose
    ``process`` has no defaults. Beam runs those with its ``SimpleInvoker``:
    ``process(element)``, each output with the input's timestamp, windows and pane unless
    it is a ``WindowedValue``, a ``TimestampedValue`` or a ``TaggedOutput``; with side
    inputs or extra arguments, its ``PerWindowInvoker``, which calls
    ``process(element, *arguments)`` (side inputs' values for the element's window in
    their placeholders) and outputs the same way for an element in one window. A callable
    with plain defaults (no ``DoFn.*Param``) gets the ``PerWindowInvoker`` too, which
    fills no plain default.
    """
    from apache_beam.transforms import core

    # What DoFnSignature(dofn).process_method is, without the rest of the signature
    # (inspecting every attribute of the DoFn for state and timers: ~0.7 ms a step and
    # task, where this is ~20 µs). The step's DoFnRunner has already built the signature,
    # so a DoFn it refuses never gets here.
    defaults = runners_common.MethodWrapper(dofn, "process").defaults
    if type(dofn) is core.CallableWrapperDoFn:
        return not any(map(_is_dofn_param, defaults))
    return not defaults


def windowing_from_proto(
    strategy: beam_runner_api_pb2.WindowingStrategy, context: PipelineContext
) -> Any:
    """Beam's ``Windowing`` of a windowing strategy proto."""
    from apache_beam.transforms import core

    return core.Windowing.from_runner_api(strategy, context)


def is_standard_window_fn(window_fn: Any) -> bool:
    """Global, fixed, sliding or session windows (exactly Beam's classes)."""
    return type(window_fn) in _STANDARD_WINDOW_FNS


def window_into_dofn(windowing: Any) -> Any:
    """The DoFn Beam's bundle processor runs for ``WindowInto`` (``create_assign_windows``).

    The same code: each window of the element is assigned anew (an element in several
    windows is processed once per window, as Beam's ``PerWindowInvoker`` does), and the
    output has no pane.
    """
    return _WindowIntoDoFn(windowing)


# The runner's own DoFns are classes of this module, not made per call: Beam inspects a
# DoFn's methods for each signature, and the memo of that inspection
# (``cache_function_signatures``) holds per function object.
class _WindowIntoDoFn(core.DoFn):  # type: ignore[misc]
    # What ``window_assigner`` looks for.
    runner_window_into = True

    def __init__(self, windowing: Any) -> None:
        self.windowing = windowing

    def process(
        self,
        element: Any,
        timestamp: Any = core.DoFn.TimestampParam,
        window_: Any = core.DoFn.WindowParam,
    ) -> Iterator[WindowedValue]:
        new_windows = self.windowing.windowfn.assign(
            window.WindowFn.AssignContext(timestamp, element=element, window=window_)
        )
        yield WindowedValue(element, timestamp, new_windows)


def flatten_dofn() -> Any:
    """The DoFn the batched path runs for a Flatten of one input inside a fused stage.

    Beam's ``FlattenOperation`` passes each windowed value on as it is; so does the batched
    path for a DoFn of this class (``runner_flatten``), without calling it.
    """
    return _FlattenDoFn()


class _FlattenDoFn(core.DoFn):  # type: ignore[misc]
    runner_flatten = True

    def process(self, element: Any) -> Iterator[Any]:
        yield element  # its timestamp, windows and pane kept, as Beam's output handler does


# Beam's ``_KeyWithNone`` (every ``CombineGlobally``'s ``KeyWithVoid``): a DoFn registered
# by URN, not pickled.
KEY_WITH_NONE_DOFN_URN: str = python_urns.KEY_WITH_NONE_DOFN


def _key_with_none(value: Any) -> tuple[None, Any]:
    return None, value


def key_with_none_dofn() -> Any:
    """The DoFn the batched path runs for ``KEY_WITH_NONE_DOFN_URN``.

    Beam's ``_KeyWithNone.process`` yields ``(None, v)`` for each ``v``, with its input's
    timestamp, windows and pane; so does ``Map`` of the same function, which the batched
    path calls directly (``wrapped_callable``). A fresh copy of one made per process.
    """
    return copy.copy(_key_with_none_template())


@functools.cache
def _key_with_none_template() -> Any:
    """One ``Map(_key_with_none)``'s DoFn per process, which each step copies.

    Constructing the ``Map`` (Beam's type hints and DoFn checks) at every step's set-up
    was 7.6 % of the 8-element pipeline's worker samples.
    """
    from apache_beam.transforms import core

    return core.Map(_key_with_none).fn


PRECOMBINE_URN: str = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
# A lifted combine's phases after its GroupByKey, by Beam's phase names.
COMBINE_PHASE_URNS: dict[str, str] = {
    common_urns.combine_components.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn: "merge",
    common_urns.combine_components.COMBINE_PER_KEY_EXTRACT_OUTPUTS.urn: "extract",
}


def combine_phase_dofn(urn: str, payload: bytes, context: Any) -> Any:
    """The DoFn the batched path runs for a lifted combine's merge or extract phase.

    It is Beam's ``CombineOperation`` (what the bundle processor builds for these URNs):
    each ``(key, accumulators)`` becomes ``(key, merge_accumulators(accumulators))``, or
    ``(key, accumulator)`` becomes ``(key, extract_output(accumulator))``, with the input's
    timestamp, windows and pane, through Beam's ``PhasedCombineFnExecutor``; the CombineFn
    is set up and torn down with the step. The batched path calls ``apply_kv`` per element
    (``runner_combine_phase``).
    """
    from apache_beam.transforms.combiners import PhasedCombineFnExecutor

    combine_payload = beam_runner_api_pb2.CombinePayload.FromString(payload)
    executor = PhasedCombineFnExecutor(
        COMBINE_PHASE_URNS[urn],
        core.CombineFn.from_runner_api(combine_payload.combine_fn, context),
        [],
        {},
    )
    return _CombinePhaseDoFn(executor.apply, executor.combine_fn)


class _CombinePhaseDoFn(core.DoFn):  # type: ignore[misc]
    runner_combine_phase = True

    def __init__(self, apply: Callable[[Any], Any], combine_fn: Any) -> None:
        self._apply = apply
        self._combine_fn = combine_fn

    def apply_kv(self, element: tuple[Any, Any]) -> tuple[Any, Any]:
        """``(key, phase(values))`` of a ``(key, values)``."""
        key, values = element
        return key, self._apply(values)

    def setup(self) -> None:
        self._combine_fn.setup()

    def teardown(self) -> None:
        self._combine_fn.teardown()

    def process(self, element: tuple[Any, Any]) -> Iterator[tuple[Any, Any]]:
        yield self.apply_kv(element)


def precombine_dofn(payload: bytes, context: Any, windowing: Any) -> Any:
    """The DoFn the batched path runs for a lifted combine's precombine in a fused stage.

    It is Beam's ``PGBKCVOperation`` (what the bundle processor builds for
    ``COMBINE_PER_KEY_PRECOMBINE``): per bundle, a table from key (and window, outside the
    default windowing) to an accumulator, flushed in part past Beam's key limit, output in
    insertion order when the bundle finishes, with the CombineFn's ``compact`` and Beam's
    timestamps and windows. The batched path calls ``add_all`` with a chunk of windowed
    values (``runner_precombine``); ``process`` does the same for one.
    """
    from apache_beam.transforms import combiners

    combine_payload = beam_runner_api_pb2.CombinePayload.FromString(payload)
    combine_fn = core.CombineFn.from_runner_api(combine_payload.combine_fn, context)
    timestamp_combiner = (
        None
        if windowing.timestamp_combiner == window.TimestampCombiner.OUTPUT_AT_EOW
        else window.TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
    )
    small = isinstance(combine_fn, (combiners.CountCombineFn, combiners.MeanCombineFn)) or (
        isinstance(combine_fn, core.CallableWrapperCombineFn) and combine_fn._fn in (min, max, sum)  # noqa: SLF001 - as Beam's operation checks
    )
    return _PrecombineDoFn(
        combine_fn,
        windowing.is_default(),
        timestamp_combiner,
        1000 * 1000 if small else 100 * 1000,
    )


class _PrecombineDoFn(core.DoFn):  # type: ignore[misc]
    runner_precombine = True

    def __init__(
        self, combine_fn: Any, default_windowing: bool, timestamp_combiner: Any, max_keys: int
    ) -> None:
        self._combine_fn = combine_fn
        self._default_windowing = default_windowing
        self._timestamp_combiner = timestamp_combiner
        self._max_keys = max_keys
        self._compact = (
            None if type(combine_fn).compact is core.CombineFn.compact else combine_fn.compact
        )
        # (window, key) -> [accumulator, timestamp, window]. An IntervalWindow is keyed by
        # its bounds (hashing the window object reads two Timestamp properties).
        self.table: dict[Any, list[Any]] = {}

    def setup(self) -> None:
        self._combine_fn.setup()

    def teardown(self) -> None:
        self._combine_fn.teardown()

    def start_bundle(self) -> None:
        self.table = {}

    def add_all(self, values: list[Any]) -> list[Any]:
        """Adds a chunk of windowed ``(key, value)``s; returns what a flush output."""
        table = self.table
        add_input = self._combine_fn.add_input
        new_entry = self._new_entry
        flushed: list[Any] = []
        if self._default_windowing:
            for windowed_value in values:
                key, value = windowed_value.value
                entry = table.get(key) or new_entry(key, None, None, flushed)
                entry[0] = add_input(entry[0], value)
            return flushed
        timestamp_combiner = self._timestamp_combiner
        interval_window, bounds = window.IntervalWindow, interval_bounds
        for windowed_value in values:
            key, value = windowed_value.value
            timestamp = windowed_value.timestamp if timestamp_combiner else None
            for window_ in windowed_value.windows:
                at = bounds(window_) if type(window_) is interval_window else window_
                wkey = (at, key)
                entry = table.get(wkey) or new_entry(wkey, timestamp, window_, flushed)
                entry[0] = add_input(entry[0], value)
                if timestamp_combiner:
                    entry[1] = timestamp_combiner.combine(entry[1], timestamp)
        return flushed

    def _new_entry(self, wkey: Any, timestamp: Any, window_: Any, flushed: list[Any]) -> list[Any]:
        """A new accumulator in the table, after Beam's flush if the table is full."""
        if len(self.table) >= self._max_keys:
            flushed.extend(self._flush())
        entry = self.table[wkey] = [self._combine_fn.create_accumulator(), timestamp, window_]
        return entry

    def process(
        self,
        element: Any,
        window_: Any = core.DoFn.WindowParam,
        timestamp: Any = core.DoFn.TimestampParam,
    ) -> Iterator[Any]:
        # The batched path calls add_all with whole chunks; this is one element of it.
        yield from self.add_all([WindowedValue(element, timestamp, (window_,))])

    def finish_bundle(self) -> Iterator[Any]:
        table, self.table = self.table, {}
        for wkey, entry in table.items():
            yield self._output(wkey, *entry)

    def _flush(self) -> list[Any]:
        """Beam's eviction: the oldest tenth of the table (and a key more) goes out."""
        table = self.table
        count = len(table)
        target = count * 9 // 10
        evicted = []
        for wkey in table:
            evicted.append(wkey)
            count -= 1
            if count <= target:
                break
        return [self._output(wkey, *table.pop(wkey)) for wkey in evicted]

    def _output(self, wkey: Any, accumulator: Any, timestamp: Any, window_: Any) -> Any:
        value = accumulator if self._compact is None else self._compact(accumulator)
        if self._default_windowing:
            return _GLOBAL_WINDOWED_NONE.with_value((wkey, value))
        at, key = wkey
        if self._timestamp_combiner is not None:
            return WindowedValue((key, value), timestamp, (window_,))
        if type(at) is tuple:  # an IntervalWindow's max_timestamp: its end's predecessor
            return create_windowed_value((key, value), at[1] - 1, (window_,))
        return WindowedValue((key, value), window_.max_timestamp(), (window_,))


# As Beam's operations module makes it.
_GLOBAL_WINDOWED_NONE = window.GlobalWindows.windowed_value(None)


_ASSIGNED_CACHED = 4096


def window_assigner(dofn: Any) -> Callable[[int], list[Any]] | None:
    """The new windows ``window_into_dofn``'s DoFn gives an element, by its timestamp (µs).

    ``micros_windows`` of its window function; None for any other DoFn.
    """
    if not getattr(type(dofn), "runner_window_into", False):
        return None
    return micros_windows(dofn.windowing.windowfn)


def micros_windows(window_fn: Any) -> Callable[[int], list[Any]] | None:
    """What ``window_fn.assign`` gives an element at a timestamp (µs), for common classes.

    For Beam's ``FixedWindows``, ``SlidingWindows``, ``Sessions`` and ``GlobalWindows``
    (exactly those classes), what ``assign`` returns depends on the timestamp only through
    a key that integer arithmetic gives (the window's start; for sliding windows the first
    start and how many windows, as Beam's ``range`` counts them; for sessions the
    timestamp itself, which sources often give many elements alike): Beam's own
    ``assign`` runs once per key, and each element gets a new list of the same windows.
    None for any other window function (its ``assign`` may read the element).
    """
    kind = type(window_fn)
    key: Callable[[int], Any]
    if kind is window.FixedWindows:
        size, offset = window_fn.size.micros, window_fn.offset.micros

        def key(micros: int) -> Any:
            return micros - (micros - offset) % size

    elif kind is window.SlidingWindows:
        size, period = window_fn.size.micros, window_fn.period.micros
        offset = window_fn.offset.micros

        def key(micros: int) -> Any:
            start = micros - (micros - offset) % period
            return start, len(range(start, micros - size, -period))

    elif kind is window.Sessions:

        def key(micros: int) -> Any:
            return micros

    elif kind is window.GlobalWindows:
        only = tuple(window_fn.assign(window.WindowFn.AssignContext(MIN_TIMESTAMP)))
        return lambda micros: list(only)
    else:
        return None
    assign = window_fn.assign
    context = window.WindowFn.AssignContext
    cache: dict[Any, tuple[Any, ...]] = {}

    def windows(micros: int) -> list[Any]:
        at = key(micros)
        found = cache.get(at)
        if found is None:
            if len(cache) >= _ASSIGNED_CACHED:
                cache.clear()
            found = cache[at] = tuple(assign(context(Timestamp(micros=micros))))
        return list(found)

    return windows


def dofn_runner(
    dofn: Any,
    windowing: Any,
    receiver: ListReceiver,
    step_name: str,
    transform_id: str,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    side_inputs: Sequence[Any] = (),
) -> Any:
    """Beam's ``DoFnRunner`` for a one-output step writing to ``receiver``.

    Built as Beam's ``DoOperation`` builds it (the main output and its tag go to the
    receiver, other tags nowhere), so ``process``, ``start``, ``finish``, ``setup`` and
    ``teardown`` behave as in the bundle processor, errors naming the step included.
    ``side_inputs`` are the step's side-input maps (:func:`side_input_maps`), in order.
    """
    from apache_beam.utils.counters import CounterFactory

    state = runners_common.DoFnState(CounterFactory())
    state.step_name = step_name
    receivers = _MainOnlyReceivers({None: receiver})
    return runners_common.DoFnRunner(
        dofn,
        list(args),
        dict(kwargs or {}),
        list(side_inputs),
        windowing,
        tagged_receivers=receivers,
        step_name=step_name,
        state=state,
        transform_id=transform_id,
        operation_name=step_name,
    )


class _PerWindowSideInput:
    """A side-input map that looks a main window up once per batch, not per element.

    Beam's ``StateBackedSideInputMap`` maps the main window to the side-input window and
    looks that up for every element (about 2 µs); this keeps the value per main window
    until :meth:`reset` (the end of a batch: a streaming shard's side inputs change
    between batches).
    """

    def __init__(self, side_input_map: Any) -> None:
        self._map = side_input_map
        self._values: dict[Any, Any] = {}

    def __getitem__(self, window: Any) -> Any:
        key = window_key(window)
        try:
            return self._values[key]
        except KeyError:
            value = self._values[key] = self._map[window]
            return value

    def is_globally_windowed(self) -> bool:
        return bool(self._map.is_globally_windowed())

    def reset(self) -> None:
        self._values.clear()
        self._map.reset()


def side_input_maps(
    payload: beam_runner_api_pb2.ParDoPayload,
    transform_id: str,
    descriptor: Any,
    context: PipelineContext,
) -> Callable[[Any], list[Any]]:
    """A ParDo's side-input maps, given a state handler, as Beam's bundle processor makes them.

    In Beam's order (by side-input index), each cached per main window.
    """
    from apache_beam import pvalue
    from apache_beam.transforms import sideinputs

    transform = descriptor.transforms[transform_id]
    made = []
    for tag, side_input in payload.side_inputs.items():
        pcollection = descriptor.pcollections[transform.inputs[tag]]
        strategy = descriptor.windowing_strategies[pcollection.windowing_strategy_id]
        coder = coders.WindowedValueCoder(
            context.coders[pcollection.coder_id], context.coders[strategy.window_coder_id]
        )
        made.append((tag, pvalue.SideInputData.from_runner_api(side_input, context), coder))
    made.sort(key=lambda entry: sideinputs.get_sideinput_index(entry[0]))

    def make(state_handler: Any) -> list[Any]:
        return [
            _PerWindowSideInput(
                bundle_processor.StateBackedSideInputMap(
                    state_handler, transform_id, tag, data, coder
                )
            )
            for tag, data, coder in made
        ]

    return make


def side_input_arguments(
    side_inputs: list[Any], window: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A step's extra arguments with its side inputs' values for ``window`` in place.

    What Beam's ``PerWindowInvoker`` passes for an element in ``window``: each map read for
    the window, in side-input order, into the placeholders of the positional arguments,
    then of the keyword arguments by name (``internal.util.insert_values_in_args``).
    Globally windowed side inputs are read for the global window whatever ``window`` is.
    """
    from apache_beam.internal import util

    values = [side_input[window] for side_input in side_inputs]
    new_args, new_kwargs = util.insert_values_in_args(args, kwargs, values)
    return tuple(new_args), new_kwargs


def window_key(window: Any) -> Any:
    """What tells ``window`` from other windows, cheaply: an ``IntervalWindow``'s bounds.

    An ``IntervalWindow``'s own hash and equality read six ``Timestamp.micros`` properties
    (``MIN_TIMESTAMP``'s and ``MAX_TIMESTAMP``'s); any other window is its own key.
    """
    return interval_bounds(window) if type(window) is _INTERVAL_WINDOW else window


def simple_output_handler(windowing: Any, receiver: ListReceiver) -> Any:
    """Beam's output handler of a ``CallableWrapperDoFn`` writing to ``receiver``."""
    return runners_common._OutputHandler(  # noqa: SLF001 - Beam internal
        windowing.windowfn, receiver, _MainOnlyReceivers({None: receiver}), None, None, False, False
    )


def special_output_types() -> tuple[type, ...]:
    """Outputs of ``process`` that Beam does not simply give the input's windowing."""
    from apache_beam.pvalue import TaggedOutput

    return (WindowedValue, TimestampedValue, TaggedOutput)


def reraise_augmented(runner: Any, error: BaseException, windowed_value: Any) -> None:
    """Re-raises ``error`` as Beam's ``DoFnRunner`` does: the message names the step."""
    runner._reraise_augmented(error, windowed_value)  # noqa: SLF001 - Beam internal


def metrics_container(step_name: str) -> Any:
    """A fresh metrics container for one step (Beam's ``MetricsContainer``)."""
    from apache_beam.metrics.execution import MetricsContainer

    return MetricsContainer(step_name)


def state_sampler(name: str) -> Any:
    """A state sampler that is never started: it only tells user code its step's metrics."""
    from apache_beam.utils.counters import CounterFactory

    return statesampler.StateSampler(name, CounterFactory())


def scoped_state(
    sampler: Any, step_name: str, transform_id: str, state_name: str, container: Any
) -> Any:
    """The sampler state of one step's ``state_name`` (start, process, finish)."""
    return sampler.scoped_state(
        runners_common.NameContext(step_name, transform_id),
        state_name,
        metrics_container=container,
    )


get_current_tracker = statesampler.get_current_tracker
set_current_tracker = statesampler.set_current_tracker


def user_monitoring_infos(container: Any, transform_id: str) -> list[Any]:
    """A step's user metrics as monitoring infos, as Beam's operations report them."""
    return list(container.to_runner_api_monitoring_infos(transform_id).values())


def pcollection_monitoring_infos(
    pcollection_id: str, count: int, sizes: tuple[int, int, int, int]
) -> list[Any]:
    """Element count and sampled byte size (sum, count, min, max) of one PCollection."""
    from apache_beam.metrics.cells import DistributionData

    return [
        monitoring_infos.int64_counter(
            monitoring_infos.ELEMENT_COUNT_URN, count, pcollection=pcollection_id
        ),
        monitoring_infos.int64_distribution(
            monitoring_infos.SAMPLED_BYTE_SIZE_URN,
            DistributionData(*sizes),
            pcollection=pcollection_id,
        ),
    ]


def execution_time_monitoring_infos(
    transform_id: str, start_ms: int, process_ms: int, finish_ms: int
) -> list[Any]:
    """A step's start, process, finish and total milliseconds, as Beam's operations report."""
    return [
        monitoring_infos.int64_counter(urn, value, ptransform=transform_id)
        for urn, value in (
            (monitoring_infos.START_BUNDLE_MSECS_URN, start_ms),
            (monitoring_infos.PROCESS_BUNDLE_MSECS_URN, process_ms),
            (monitoring_infos.FINISH_BUNDLE_MSECS_URN, finish_ms),
            (monitoring_infos.TOTAL_MSECS_URN, start_ms + process_ms + finish_ms),
        )
    ]


def read_index_monitoring_info(transform_id: str, index: int) -> Any:
    """The data input's read index (elements read), as its operation reports it."""
    return monitoring_infos.int64_counter(
        monitoring_infos.DATA_CHANNEL_READ_INDEX, index, ptransform=transform_id
    )


def is_read_index_info(info: Any, transform_id: str) -> bool:
    """Whether ``info`` is the read index of the data input ``transform_id``."""
    return bool(
        info.urn == monitoring_infos.DATA_CHANNEL_READ_INDEX
        and info.labels.get(monitoring_infos.PTRANSFORM_LABEL) == transform_id
    )


def record_failed_bundle_monitoring_infos(infos: list[Any]) -> None:
    """Keeps the metrics of a batch that failed, for the failing task's attempted metrics."""
    with _failed_bundle_lock:
        _failed_bundle_infos.extend(infos)


def remote_grpc_port(payload: bytes) -> beam_fn_api_pb2.RemoteGrpcPort:
    """The data-plane port of a data input or output transform (its coder id)."""
    return beam_fn_api_pb2.RemoteGrpcPort.FromString(payload)


class _HandoffValues(threading.local):
    """Windowed values a batch hands to the bundle processor, per hand-off token.

    Per thread: the bundle processor decodes its input in the thread that asked for the
    bundle (``SdkWorker.do_instruction``), right after the batch queued it.
    """

    def __init__(self) -> None:
        self.queues: dict[str, collections.deque[Any]] = {}


_HANDOFF_VALUES = _HandoffValues()


class _HandoffCoderImpl(coder_impl.StreamCoderImpl):  # type: ignore[misc]
    """Decodes each one-byte element as the next value handed off under its token."""

    def __init__(self, token: str, windowed_impl: Any) -> None:
        self._token = token
        self._windowed = windowed_impl

    def encode_to_stream(self, value: Any, stream: Any, nested: bool) -> None:
        self._windowed.encode_to_stream(value, stream, nested)

    def decode_from_stream(self, stream: Any, nested: bool) -> Any:
        stream.read_byte()
        return _HANDOFF_VALUES.queues[self._token].popleft()

    def estimate_size(self, value: Any, nested: bool = False) -> int:
        return self._windowed.estimate_size(value, nested)  # type: ignore[no-any-return]

    def get_estimated_size_and_observables(self, value: Any, nested: bool = False) -> Any:
        return self._windowed.get_estimated_size_and_observables(value, nested)


class HandoffCoder(coders.Coder):  # type: ignore[misc]
    """The coder of a stage's hand-off from its batched steps to the bundle processor.

    The batched steps' output is not encoded: each element is one byte on the data plane,
    and the bundle processor's data input reads the windowed value itself (see
    :func:`hand_off`). So nothing is lost that an encoding would lose (timestamps finer
    than Beam's millisecond encoding) and nothing is encoded twice. Sizes are estimated
    with the PCollection's windowed coder.
    """

    def __init__(self, token: str, windowed_coder: Any) -> None:
        self._token = token
        self._windowed_coder = windowed_coder

    def _create_impl(self) -> Any:
        return _HandoffCoderImpl(self._token, self._windowed_coder.get_impl())

    def is_deterministic(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is HandoffCoder
            and other._token == self._token
            and other._windowed_coder == self._windowed_coder
        )

    def __hash__(self) -> int:
        return hash((type(self), self._token))


def handoff_coder_proto(
    token: str, descriptor: beam_fn_api_pb2.ProcessBundleDescriptor, windowed_coder_id: str
) -> beam_runner_api_pb2.Coder:
    """The proto of a :class:`HandoffCoder` for a windowed coder of ``descriptor``."""
    windowed = PipelineContext(descriptor).coders[windowed_coder_id]
    return HandoffCoder(token, windowed).to_runner_api(PipelineContext())  # type: ignore[no-any-return]


def hand_off(token: str, values: list[Any]) -> bytes:
    """Queues ``values`` for the hand-off coder of ``token``; the bytes to feed its input."""
    _HANDOFF_VALUES.queues[token] = collections.deque(values)
    return b"\x00" * len(values)


def _code_key(function: Any) -> tuple[Any, ...] | None:
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    return (code.co_code, code.co_names, code.co_freevars, code.co_filename, code.co_firstlineno)


@functools.cache
def _wrapper_codes() -> dict[tuple[Any, ...] | None, str]:
    """The code of the functions Beam's ``Map`` and ``Filter`` wrap a plain callable in."""
    from apache_beam.transforms import core

    def probe(x: Any) -> Any:
        return x

    def probe_with_arguments(x: Any, y: Any) -> Any:
        return x

    return {
        _code_key(core.Map(probe).fn._fn): "map",  # noqa: SLF001 - Beam internal
        # Map(fn) of a callable taking more than the element (extra arguments, side inputs).
        _code_key(core.Map(probe_with_arguments).fn._fn): "map",  # noqa: SLF001
        _code_key(core.Filter(probe).fn._fn): "filter",  # noqa: SLF001 - Beam internal
    }


def wrapped_callable(dofn: Any) -> tuple[str, Callable[[Any], Any]] | None:
    """("map" or "filter", the user's callable) of a plain ``Map``/``Filter``, else None.

    Beam wraps the callable of ``Map(fn)`` as ``lambda x: [fn(x)]`` (``lambda x, *args,
    **kwargs: [fn(x, *args, **kwargs)]`` if ``fn`` takes more than the element) and of
    ``Filter(fn)`` as ``lambda x, *a, **k: [x] if fn(x, *a, **k) else []``: recognised by
    their code (the same Beam made them), the callable is the closure's ``fn``.
    """
    wrapper = getattr(dofn, "_fn", None)
    kind = _wrapper_codes().get(_code_key(wrapper))
    if kind is None or wrapper is None or wrapper.__closure__ is None:
        return None
    (cell,) = wrapper.__closure__
    return kind, cell.cell_contents


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
