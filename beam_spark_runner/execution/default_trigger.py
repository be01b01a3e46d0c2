"""GroupByKey panes under Beam's default trigger, without Beam's general trigger driver.

Beam's ``GeneralTriggerDriver`` goes through a merging-state adapter per element and window,
even for windows that never merge. :class:`DefaultTriggerDriver` produces the same panes for
the default trigger over non-merging windows: the same values in the same order,
timestamps, pane infos and dropping of expired data, and the same earliest hold for the
output watermark; ``tests/execution/test_default_trigger.py`` checks it against Beam's
driver on random micro-batches. Per window it keeps the buffered values, holds, the two
pane counters and the end-of-window timer: plain values, pickled as they are in the shard's
state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.transforms import trigger
from apache_beam.transforms.timeutil import (
    OutputAtEarliestInputTimestampImpl,
    OutputAtEndOfWindowImpl,
    OutputAtLatestInputTimestampImpl,
)
from apache_beam.transforms.window import IntervalWindow, NonMergingWindowFn, TimestampCombiner
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, TIME_GRANULARITY, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_spark_runner import beam_internals as bi

_GRANULARITY = TIME_GRANULARITY.micros
_MAX_MICROS = MAX_TIMESTAMP.micros
# A window's first pane, on time (``_output``'s), one object for all.
_FIRST_ON_TIME = PaneInfo(True, False, PaneInfoTiming.ON_TIME, 0, 0)


@dataclasses.dataclass
class WindowPanes:
    """One window of one key: what Beam's driver keeps under the window's state tags."""

    values: list[Any] = dataclasses.field(default_factory=list)  # ELEMENTS
    # WATERMARK_HOLD (micros): the earliest and the latest of the holds Beam's driver keeps
    # (``add_hold``), all its pane timestamp and its watermark hold read.
    holds: list[int] = dataclasses.field(default_factory=list)
    fired: int = 0  # INDEX: panes emitted
    nonspeculative: int = 0  # NONSPECULATIVE_INDEX: on-time and late panes emitted
    timer: bool = False  # the watermark timer at the window's end is set


def end_of(window: Any) -> int:
    """A window's end (micros), as the state keys it."""
    if type(window) is IntervalWindow:
        return bi.interval_bounds(window)[1]
    return int(window.end.micros)


def add_hold(holds: list[int], hold: int) -> None:
    """Adds a hold to a window's: ``holds`` keeps the earliest and the latest, once each.

    Beam's driver keeps every hold it adds (one per bundle of elements per window), and
    reads their minimum (the watermark hold, and the earliest combiner's timestamp) or
    their maximum (the latest combiner's); a window kept over many micro-batches held one
    per batch in its key's state, rewritten every batch.
    """
    if not holds:
        holds.append(hold)
    elif len(holds) == 2 and holds[0] <= hold <= holds[1]:
        return
    else:  # one hold, or a list an earlier runner version kept whole
        low, high = min(min(holds), hold), max(max(holds), hold)
        holds[:] = [low] if low == high else [low, high]


class DefaultTriggerState(dict):  # type: ignore[type-arg]
    """A key's windows (window -> :class:`WindowPanes`), in the order they first came."""


# Beam's timestamp combiners the driver works out itself (the ones a portable pipeline can
# have: the runner API has no enum value for the earliest transformed timestamp).
COMBINERS = {
    OutputAtEndOfWindowImpl: "end",
    OutputAtEarliestInputTimestampImpl: "earliest",
    OutputAtLatestInputTimestampImpl: "latest",
}


def applies(windowing: Any) -> bool:
    """Whether :class:`DefaultTriggerDriver` can stand in for Beam's driver here."""
    combiner = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
    return bool(
        windowing.triggerfn == trigger.DefaultTrigger()
        and isinstance(windowing.windowfn, NonMergingWindowFn)
        and type(combiner) in COMBINERS
    )


class DefaultTriggerDriver:
    """Beam's ``GeneralTriggerDriver`` for the default trigger over non-merging windows."""

    # The trigger has an on-time pane: a pane before the window's end keeps its holds.
    ontime_pane = True

    def __init__(self, windowing: Any) -> None:
        self.allowed_lateness = windowing.allowed_lateness
        combiner = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
        self.discarding = windowing.accumulation_mode == trigger.AccumulationMode.DISCARDING
        # The timestamp combiner, worked out in microseconds (``applies`` admits these).
        self.kind = COMBINERS[type(combiner)]

    def process_elements(
        self,
        state: DefaultTriggerState,
        windowed_values: Iterable[WindowedValue],
        output_watermark: Timestamp,
        input_watermark: Timestamp,
    ) -> Iterator[WindowedValue]:
        """New elements of one key; yields the panes that fire at once (late data).

        In microseconds, not ``Timestamp`` arithmetic (a ``Timestamp`` sum costs about
        2 µs): elements are grouped by window first, and expiry and the output time are
        worked out once per window.
        """
        by_window: dict[Any, list[WindowedValue]] = {}
        windows: dict[Any, Any] = {}
        bounds = bi.interval_bounds
        for wv in windowed_values:
            for window in wv.windows:
                # An IntervalWindow by its bounds: hashing the window object reads two
                # Timestamp properties.
                key = bounds(window) if type(window) is IntervalWindow else window
                elements = by_window.get(key)
                if elements is None:
                    by_window[key] = [wv]
                    windows[key] = window
                else:
                    elements.append(wv)
        input_micros = input_watermark.micros
        lateness = self.allowed_lateness.micros
        floor = output_watermark.micros
        for key, elements in by_window.items():
            window = windows[key]
            if type(key) is tuple:
                end, max_timestamp = key[1], key[1] - 1
            else:
                end, max_timestamp = window.end.micros, window.max_timestamp().micros
            if input_micros > end + lateness:
                continue  # expired: Beam drops it
            panes = state.get(window)
            if panes is None:
                panes = state[window] = WindowPanes()
            hold = self._output_time(max_timestamp, elements, floor)
            if hold is not None:
                add_hold(panes.holds, hold)
            panes.values.extend([wv.value for wv in elements])
            panes.timer = True
            if input_micros >= end:
                panes.timer = False
                yield self._output(window, panes, output_watermark, on_time=False)

    def _output_time(
        self, max_timestamp: int, elements: list[WindowedValue], floor: int
    ) -> int | None:
        """The hold of new elements of a window (micros), or None.

        That is Beam's timestamp combiner's ``merge`` over the elements' output times not
        behind the output watermark (``floor``); ``max_timestamp`` is the window's.
        """
        kind = self.kind
        if kind == "end":  # DependsOnlyOnWindow: the window alone, whatever the elements
            return max_timestamp
        times = [t for t in (wv.timestamp_micros for wv in elements) if t >= floor]
        if not times:
            return None
        return min(times) if kind == "earliest" else max(times)

    def window_hold(self, window: Any, elements: list[WindowedValue], floor: int) -> int | None:
        """The hold new elements of ``window`` add (micros), or None (``process_elements``')."""
        if type(window) is IntervalWindow:
            max_timestamp = bi.interval_bounds(window)[1] - 1
        else:
            max_timestamp = window.max_timestamp().micros
        return self._output_time(max_timestamp, elements, floor)

    def fire_timers(self, state: DefaultTriggerState, watermark: Timestamp) -> Iterator[Any]:
        """The panes of windows whose end the watermark reached, in end order."""
        due = [w for w, panes in state.items() if panes.timer and w.end <= watermark]
        for window in sorted(due, key=lambda w: w.end):
            yield self.fire(window, state[window])

    def first_pane(self, window: Any, values: list[Any], holds: list[int]) -> WindowedValue:
        """The on-time pane of a window with no pane yet whose end the watermark reached.

        What ``fire`` gives for a new ``WindowPanes(values, holds, timer=True)``, without
        the ``Timestamp`` comparisons and the pane's ``PaneInfo`` made anew.
        """
        if not holds:
            timestamp = window.max_timestamp()
        else:
            timestamp = Timestamp(micros=min(holds) if self.kind == "earliest" else max(holds))
        return WindowedValue(values, timestamp, (window,), _FIRST_ON_TIME)

    def fire(self, window: Any, panes: WindowPanes) -> WindowedValue:
        """The pane of the end-of-window timer of ``window``, whose end the watermark reached."""
        panes.timer = False
        return self._output(window, panes, window.end, on_time=True)

    def _output(
        self,
        window: Any,
        panes: Any,
        output_watermark: Timestamp,
        on_time: bool,
        finished: bool = False,
    ) -> WindowedValue:
        """Beam's ``GeneralTriggerDriver._output``: the pane, its window's state updated.

        ``finished``: the trigger is done with the window (its last pane); the window's
        values go, as under the discarding mode (the caller closes the window).
        """
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
        pane_info = PaneInfo(index == 0, finished, timing, index, nonspeculative)
        values = self._take_values(panes, finished)
        if not panes.holds:
            timestamp = window.max_timestamp()
        else:  # the combiner's combine_all: the earliest, or the latest
            earliest = self.kind == "earliest"
            timestamp = Timestamp(micros=min(panes.holds) if earliest else max(panes.holds))
            # Kept while the watermark is before the window's end, for the on-time pane.
            if not (self.ontime_pane and output_watermark < window.end):
                panes.holds = []
        return WindowedValue(values, timestamp, (window,), pane_info)

    def _take_values(self, panes: Any, finished: bool = False) -> list[Any]:
        """The pane's values; under the discarding mode the window keeps none."""
        values = list(panes.values)
        if self.discarding or finished:
            panes.values = []
        return values

    def new_state(self) -> DefaultTriggerState:
        """The state of a key the driver has not seen."""
        return DefaultTriggerState()

    @staticmethod
    def _end(window: Any) -> int:
        """A window's end (micros), as the state keys it (``SessionsDriver``'s are bounds)."""
        return end_of(window)

    def forget_expired(self, state: DefaultTriggerState, watermark: int, lateness: int) -> None:
        """Drops the windows past their garbage-collection time that wait for no timer.

        That is a window whose end plus ``lateness`` the input ``watermark`` passed
        (micros): Beam would drop any input for it as late.
        """
        end = self._end
        for window in [
            w for w, panes in state.items() if end(w) + lateness < watermark and not panes.timer
        ]:
            del state[window]

    def next_visit(self, state: DefaultTriggerState, allowed_lateness: int) -> int:
        """The input watermark (micros) at which the key next has work.

        That is a window's end-of-window timer to fire, or a window past its end plus
        ``allowed_lateness`` to forget.
        """
        end = self._end
        visit = None
        for window, panes in state.items():
            at = end(window) if panes.timer else end(window) + allowed_lateness + 1
            if visit is None or at < visit:
                visit = at
        return MIN_TIMESTAMP.micros if visit is None else visit

    @staticmethod
    def earliest_hold(state: DefaultTriggerState) -> int:
        """As Beam's ``InMemoryUnmergedState.get_earliest_hold``, in microseconds.

        Without making the ``Timestamp`` (2 % of Nexmark q11's Python time).
        """
        holds = [min(panes.holds) for panes in state.values() if panes.holds]
        return min(holds) - _GRANULARITY if holds else _MAX_MICROS


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
            window_token(window),
            panes.values,
            panes.holds,
            panes.fired,
            panes.nonspeculative,
            panes.timer,
        )
        for window, panes in state.items()
    ]


def window_token(window: Any) -> Any:
    """A window for a state-store blob: an ``IntervalWindow``'s bounds (micros), or itself."""
    return bi.interval_bounds(window) if type(window) is IntervalWindow else window


def window_of(token: Any) -> Any:
    """The window :func:`window_token` gave, one object per window."""
    if type(token) is not tuple:
        return token
    window = _WINDOWS.get(token)
    if window is None:
        if len(_WINDOWS) >= _MAX_WINDOWS:
            _WINDOWS.clear()
        start, end = token
        window = _WINDOWS[token] = IntervalWindow(Timestamp(micros=start), Timestamp(micros=end))
    return window


def restored_state(plain: list[tuple[Any, ...]]) -> DefaultTriggerState:
    """The state :func:`plain_state` gave, with one window object per window."""
    state = DefaultTriggerState()
    for token, values, holds, fired, nonspeculative, timer in plain:
        state[window_of(token)] = WindowPanes(values, holds, fired, nonspeculative, timer)
    return state


def upgraded_state(state: DefaultTriggerState) -> DefaultTriggerState:
    """A state pickled whole by an earlier runner version, whose holds were ``Timestamp``s."""
    for panes in state.values():
        panes.holds = [h.micros if isinstance(h, Timestamp) else h for h in panes.holds]
    return state
