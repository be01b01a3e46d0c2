"""GroupByKey panes of session windows under Beam's default trigger, without Beam's driver.

Beam's ``GeneralTriggerDriver`` merges windows through its ``MergeableStateAdapter``: each
window's state lives under ids, a merged window takes over the ids of the windows merged
into it, and every read combines over them. Per element and window that costs a
merging-state read or write (a combine-function class built per read), which is why session
windows were the slowest GroupByKeys of a streaming run.

:class:`SessionsDriver` gives the same panes for Beam's ``Sessions`` under the default
trigger (the same values in the same order, timestamps, pane infos, dropping of expired
data, and the same earliest hold for the output watermark), checked against Beam's driver on
random micro-batches (``tests/test_session_trigger.py``). What it keeps per session is what
Beam's adapter gives it:

* the values in the order Beam reads them: a bucket per id, in the merged window's id
  order (the merge result's own first, then those of the windows merged into it, by
  start), new values into the first bucket;
* the pane counters of the merge result alone (Beam clears those of the windows merged
  away: pane infos do not carry across a merge);
* the holds of every window merged into it, combined for the pane's timestamp, the earliest
  of them holding the output watermark;
* whether the end-of-window timer is set: an element sets it, a merge clears it (the
  trigger's ``on_merge``), and so does its firing.

It works in microseconds: sessions are keyed by their bounds, and merged as Beam's
``Sessions.merge`` merges them (sorted by start, each run of overlapping windows into one
from the first start to the last end). Hashing or comparing Beam's window objects reads
``Timestamp`` properties, which made that most of the time a merge took.
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
from beam_spark_runner.streaming.default_trigger import (
    COMBINERS,
    DefaultTriggerDriver,
    DefaultTriggerState,
    window_of,
)

Bounds = tuple[int, int]  # a session's start and end, micros


@dataclasses.dataclass
class SessionPanes:
    """One session of one key: what Beam's driver keeps under the session's ids."""

    buckets: list[list[Any]] = dataclasses.field(default_factory=lambda: [[]])  # ELEMENTS
    holds: list[int] = dataclasses.field(default_factory=list)  # WATERMARK_HOLD, micros
    fired: int = 0  # INDEX: panes emitted since the session last merged
    nonspeculative: int = 0  # NONSPECULATIVE_INDEX
    timer: bool = False  # the watermark timer at the session's end is set


class SessionTriggerState(DefaultTriggerState):
    """A key's sessions (bounds -> :class:`SessionPanes`), in the order Beam's ids have them."""


def applies(windowing: Any) -> bool:
    """Whether :class:`SessionsDriver` can stand in for Beam's driver here."""
    combiner = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
    return bool(
        windowing.triggerfn == trigger.DefaultTrigger()
        and type(windowing.windowfn) is Sessions
        and type(combiner) in COMBINERS
    )


def _merge(state: SessionTriggerState, new: Iterable[Bounds]) -> dict[Bounds, Bounds]:
    """Merges the new windows into the key's sessions; returns where each merged one went.

    As Beam's ``Sessions.merge`` through the driver's merge context: the windows sorted by
    start, each run of overlapping ones merged into one from its first start to its last
    end. For each run, as ``MergeableStateAdapter.merge``: the result keeps its own state
    (when it is a known window) and takes over the buckets and holds of the known windows
    merged into it, whose pane counters are dropped (cleared by Beam before the merge).
    The default trigger's ``on_merge`` clears the timers of every window in the run.
    Among windows with the same start, the order Beam's sort leaves them in does not show:
    only known windows have state, and no two of them share a start.
    """
    merged_away: dict[Bounds, Bounds] = {}

    def merge(run: list[Bounds], result: Bounds) -> None:
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
        if target is not None:
            target.timer = False

    run: list[Bounds] = []
    end = 0
    for window in sorted({*state, *new}, key=lambda w: w[0]):
        if run and end > window[0]:
            run.append(window)
            end = max(end, window[1])
            continue
        if len(run) > 1:
            merge(run, (run[0][0], end))
        run, end = [window], window[1]
    if len(run) > 1:
        merge(run, (run[0][0], end))
    return merged_away


class SessionsDriver(DefaultTriggerDriver):
    """Beam's ``GeneralTriggerDriver`` for the default trigger over ``Sessions``."""

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
        input_micros = input_watermark.micros
        lateness = self.allowed_lateness.micros
        bounds = bi.interval_bounds
        by_window: dict[Bounds, list[WindowedValue]] = {}
        for wv in windowed_values:
            for window in wv.windows:
                key = bounds(window)
                if input_micros > key[1] + lateness:
                    continue  # expired: Beam drops it
                elements = by_window.get(key)
                if elements is None:
                    by_window[key] = [wv]
                else:
                    elements.append(wv)
        if not by_window.keys() <= state.keys():
            merged_away = _merge(state, by_window)
            if merged_away:
                merged: dict[Bounds, list[WindowedValue]] = {}
                for key, elements in by_window.items():
                    merged.setdefault(merged_away.get(key, key), []).extend(elements)
                by_window = merged
        floor = output_watermark.micros
        for key, elements in by_window.items():
            panes = state.get(key)
            if panes is None:
                panes = state[key] = SessionPanes()
            hold = self._hold(key, elements, floor)
            if hold is not None:
                panes.holds.append(hold)
            panes.buckets[0].extend([wv.value for wv in elements])
            panes.timer = True
            if input_micros >= key[1]:
                panes.timer = False
                yield self._output(window_of(key), panes, output_watermark, on_time=False)

    def _hold(self, key: Bounds, elements: list[WindowedValue], floor: int) -> int | None:
        """As ``DefaultTriggerDriver._output_time``, for the session ``key``."""
        if self.kind == "end":
            return key[1] - 1  # the window's max_timestamp
        times = [t for t in (wv.timestamp_micros for wv in elements) if t >= floor]
        if not times:
            return None
        return min(times) if self.kind == "earliest" else max(times)

    def _take_values(self, panes: Any) -> list[Any]:
        values = [value for bucket in panes.buckets for value in bucket]
        if self.discarding:
            panes.buckets = [[]]
        return values

    def fire_timers(self, state: DefaultTriggerState, watermark: Timestamp) -> Iterator[Any]:
        """The panes of sessions whose end the watermark reached, in end order."""
        at = watermark.micros
        due = [key for key, panes in state.items() if panes.timer and key[1] <= at]
        for key in sorted(due, key=lambda w: w[1]):
            panes = state[key]
            panes.timer = False
            window = window_of(key)
            yield self._output(window, panes, window.end, on_time=True)

    @staticmethod
    def forget_expired(state: DefaultTriggerState, watermark: int, lateness: int) -> None:
        for key in [k for k, panes in state.items() if k[1] + lateness < watermark]:
            if not state[key].timer:
                del state[key]

    @staticmethod
    def next_visit(state: DefaultTriggerState, allowed_lateness: int) -> int:
        return min(
            (
                key[1] if panes.timer else key[1] + allowed_lateness + 1
                for key, panes in state.items()
            ),
            default=MIN_TIMESTAMP.micros,
        )


def plain_sessions(state: SessionTriggerState) -> list[tuple[Any, ...]]:
    """A key's sessions as plain values for its state-store blob."""
    return [
        (key, panes.buckets, panes.holds, panes.fired, panes.nonspeculative, panes.timer)
        for key, panes in state.items()
    ]


def restored_sessions(plain: list[tuple[Any, ...]]) -> SessionTriggerState:
    """The state :func:`plain_sessions` gave."""
    state = SessionTriggerState()
    for key, buckets, holds, fired, nonspeculative, timer in plain:
        state[tuple(key)] = SessionPanes(buckets, holds, fired, nonspeculative, timer)
    return state
