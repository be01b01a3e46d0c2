"""Every change the runner makes to Apache Beam's own behaviour, and how long it lasts.

* :func:`option_views` (driver, the user's process): ``PipelineOptions.view_as`` served by
  a memo of one pipeline's parses (:class:`OptionViews`), only inside the block, only for
  the thread in it. ``SparkStructuredRunner.apply`` enters it for each transform applied
  and drops its memo when a run ends; Beam's method is back once no thread is inside.
* :func:`cache_function_signatures` (a Spark Python worker, on its first task; stays for
  that process's life) and :func:`signature_memos` (the driver, while a pipeline is
  built, planned and run; Beam's functions are back when the last run in it ends):
  ``core.get_function_args_defaults`` and, through :func:`remember_dofn_specs`,
  ``userstate.get_dofn_specs`` remember what they found, per function and per DoFn
  instance. Exact: a hit counts only for the same objects, so every pipeline, on any
  runner, gets Beam's answers.
* :func:`cache_tags_without_extraction` (a process that runs a streaming trigger driver:
  a Spark Python worker; stays for the process's life):
  ``_CombiningValueStateTag.without_extraction`` returns one tag per tag and combiner.
  Exact: what it returns only passes the combiner's functions through.
* :func:`bundle_sampling_period` (the runner's own bundle processors, in any process;
  only while one is built): Beam's ``StateSampler`` default period, so that those
  processors sample every 20 ms instead of 200 ms and a bundle's end waits less for the
  sampler thread. Beam's default is back once no processor is being built.
* :func:`shared_keys_per_task` (a Spark Python worker; stays for the process's life):
  ``BatchElements``' keying DoFns (``WithSharedKey``, ``WithLengthBucketKey``) key each
  bundle's elements by the Spark task's partition instead of a UUID per process, so that
  which pooled worker process ran a micro-batch does not split the batches.
* :func:`side_inputs_per_element` (a Spark Python worker; only while a streaming shard's
  bundle processor is built): Beam's ``disable_global_windowed_args_caching`` experiment,
  so that the invokers built there read globally windowed side inputs per element. A
  shard serves one processor's invokers new side-input contents each micro-batch (a later
  trigger firing), which an invoker that resolved them once would not see. The
  process's experiments are back once no processor is being built.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import inspect
import logging
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.runners.worker import (
    statesampler,
)
from apache_beam.transforms import trigger, util

_WITHOUT_EXTRACTION: dict[tuple[str, int], tuple[Any, Any]] = {}
_WITHOUT_EXTRACTION_CACHED = 1024


def cache_tags_without_extraction() -> None:
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


# Beam's sampler class, whose __init__ default period bundle_sampling_period sets.
_STATE_SAMPLER = statesampler.StateSampler
# Whether Beam's signature is the expected one: the period is __init__'s only default.
_SAMPLING_PERIOD_IS_THE_DEFAULT = (
    "sampling_period_ms" in inspect.signature(_STATE_SAMPLER.__init__).parameters
    and len(_STATE_SAMPLER.__init__.__defaults__ or ()) == 1
)


class _CountedPatch:
    """A change to Beam made by the first thread in and undone by the last one out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._undo: Callable[[], None] | None = None

    @contextlib.contextmanager
    def held(self, apply: Callable[[], Callable[[], None]]) -> Iterator[None]:
        """Within: the change ``apply`` makes (it returns how to undo it), counted."""
        with self._lock:
            if self._users == 0:
                self._undo = apply()
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0 and self._undo is not None:
                    self._undo()
                    self._undo = None


_SAMPLING = _CountedPatch()


def bundle_sampling_period(period_ms: int) -> contextlib.AbstractContextManager[None]:
    """Within: bundle processors built here sample which step runs every ``period_ms``.

    ``BundleProcessor`` makes its ``StateSampler`` with the class's default period, and a
    bundle's end joins the sampler's thread, waiting out its current sleep. Beam's default
    is restored when the last thread leaves. Nothing changes if Beam's signature is not
    the expected one.
    """
    init = _STATE_SAMPLER.__init__

    def apply() -> Callable[[], None]:
        default = init.__defaults__
        if _SAMPLING_PERIOD_IS_THE_DEFAULT:
            init.__defaults__ = (period_ms,)

        def undo() -> None:
            init.__defaults__ = default

        return undo

    return _SAMPLING.held(apply)


_PER_ELEMENT = _CountedPatch()
# The experiment that stops Beam's invokers resolving globally windowed side inputs once.
_RESOLVE_SIDE_INPUTS_PER_ELEMENT = "disable_global_windowed_args_caching"


def side_inputs_per_element() -> contextlib.AbstractContextManager[None]:
    """Within: DoFn invokers built here read globally windowed side inputs per element.

    Beam's ``PerWindowInvoker`` reads the experiment when it is built and, without it,
    resolves such side inputs once for its life. The process's experiments are restored
    when the last thread leaves.
    """

    def apply() -> Callable[[], None]:
        before = RuntimeValueProvider.experiments
        RuntimeValueProvider.experiments = {*before, _RESOLVE_SIDE_INPUTS_PER_ELEMENT}

        def undo() -> None:
            RuntimeValueProvider.experiments = before

        return undo

    return _PER_ELEMENT.held(apply)


def shared_keys_per_task(task_key: Callable[[], str | None]) -> None:
    """Makes ``BatchElements``' shared keys the current task's ``task_key()`` (once per process).

    Beam keys the elements of a stateful ``BatchElements`` with a UUID per process, so one
    process batches its own elements. Spark runs a stage's tasks in whichever process of
    its worker pool is free, so the keys, and the batches, would follow that pool. Each
    bundle takes the key of its task instead; outside a task (None), the process's.
    Nothing changes for a class that is missing or has a ``start_bundle`` of its own.
    """
    for name in ("WithSharedKey", "WithLengthBucketKey"):
        keying = getattr(util, name, None)
        if keying is None or "start_bundle" in vars(keying):
            continue

        def start_bundle(self: Any) -> None:
            key = task_key()
            if key is not None:
                self.key = key

        start_bundle.__qualname__ = f"{name}.start_bundle"
        keying.start_bundle = start_bundle


_ArgsDefaults = tuple[list[str], list[Any]]
_SIGNATURES_CACHED = "_beam_spark_runner_cached"


def cache_function_signatures() -> None:
    """Makes Beam's ``get_function_args_defaults`` remember what it found per function.

    Beam inspects the signature of every method of a DoFn each time it builds a
    ``DoFnSignature`` (``get_dofn_specs`` walks ``dir(dofn)``, some 30 methods, twice per
    signature), and a worker builds a few signatures per step and run. Most of those
    methods are Beam's own, the same function objects in every run. The memo is
    exact: it holds plain functions only (not ``functools.wraps`` wrappers, not callables
    with a ``__signature__``), keyed by the function and whether it is bound, and a hit
    counts only while the function's code and defaults are the objects it was inspected
    with. Installed for the process's life (a worker's, on its first task); the driver
    has it within :func:`signature_memos`. So is the memo of ``get_dofn_specs`` per DoFn
    instance (:func:`remember_dofn_specs`).
    """
    from apache_beam.transforms import core

    remember_dofn_specs()
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


_MEMOS = _CountedPatch()


def signature_memos() -> contextlib.AbstractContextManager[None]:
    """Within: :func:`cache_function_signatures`' memos; Beam's own functions after.

    Counted across threads, so overlapping runs in one process share the memos and the
    last one out restores Beam's functions. A process that has the memos for its life (a
    worker) keeps them.
    """
    from apache_beam.transforms import core, userstate

    def apply() -> Callable[[], None]:
        replaced = [
            (module, name, getattr(module, name))
            for module, name in (
                (core, "get_function_args_defaults"),
                (userstate, "get_dofn_specs"),
            )
            if not getattr(getattr(module, name), _SIGNATURES_CACHED, False)
        ]
        cache_function_signatures()

        def undo() -> None:
            for module, name, function in replaced:
                setattr(module, name, function)

        return undo

    return _MEMOS.held(apply)


# How many DoFn instances' state and timer specs are remembered at once.
_DOFN_SPECS_KEPT = 1024


def remember_dofn_specs() -> None:
    """Makes Beam's ``get_dofn_specs`` remember what it found per DoFn instance.

    Beam walks ``dir(dofn)`` (some 30 methods) each time it asks whether a DoFn is
    stateful: twice per ``DoFnSignature``, and again when it translates a ``ParDo``, so the
    same instance is asked over and over, in the driver and per step and task in a worker.
    The walk reads the methods' defaults; so a hit counts only for
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


# How many (options class, command line) parses a memo keeps at once: a pipeline is built
# from one or a few command lines, each viewed as some 15 classes.
_REMEMBERED_PARSES = 256


def _flags_key(flags: Any) -> tuple[str, ...] | None:
    """The command line an options view parses, as a key; None if it is not a plain one."""
    if flags is None:  # argparse parses sys.argv then
        flags = sys.argv[1:]
    if not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
        return None
    return tuple(flags)


class OptionViews:
    """One pipeline's memo of ``PipelineOptions.view_as``: each options class parsed once.

    Beam's ``view_as(cls)`` builds an argument parser for ``cls`` and parses the options'
    flags again on every call, and constructing a short pipeline calls it some 130 times
    (``TypeOptions`` at every ``apply``). A view is its class, the options' flags and shared
    value store, and the parsed namespace, whose option names are all Beam reads of it
    (``_visible_option_list``): values are read from the store, where Beam's view puts each
    name's parsed value unless the store has that name already. The parse depends on the
    class, the flags and the defaults (some read the environment when the parser is built),
    so the memo keeps one per (class, flags) for one pipeline's construction, and builds
    later views without parsing: with a namespace of its own sharing the parse's values
    where the store has every name, and with a deep copy of them, put in the store as
    Beam's view would, where it lacks some (another options object, or a name taken out).
    It applies only to classes that keep ``PipelineOptions``' own ``__init__`` and
    ``__new__``, to flags that are a plain list of strings (or ``sys.argv``), and to parses
    whose values copy; otherwise Beam's method runs. Used through :func:`option_views`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (cls, flags) -> (option names, the parsed namespace, never handed out), latest last.
        self._parsed: collections.OrderedDict[
            tuple[type, tuple[str, ...]], tuple[list[str], Any]
        ] = collections.OrderedDict()

    def view_as(self, beams: Callable[[Any, Any], Any], options: Any, cls: Any) -> Any:
        """``options.view_as(cls)``, from the memo where exact, else by ``beams``."""
        from apache_beam.options import pipeline_options as po

        store, flags = options._all_options, options._flags
        key = _flags_key(flags)
        if (
            key is None
            or cls.__init__ is not po.PipelineOptions.__init__
            or cls.__new__ is not object.__new__
        ):
            return beams(options, cls)
        parsed = self._parsed
        with self._lock:
            hit = parsed.get((cls, key))
            if hit is not None:
                parsed.move_to_end((cls, key))
        if hit is None:
            view = beams(options, cls)
            try:
                kept = copy.deepcopy(view._visible_options)
            except Exception:  # noqa: BLE001 - an option value that does not copy: not remembered
                return view
            with self._lock:
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


class _ViewScopes(threading.local):
    """Per thread: the memos of the ``option_views`` blocks it is in, innermost last."""

    def __init__(self) -> None:
        self.memos: list[OptionViews] = []


_view_scopes = _ViewScopes()
_views_lock = threading.Lock()
# Threads inside an ``option_views`` block, and Beam's method while any is.
_views_entered = 0
_views_beams: Any = None


@contextlib.contextmanager
def option_views(memo: OptionViews) -> Iterator[None]:
    """``PipelineOptions.view_as`` served by ``memo`` in this thread, within the block.

    The class's method is replaced while any thread is in such a block (other threads keep
    Beam's behaviour: they have no memo) and restored when the last one leaves.
    """
    from apache_beam.options import pipeline_options as po

    global _views_entered, _views_beams
    with _views_lock:
        if _views_entered == 0:
            beams = po.PipelineOptions.__dict__["view_as"]
            _views_beams = beams

            def view_as(self: Any, cls: Any) -> Any:
                memos = _view_scopes.memos
                if not memos:
                    return beams(self, cls)
                return memos[-1].view_as(beams, self, cls)

            view_as.__wrapped__ = beams  # type: ignore[attr-defined]
            view_as.__doc__ = beams.__doc__
            po.PipelineOptions.view_as = view_as  # type: ignore[method-assign]
        _views_entered += 1
    _view_scopes.memos.append(memo)
    try:
        yield
    finally:
        _view_scopes.memos.pop()
        with _views_lock:
            _views_entered -= 1
            if _views_entered == 0:
                po.PipelineOptions.view_as = _views_beams  # type: ignore[method-assign]
                _views_beams = None
