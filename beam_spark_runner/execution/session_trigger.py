"""GroupByKey panes of session windows, without Beam's general trigger driver.

:class:`SessionsDriver` gives the same panes as Beam's ``GeneralTriggerDriver`` for Beam's
``Sessions`` under the default trigger, or ``AfterWatermark()`` with or without early
firings after a count (``AfterWatermark(early=AfterCount(n))``) and without late ones: the
same values in the same order, timestamps, pane infos, dropping of expired data and of
sessions whose trigger finished, and the same earliest hold for the output watermark. Per
session it keeps what Beam's ``MergeableStateAdapter`` would give it (:class:`SessionPanes`),
keyed by the session's bounds in microseconds rather than Beam's window objects, and merges
sessions as ``Sessions.merge`` does. ``tests/execution/test_session_trigger.py`` checks it
against Beam's driver on random micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.transforms import trigger
from apache_beam.transforms.window import Sessions, TimestampCombiner
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.default_trigger import (
    COMBINERS,
    DefaultTriggerDriver,
    DefaultTriggerState,
    window_of,
)

Bounds = tuple[int, int]  # a session's start and end, micros

_micros = bi.micros_of_timestamp


@dataclasses.dataclass
class SessionPanes:
    """One session of one key: what Beam's driver keeps under the session's ids.

    On a merge, as in Beam's adapter: values keep Beam's read order (a bucket per id, the merge
    result's first, then the merged windows' by start; new values go to the first); pane
    counters are the merge result's alone; holds and ``AfterCount``'s count combine; the
    end-of-window timer is cleared (``_merge``); a finished trigger (``AfterWatermark`` without
    a late trigger, after its on-time pane) drops the input of any session merged with it.
    """

    buckets: list[list[Any]] = dataclasses.field(default_factory=lambda: [[]])  # ELEMENTS
    holds: list[int] = dataclasses.field(default_factory=list)  # WATERMARK_HOLD, micros
    fired: int = 0  # INDEX: panes emitted since the session last merged
    nonspeculative: int = 0  # NONSPECULATIVE_INDEX
    timer: bool = False  # the watermark timer at the session's end is set
    count: int = 0  # AfterCount's elements since its last early pane
    finished: bool = False  # TOMBSTONE: the trigger is done with the session


class SessionTriggerState(DefaultTriggerState):
    """A key's sessions (bounds -> :class:`SessionPanes`), in the order Beam's ids have them."""


@dataclasses.dataclass(frozen=True)
class SessionTrigger:
    """The triggers the driver takes: the default one, or ``AfterWatermark(early=...)``."""

    finishes: bool  # AfterWatermark without a late trigger: the on-time pane is the last
    early_count: int | None  # AfterWatermark(early=AfterCount(n)): n


def session_trigger(trigger_fn: Any) -> SessionTrigger | None:
    """What :class:`SessionsDriver` needs of ``trigger_fn``; None if it does not take it."""
    if trigger_fn == trigger.DefaultTrigger():
        return SessionTrigger(finishes=False, early_count=None)
    if type(trigger_fn) is not trigger.AfterWatermark or trigger_fn.late is not None:
        return None
    early = trigger_fn.early
    if early is None:
        return SessionTrigger(finishes=True, early_count=None)
    # AfterWatermark wraps its early trigger in Repeatedly.
    if type(early) is trigger.Repeatedly and type(early.underlying) is trigger.AfterCount:
        return SessionTrigger(finishes=True, early_count=int(early.underlying.count))
    return None


def applies(windowing: Any) -> bool:
    """Whether :class:`SessionsDriver` can stand in for Beam's driver here."""
    combiner = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
    return bool(
        type(windowing.windowfn) is Sessions
        and session_trigger(windowing.triggerfn) is not None
        and type(combiner) in COMBINERS
    )


def _merge(state: SessionTriggerState, new: Iterable[Bounds]) -> dict[Bounds, Bounds]:
    """Merges the new windows into the key's sessions; returns where each merged one went.

    As Beam's ``Sessions.merge`` through the driver's merge context: the windows sorted by
    start, each run of overlapping ones merged into one from its first start to its last
    end. For each run, as ``MergeableStateAdapter.merge``: the result keeps its own state
    (when it is a known window) and takes over the buckets, holds, counts and tombstones
    of the known windows merged into it, whose pane counters are dropped (cleared by Beam
    before the merge). The trigger's ``on_merge`` then clears timers: the default trigger
    those of every window in the run, ``AfterWatermark`` the result's when a window in the
    run ends before it. Here a merge clears the result's timer either way: which timers a
    merge keeps never shows, as every run holds a new window (known ones do not overlap),
    whose input then sets the result's timer, or is dropped, the result having finished.
    Among windows with the same start, the order Beam's sort leaves them in does not show:
    only known windows have state, and no two of them share a start.
    """
    merged_away: dict[Bounds, Bounds] = {}
    # Sorted as tuples: by start, then end. Beam sorts by start alone; among windows with
    # the same start the order does not show (above).
    windows = sorted({*state, *new})
    count = len(windows)
    i = 0
    while i < count:
        start, end = windows[i]
        j = i + 1
        while j < count and windows[j][0] < end:
            if windows[j][1] > end:
                end = windows[j][1]
            j += 1
        if j - i > 1:
            _merge_run(state, windows[i:j], (start, end), merged_away)
        i = j
    return merged_away


def _merge_run(
    state: SessionTriggerState,
    run: list[Bounds],
    result: Bounds,
    merged_away: dict[Bounds, Bounds],
) -> None:
    """One run of overlapping windows into ``result`` (see ``_merge``)."""
    target = state.get(result)
    for window in run:
        if window == result:
            continue
        merged_away[window] = result
        moved = state.pop(window, None)
        if moved is None:
            continue  # a new window: no state yet
        if target is None:
            target = state[result] = SessionPanes(buckets=[])
        target.buckets.extend(moved.buckets)
        target.holds.extend(moved.holds)
        target.count += moved.count
        target.finished = target.finished or moved.finished
    if target is not None:
        target.timer = False


class SessionsDriver(DefaultTriggerDriver):
    """Beam's ``GeneralTriggerDriver`` over ``Sessions`` for the triggers ``applies`` takes."""

    def __init__(self, windowing: Any) -> None:
        super().__init__(windowing)
        kind = session_trigger(windowing.triggerfn)
        assert kind is not None, "SessionsDriver under a trigger it does not take"
        self.trigger = kind

    def new_state(self) -> SessionTriggerState:
        return SessionTriggerState()

    def process_elements(  # type: ignore[override]
        self,
        state: SessionTriggerState,
        windowed_values: Iterable[WindowedValue],
        output_watermark: Timestamp,
        input_watermark: Timestamp,
    ) -> Iterator[WindowedValue]:
        """New elements of one key; yields the panes that fire at once (late data)."""
        input_micros = _micros(input_watermark)
        # A window ending before this is expired: Beam drops its input as late.
        cut = input_micros - self.allowed_lateness.micros
        bounds = bi.interval_bounds
        by_window: dict[Bounds, list[WindowedValue]] = {}
        for wv in windowed_values:
            for window in wv.windows:
                key = bounds(window)
                if key[1] >= cut:
                    by_window.setdefault(key, []).append(wv)
        if not by_window.keys() <= state.keys():
            merged_away = _merge(state, by_window)
            if merged_away:
                merged: dict[Bounds, list[WindowedValue]] = {}
                get = merged_away.get
                for key, elements in by_window.items():
                    merged.setdefault(get(key, key), []).extend(elements)
                by_window = merged
        floor = _micros(output_watermark)
        early_count = self.trigger.early_count
        for key, elements in by_window.items():
            panes = state.get(key)
            if panes is None:
                panes = state[key] = SessionPanes()
            elif panes.finished:
                continue  # Beam's tombstone: the input is dropped
            hold = self._output_time(key[1] - 1, elements, floor)
            if hold is not None:
                panes.holds.append(hold)
            panes.buckets[0].extend([wv.value for wv in elements])
            panes.timer = True
            if early_count is not None:
                panes.count += len(elements)
            if input_micros >= key[1]:
                panes.timer = False
                yield self._fire(key, panes, output_watermark, on_time=False)
            elif early_count is not None and panes.count >= early_count:
                panes.count = 0  # Repeatedly resets AfterCount
                yield self._output(window_of(key), panes, output_watermark, on_time=False)

    def _fire(
        self, key: Bounds, panes: SessionPanes, output_watermark: Timestamp, on_time: bool
    ) -> WindowedValue:
        """The pane of the watermark passing the session's end (on time, or late data)."""
        finished = self.trigger.finishes
        pane = self._output(window_of(key), panes, output_watermark, on_time, finished)
        panes.finished = finished
        return pane

    def process_entire_key(self, windowed_values: Iterable[WindowedValue]) -> list[WindowedValue]:
        """A key's panes in batch, as Beam's ``TriggerDriver.process_entire_key`` gives them.

        Every element at once (both watermarks at their minimum), then every timer: Beam
        fires them in the order its state holds them, the order the sessions first got
        one, which for one call on a new state is the order of the state's sessions.
        """
        state = self.new_state()
        panes = list(self.process_elements(state, windowed_values, MIN_TIMESTAMP, MIN_TIMESTAMP))
        for key, session in state.items():
            if session.timer:
                session.timer = False
                if not session.finished:
                    panes.append(self._fire(key, session, window_of(key).end, on_time=True))
        return panes

    def _take_values(self, panes: Any, finished: bool = False) -> list[Any]:
        values = [value for bucket in panes.buckets for value in bucket]
        if self.discarding or finished:
            panes.buckets = [[]]
        return values

    def fire_timers(self, state: DefaultTriggerState, watermark: Timestamp) -> Iterator[Any]:
        """The panes of sessions whose end the watermark reached, in end order."""
        at = _micros(watermark)
        due = [key for key, panes in state.items() if panes.timer and key[1] <= at]
        if not due:
            return iter(())  # most keys, most micro-batches: no generator made
        return self._fire_due(state, sorted(due, key=lambda w: w[1]))

    def _fire_due(self, state: DefaultTriggerState, due: list[Bounds]) -> Iterator[Any]:
        for key in due:
            panes = state[key]
            panes.timer = False
            if not panes.finished:
                yield self._fire(key, panes, window_of(key).end, on_time=True)

    @staticmethod
    def _end(window: Bounds) -> int:  # type: ignore[override]
        return window[1]


def plain_sessions(state: SessionTriggerState) -> list[tuple[Any, ...]]:
    """A key's sessions as plain values for its state-store blob."""
    return [
        (
            key,
            panes.buckets,
            panes.holds,
            panes.fired,
            panes.nonspeculative,
            panes.timer,
            panes.count,
            panes.finished,
        )
        for key, panes in state.items()
    ]


def restored_sessions(plain: list[tuple[Any, ...]]) -> SessionTriggerState:
    """The state :func:`plain_sessions` gave."""
    state = SessionTriggerState()
    for key, *fields in plain:
        state[tuple(key)] = SessionPanes(*fields)
    return state
