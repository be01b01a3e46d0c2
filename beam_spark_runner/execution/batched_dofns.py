"""The runner's own DoFns for the batched path, and its window assignment from a cache.

What the bundle processor builds for ``WindowInto``, a Flatten, ``KeyWithVoid`` and a lifted
combine's merge and extract phases, as DoFns the batched steps (``execution.batched_steps``)
run; its precombine is ``execution.batched_precombine``'s.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.portability.api import (
    beam_runner_api_pb2,
)
from apache_beam.transforms import core, window
from apache_beam.transforms.combiners import PhasedCombineFnExecutor
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

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
    # The last timestamp's windows: a source stamps runs of elements alike.
    last: list[Any] = [None, ()]

    def windows(micros: int) -> list[Any]:
        if micros == last[0]:
            return list(last[1])
        at = key(micros)
        found = cache.get(at)
        if found is None:
            if len(cache) >= _ASSIGNED_CACHED:
                cache.clear()
            found = cache[at] = tuple(assign(context(Timestamp(micros=micros))))
        last[0], last[1] = micros, found
        return list(found)

    return windows
