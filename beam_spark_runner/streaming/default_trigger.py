"""GroupByKey panes under Beam's default trigger, without Beam's general trigger driver.

Most streaming GroupByKeys (and the lifted combines over them) run under the default
trigger: one pane per window when the watermark passes its end, and one per late element
within the allowed lateness. Beam's ``GeneralTriggerDriver`` handles every trigger and
every window function; per element and window it goes through a merging-state adapter
(even for windows that never merge) that builds a combine function class per state read.
Profiled on Nexmark q5 in streaming, that was nearly half of the workers' Python time.

:class:`DefaultTriggerDriver` produces the same panes for the default trigger over
non-merging windows: the same values in the same order, timestamps (the timestamp
combiner's watermark holds), pane infos (index, on-time / late / early, first) and
dropping of expired data, and the same earliest hold for the output watermark; it is
checked against Beam's driver on random micro-batches (``tests/test_default_trigger.py``).
Per window it keeps the buffered values, the holds, the two pane counters and whether the
end-of-window timer is set: plain values, pickled as they are in the shard's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from apache_beam.transforms import trigger
from apache_beam.transforms.window import IntervalWindow, NonMergingWindowFn, TimestampCombiner
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, TIME_GRANULARITY, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue


@dataclasses.dataclass
class WindowPanes:
    """One window of one key: what Beam's driver keeps under the window's state tags."""

    values: list[Any] = dataclasses.field(default_factory=list)  # ELEMENTS
    holds: list[int] = dataclasses.field(default_factory=list)  # WATERMARK_HOLD, micros
    fired: int = 0  # INDEX: panes emitted
    nonspeculative: int = 0  # NONSPECULATIVE_INDEX: on-time and late panes emitted
    timer: bool = False  # the watermark timer at the window's end is set


class DefaultTriggerState(dict):  # type: ignore[type-arg]
    """A key's windows (window -> :class:`WindowPanes`), in the order they first came."""


def applies(windowing: Any) -> bool:
    """Whether :class:`DefaultTriggerDriver` can stand in for Beam's driver here."""
    return bool(
        windowing.triggerfn == trigger.DefaultTrigger()
        and isinstance(windowing.windowfn, NonMergingWindowFn)
    )


class DefaultTriggerDriver:
    """Beam's ``GeneralTriggerDriver`` for the default trigger over non-merging windows."""

    def __init__(self, windowing: Any) -> None:
        self.allowed_lateness = windowing.allowed_lateness
        self.combiner = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
        self.discarding = windowing.accumulation_mode == trigger.AccumulationMode.DISCARDING

    def process_elements(
        self,
        state: DefaultTriggerState,
        windowed_values: Iterable[WindowedValue],
        output_watermark: Timestamp,
        input_watermark: Timestamp,
    ) -> Iterator[WindowedValue]:
        """New elements of one key; yields the panes that fire at once (late data)."""
        by_window: dict[Any, list[tuple[Any, Timestamp]]] = {}
        for wv in windowed_values:
            for window in wv.windows:
                if input_watermark > window.end + self.allowed_lateness:
                    continue  # expired: Beam drops it
                by_window.setdefault(window, []).append((wv.value, wv.timestamp))
        for window, elements in by_window.items():
            panes = state.get(window)
            if panes is None:
                panes = state[window] = WindowPanes()
            output_time = self.combiner.merge(
                window,
                (
                    t
                    for t in (self.combiner.assign_output_time(window, ts) for _, ts in elements)
                    if t >= output_watermark
                ),
            )
            if output_time is not None:
                panes.holds.append(output_time.micros)
            panes.values.extend(value for value, _ in elements)
            panes.timer = True
            if input_watermark >= window.end:
                panes.timer = False
                yield self._output(window, panes, output_watermark, on_time=False)

    def fire_timers(self, state: DefaultTriggerState, watermark: Timestamp) -> Iterator[Any]:
        """The panes of windows whose end the watermark reached, in end order."""
        due = [w for w, panes in state.items() if panes.timer and w.end <= watermark]
        for window in sorted(due, key=lambda w: w.end):
            panes = state[window]
            panes.timer = False
            yield self._output(window, panes, window.end, on_time=True)

    def _output(
        self, window: Any, panes: WindowPanes, output_watermark: Timestamp, on_time: bool
    ) -> WindowedValue:
        index = panes.fired
        panes.fired += 1
        if output_watermark <= window.max_timestamp():
            nonspeculative = -1
            timing = PaneInfoTiming.EARLY
            if panes.nonspeculative:
                nonspeculative = panes.nonspeculative
                panes.nonspeculative += 1
        else:
            nonspeculative = panes.nonspeculative
            panes.nonspeculative += 1
            timing = (
                PaneInfoTiming.ON_TIME if on_time and nonspeculative == 0 else PaneInfoTiming.LATE
            )
        pane_info = PaneInfo(index == 0, False, timing, index, nonspeculative)
        values = list(panes.values)
        if self.discarding:
            panes.values = []
        timestamp = self.combiner.combine_all([Timestamp(micros=h) for h in panes.holds])
        if timestamp is None:
            timestamp = window.max_timestamp()
        elif not output_watermark < window.end:  # the default trigger has an on-time pane
            panes.holds = []
        return WindowedValue(values, timestamp, (window,), pane_info)

    @staticmethod
    def forget_expired(state: DefaultTriggerState, expired: Callable[[Any], bool]) -> None:
        """Drops the windows ``expired`` says are done and that wait for no timer."""
        for window in [w for w, panes in state.items() if expired(w) and not panes.timer]:
            del state[window]

    @staticmethod
    def next_visit(state: DefaultTriggerState, allowed_lateness: int) -> int:
        """The input watermark (micros) at which the key next has work.

        That is a window's end-of-window timer to fire, or a window past its end plus
        ``allowed_lateness`` to forget.
        """
        return min(
            (
                window.end.micros if panes.timer else window.end.micros + allowed_lateness + 1
                for window, panes in state.items()
            ),
            default=MIN_TIMESTAMP.micros,
        )

    @staticmethod
    def earliest_hold(state: DefaultTriggerState) -> Timestamp:
        """As Beam's ``InMemoryUnmergedState.get_earliest_hold``."""
        holds = [min(panes.holds) for panes in state.values() if panes.holds]
        return Timestamp(micros=min(holds)) - TIME_GRANULARITY if holds else MAX_TIMESTAMP


# Windows rebuilt from their bounds, shared by every key that decodes them (bounded: the
# windows of a stream move on).
_WINDOWS: dict[tuple[int, int], IntervalWindow] = {}
_MAX_WINDOWS = 4096


def plain_state(state: DefaultTriggerState) -> list[tuple[Any, ...]]:
    """A key's windows as plain values for its state-store blob.

    An ``IntervalWindow`` becomes its bounds (micros); other windows stay as they are.
    """
    return [
        (
            (window.start.micros, window.end.micros) if type(window) is IntervalWindow else window,
            panes.values,
            panes.holds,
            panes.fired,
            panes.nonspeculative,
            panes.timer,
        )
        for window, panes in state.items()
    ]


def restored_state(plain: list[tuple[Any, ...]]) -> DefaultTriggerState:
    """The state :func:`plain_state` gave, with one window object per window."""
    state = DefaultTriggerState()
    for token, values, holds, fired, nonspeculative, timer in plain:
        if type(token) is tuple:
            window = _WINDOWS.get(token)
            if window is None:
                if len(_WINDOWS) >= _MAX_WINDOWS:
                    _WINDOWS.clear()
                start, end = token
                window = _WINDOWS[token] = IntervalWindow(
                    Timestamp(micros=start), Timestamp(micros=end)
                )
        else:
            window = token
        state[window] = WindowPanes(values, holds, fired, nonspeculative, timer)
    return state


def upgraded_state(state: DefaultTriggerState) -> DefaultTriggerState:
    """A state pickled whole by an earlier runner version, whose holds were ``Timestamp``s."""
    for panes in state.values():
        panes.holds = [h.micros if isinstance(h, Timestamp) else h for h in panes.holds]
    return state
