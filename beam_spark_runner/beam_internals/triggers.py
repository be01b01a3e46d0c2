"""Beam's streaming trigger driver and its in-memory state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apache_beam.transforms import trigger

from beam_spark_runner.beam_internals import patches


def create_trigger_driver(windowing: Any, clock: Any) -> Any:
    """Beam's streaming trigger driver for ``windowing``, tags' combiners cached.

    Over merging windows Beam's driver keeps combining state (``AfterCount``'s count, for
    one) through ``MergeableStateAdapter``, which calls ``without_extraction`` on the tag
    at every read and write; that defines a new ``CombineFn`` class (cyclic garbage) each
    call. :func:`~.patches.cache_tags_without_extraction` makes it one tag per tag and combiner.
    """
    patches.cache_tags_without_extraction()
    return trigger.create_trigger_driver(windowing, clock=clock)


def trigger_state() -> Any:
    """A fresh state for Beam's streaming trigger driver (``InMemoryUnmergedState``)."""
    return trigger.InMemoryUnmergedState()


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
    timestamp in it, waits for the cyclic collector after it is dropped. Emptied, it is freed
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
