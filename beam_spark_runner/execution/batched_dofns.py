"""The runner's own DoFns for the batched path, and its window assignment from a cache.

What the bundle processor builds for ``WindowInto``, a Flatten, ``KeyWithVoid`` and a lifted
combine's phases, as DoFns the batched steps (``execution.batched_steps``) run.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.portability.api import (
    beam_runner_api_pb2,
)
from apache_beam.transforms import combiners, core, window
from apache_beam.transforms.combiners import PhasedCombineFnExecutor
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from apache_beam.utils.windowed_value import create as create_windowed_value

from beam_spark_runner import beam_internals as bi


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

    Constructing the ``Map`` runs Beam's type hints and DoFn checks: once, not per set-up.
    """
    return core.Map(_key_with_none).fn


def combine_phase_dofn(urn: str, payload: bytes, context: Any) -> Any:
    """The DoFn the batched path runs for a lifted combine's merge or extract phase.

    It is Beam's ``CombineOperation`` (what the bundle processor builds for these URNs):
    each ``(key, accumulators)`` becomes ``(key, merge_accumulators(accumulators))``, or
    ``(key, accumulator)`` becomes ``(key, extract_output(accumulator))``, with the input's
    timestamp, windows and pane, through Beam's ``PhasedCombineFnExecutor``; the CombineFn
    is set up and torn down with the step. The batched path calls ``apply_kv`` per element
    (``runner_combine_phase``).
    """
    combine_payload = beam_runner_api_pb2.CombinePayload.FromString(payload)
    executor = PhasedCombineFnExecutor(
        bi.COMBINE_PHASE_URNS[urn],
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
    combine_payload = beam_runner_api_pb2.CombinePayload.FromString(payload)
    combine_fn = core.CombineFn.from_runner_api(combine_payload.combine_fn, context)
    timestamp_combiner = (
        None
        if windowing.timestamp_combiner == window.TimestampCombiner.OUTPUT_AT_EOW
        else window.TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
    )
    # As Beam's operation checks.
    small = isinstance(combine_fn, (combiners.CountCombineFn, combiners.MeanCombineFn)) or (
        bi.callable_combine_fn_function(combine_fn) in (min, max, sum)
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
        """Adds a chunk of windowed ``(key, value)``s; returns what a flush output.

        Neighbours of one (window, key) go to the CombineFn's ``add_inputs`` together, in
        their order: Beam defines it as ``add_input`` over each, and a CombineFn may add a
        run faster (a wrapped ``max`` extends its buffer once, not per element). A run of
        one goes to ``add_input``, as Beam's operation adds every element.
        """
        table = self.table
        add_input, add_inputs = self._combine_fn.add_input, self._combine_fn.add_inputs
        new_entry = self._new_entry
        flushed: list[Any] = []
        # The (window, key)'s entry the run adds to, and its key.
        entry: list[Any] | None = None
        current: Any = None
        run: list[Any] = []
        if self._default_windowing:
            for windowed_value in values:
                key, value = windowed_value.value
                if entry is None or not _same_key(key, current):
                    if run:
                        entry[0] = (  # type: ignore[index]
                            add_input(entry[0], run[0])  # type: ignore[index]
                            if len(run) == 1
                            else add_inputs(entry[0], run)  # type: ignore[index]
                        )
                        run = []
                    current = key
                    entry = table.get(key) or new_entry(key, None, None, flushed)
                run.append(value)
            if run:
                entry[0] = (  # type: ignore[index]
                    add_input(entry[0], run[0])  # type: ignore[index]
                    if len(run) == 1
                    else add_inputs(entry[0], run)  # type: ignore[index]
                )
            return flushed
        timestamp_combiner = self._timestamp_combiner
        interval_window, bounds = window.IntervalWindow, bi.interval_bounds
        # The run's window and key objects: the next element's, mostly (windows come from
        # a cache), which needs neither its window's bounds nor a comparison.
        last_window: Any = None
        last_key: Any = None
        for windowed_value in values:
            key, value = windowed_value.value
            timestamp = windowed_value.timestamp if timestamp_combiner else None
            for window_ in windowed_value.windows:
                if entry is None or window_ is not last_window or key is not last_key:
                    at = bounds(window_) if type(window_) is interval_window else window_
                    if entry is None or not (
                        _same_key(at, current[0]) and _same_key(key, current[1])
                    ):
                        if run:
                            # A run of one (sliding windows' usual) as Beam adds it.
                            entry[0] = (  # type: ignore[index]
                                add_input(entry[0], run[0])  # type: ignore[index]
                                if len(run) == 1
                                else add_inputs(entry[0], run)  # type: ignore[index]
                            )
                            run = []
                        current = (at, key)
                        entry = table.get(current) or new_entry(
                            current, timestamp, window_, flushed
                        )
                    last_window, last_key = window_, key
                run.append(value)
                if timestamp_combiner:
                    entry[1] = timestamp_combiner.combine(entry[1], timestamp)  # type: ignore[index]
        if run:
            entry[0] = (  # type: ignore[index]
                add_input(entry[0], run[0])  # type: ignore[index]
                if len(run) == 1
                else add_inputs(entry[0], run)  # type: ignore[index]
            )
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


def _same_key(key: Any, other: Any) -> bool:
    """Whether a dict surely holds the two as one key: the same object, or equal, one type.

    Keys that fail this merely start another run, which finds its entry in the table.
    """
    return key is other or (type(key) is type(other) and key == other)


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


def only_window(window_fn: Any) -> Any:
    """The one window ``window_fn`` assigns at every timestamp (``GlobalWindows``'), else None.

    Exactly Beam's ``GlobalWindows``: what its ``assign`` gives depends on nothing.
    """
    if type(window_fn) is not window.GlobalWindows:
        return None
    assigned = tuple(window_fn.assign(window.WindowFn.AssignContext(MIN_TIMESTAMP)))
    return assigned[0] if len(assigned) == 1 else None


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
