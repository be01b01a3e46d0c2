"""GroupByKey panes under ``Repeatedly(AfterCount(n))``, without Beam's general trigger driver.

:class:`CountDriver` gives the same panes as Beam's ``GeneralTriggerDriver`` for
``Repeatedly(AfterCount(n))`` over non-merging windows (the global window among them): a
pane when a window's elements since its last pane reach ``n`` (checked once per key per
micro-batch, after its elements are added, as Beam does), early or late by the output
watermark, never an on-time one; the same values in the same order, timestamps, pane
infos, dropping of expired data, and the same earliest hold for the output watermark.
``tests/execution/test_count_trigger.py`` checks it against Beam's driver on random
micro-batches.

Per window it keeps what Beam's driver keeps under the window's state tags: buffered
values, holds, the two pane counters and ``AfterCount``'s count (:class:`CountPanes`), in a
key's state-store blob as a few plain values (:func:`plain_counts`) where Beam's state
pickles to about 300 bytes a key: a job counting per key in the global window keeps every
key it has seen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.transforms import trigger
from apache_beam.transforms.window import GlobalWindow, NonMergingWindowFn, TimestampCombiner
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner.execution.default_trigger import (
    COMBINERS,
    DefaultTriggerDriver,
    DefaultTriggerState,
    WindowPanes,
    add_hold,
    window_of,
    window_token,
)


@dataclasses.dataclass
class CountPanes(WindowPanes):
    """One window of one key, with ``AfterCount``'s elements since its last pane."""

    count: int = 0  # AfterCount's COUNT_TAG


class CountTriggerState(DefaultTriggerState):
    """A key's windows (window -> :class:`CountPanes`), in the order they first came."""


def count_of(trigger_fn: Any) -> int | None:
    """``n`` of ``Repeatedly(AfterCount(n))``; None for any other trigger."""
    if type(trigger_fn) is trigger.Repeatedly and type(trigger_fn.underlying) is trigger.AfterCount:
        return int(trigger_fn.underlying.count)
    return None


def applies(windowing: Any) -> bool:
    """Whether :class:`CountDriver` can stand in for Beam's driver here."""
    combiner = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
    return bool(
        count_of(windowing.triggerfn) is not None
        and isinstance(windowing.windowfn, NonMergingWindowFn)
        and type(combiner) in COMBINERS
    )


class CountDriver(DefaultTriggerDriver):
    """Beam's ``GeneralTriggerDriver`` for ``Repeatedly(AfterCount(n))``, non-merging windows.

    The trigger sets no timer (``fire_timers`` finds none) and has no on-time pane, so a
    pane clears its window's holds whatever the watermark; a window is forgotten, fired or
    not, once the input watermark passes its end plus the allowed lateness, as the shard
    forgets Beam's.
    """

    ontime_pane = False

    def __init__(self, windowing: Any) -> None:
        super().__init__(windowing)
        count = count_of(windowing.triggerfn)
        assert count is not None, f"expected Repeatedly(AfterCount(n)), found {windowing.triggerfn}"
        self.count = count

    def new_state(self) -> CountTriggerState:
        return CountTriggerState()

    def process_elements(  # type: ignore[override]
        self,
        state: CountTriggerState,
        windowed_values: Iterable[WindowedValue],
        output_watermark: Timestamp,
        input_watermark: Timestamp,
    ) -> Iterator[WindowedValue]:
        """New elements of one key; yields the panes whose windows reached the count."""
        by_window: dict[Any, list[WindowedValue]] = {}
        for wv in windowed_values:
            for window in wv.windows:
                by_window.setdefault(window, []).append(wv)
        input_micros = input_watermark.micros
        lateness = self.allowed_lateness.micros
        floor = output_watermark.micros
        for window, elements in by_window.items():
            if input_micros > window.end.micros + lateness:
                continue  # expired: Beam drops it
            panes = state.get(window)
            if panes is None:
                panes = state[window] = CountPanes()
            hold = self._output_time(window.max_timestamp().micros, elements, floor)
            if hold is not None:
                add_hold(panes.holds, hold)
            panes.values.extend([wv.value for wv in elements])
            panes.count += len(elements)
            if panes.count >= self.count:
                panes.count = 0  # Repeatedly resets AfterCount once it fires
                yield self._output(window, panes, output_watermark, on_time=False)


# A blob's token for the global window (its object pickles to about 100 bytes).
_GLOBAL = None


def plain_counts(state: CountTriggerState) -> list[tuple[Any, ...]]:
    """A key's windows as plain values for its state-store blob."""
    return [
        (
            _GLOBAL if type(window) is GlobalWindow else window_token(window),
            panes.values,
            panes.holds,
            panes.fired,
            panes.nonspeculative,
            panes.count,
        )
        for window, panes in state.items()
    ]


def restored_counts(plain: list[tuple[Any, ...]]) -> CountTriggerState:
    """The state :func:`plain_counts` gave."""
    state = CountTriggerState()
    for token, values, holds, fired, nonspeculative, count in plain:
        window = GlobalWindow() if token is _GLOBAL else window_of(token)
        state[window] = CountPanes(values, holds, fired, nonspeculative, False, count)
    return state
