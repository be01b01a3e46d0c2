"""The runner's session panes equal Beam's ``GeneralTriggerDriver``'s.

``execution.session_trigger`` stands in for Beam's driver under the default trigger over
``Sessions``. Each case feeds the same random micro-batches (several keys; elements close
enough to merge sessions, some on time, some late within the allowed lateness and merging
into sessions that already fired, some expired; watermarks landing on session ends, then
+inf) to a GroupByKey shard driven each way, and compares every pane (key, values in order,
timestamp, window, pane info), the shard's output watermark, the keys it keeps, and its state
after a round trip through the state store.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampCombiner
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming, WindowedValue

from beam_spark_runner.execution.session_trigger import SessionTriggerState, applies
from beam_spark_runner.streaming.watermarks import MAX_MICROS
from tests.execution.test_default_trigger import SECOND, Mix, _into, _Run, compare_with_beams_driver
from tests.streaming.test_grouping import _Shard

ACCUMULATING = trigger.AccumulationMode.ACCUMULATING
DISCARDING = trigger.AccumulationMode.DISCARDING

CASES = {
    "sessions": dict(windowfn=window.Sessions(10)),
    "sessions-lateness": dict(windowfn=window.Sessions(10), allowed_lateness=15),
    "sessions-lateness-accumulating": dict(
        windowfn=window.Sessions(10), allowed_lateness=15, accumulation_mode=ACCUMULATING
    ),
    "sessions-earliest-lateness": dict(
        windowfn=window.Sessions(10),
        timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST,
        allowed_lateness=8,
    ),
    "sessions-latest-accumulating": dict(
        windowfn=window.Sessions(6),
        timestamp_combiner=TimestampCombiner.OUTPUT_AT_LATEST,
        accumulation_mode=ACCUMULATING,
        allowed_lateness=20,
    ),
    # Nexmark q11's trigger.
    "early-count-lateness": dict(
        windowfn=window.Sessions(10),
        trigger=trigger.AfterWatermark(early=trigger.AfterCount(3)),
        accumulation_mode=DISCARDING,
        allowed_lateness=15,
    ),
    "early-count-accumulating-earliest": dict(
        windowfn=window.Sessions(10),
        trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
        accumulation_mode=ACCUMULATING,
        timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST,
        allowed_lateness=8,
    ),
    "after-watermark-lateness": dict(
        windowfn=window.Sessions(6),
        trigger=trigger.AfterWatermark(),
        accumulation_mode=DISCARDING,
        allowed_lateness=20,
    ),
}


# Close together (sessions merge), behind the watermark (late, merging into sessions that
# fired, or expired), exactly at a session's end.
MERGING = Mix(
    offsets=(-25, -14, -9, -4, 0, 2, 3, 6, 11, 17),
    jitters=(0, 0, -1, 1, 250_000),
    most=10,
    steps=(0, 1, 2, 5, 3, 10),
    batches=40,
)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_same_panes_holds_and_state_as_beams_driver(name: str, seed: int) -> None:
    panes = compare_with_beams_driver(_into(CASES[name]), seed, MERGING, SessionTriggerState)
    gap = CASES[name]["windowfn"].gap_size
    assert any(pane[4][0].end - pane[4][0].start > gap for pane in panes), "nothing merged"


def test_a_late_element_merging_into_a_fired_session_starts_its_panes_again() -> None:
    """Beam clears pane counters across a merge: the merged session's next pane is the
    first again, and under accumulation holds the fired session's values too."""
    into = _into(CASES["sessions-lateness-accumulating"])
    shard = _Shard(into)
    ours, beams = _Run(shard, beam_driver=False), _Run(shard, beam_driver=True)
    encode = ours.grouper.pre_impl.encode_nested
    windowfn = into.windowing.windowfn

    def cells(*seconds: int) -> dict[bytes, list[bytes]]:
        values = []
        for at in seconds:
            ts = Timestamp(micros=at * SECOND)
            windows = windowfn.assign(window.WindowFn.AssignContext(ts))
            values.append(encode(WindowedValue(("k", at), ts, windows)))
        return {b"k": values}

    batches = [(cells(1, 4), 0), ({}, 20 * SECOND), (cells(12), 21 * SECOND), ({}, MAX_MICROS)]
    panes = []
    for batch_cells, watermark in batches:
        out = ours.batch(batch_cells, watermark)
        assert out == beams.batch(batch_cells, watermark)
        panes.extend(out[0])
    on_time, merged = panes
    assert on_time[2] == [1, 4] and on_time[5].timing == PaneInfoTiming.ON_TIME
    assert merged[2] == [1, 4, 12] and merged[5].index == 0 and merged[5].is_first
    assert merged[4] == (window.IntervalWindow(1, 22),)


def test_it_stands_in_only_for_its_triggers_over_beams_sessions() -> None:
    assert all(applies(_into(case).windowing) for case in CASES.values())
    assert not applies(beam.WindowInto(window.FixedWindows(10)).windowing)
    for other in (
        trigger.AfterWatermark(late=trigger.AfterCount(1)),
        trigger.AfterWatermark(early=trigger.AfterProcessingTime(5)),
        trigger.Repeatedly(trigger.AfterCount(2)),
        trigger.AfterCount(2),
    ):
        into = beam.WindowInto(window.Sessions(10), trigger=other, accumulation_mode=DISCARDING)
        assert not applies(into.windowing), other

    class MySessions(window.Sessions):  # type: ignore[misc]
        pass

    assert not applies(beam.WindowInto(MySessions(10)).windowing)
