"""The runner's ``Repeatedly(AfterCount(n))`` panes equal Beam's ``GeneralTriggerDriver``'s.

``execution.count_trigger`` stands in for Beam's driver under ``Repeatedly(AfterCount(n))``
over non-merging windows. Each case feeds the same random micro-batches (several keys,
elements on time, late and expired, watermarks landing on window ends, then +inf) to a
GroupByKey shard driven each way, and compares every pane (key, values, timestamp, window,
pane info), the shard's output watermark, the keys it keeps, and its state after a round
trip through the state store.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import GlobalWindow, TimestampCombiner
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming, WindowedValue

from beam_spark_runner.execution.count_trigger import CountTriggerState, applies
from beam_spark_runner.streaming import grouping
from tests.execution.test_default_trigger import SECOND, Mix, _into, _Run, compare_with_beams_driver
from tests.streaming.test_grouping import _Shard

ACCUMULATING = trigger.AccumulationMode.ACCUMULATING
DISCARDING = trigger.AccumulationMode.DISCARDING


def _count(n: int) -> Any:
    return trigger.Repeatedly(trigger.AfterCount(n))


CASES = {
    # The state benchmark's GroupByKey.
    "global": dict(
        windowfn=window.GlobalWindows(), trigger=_count(3), accumulation_mode=DISCARDING
    ),
    "global-earliest-accumulating": dict(
        windowfn=window.GlobalWindows(),
        trigger=_count(2),
        accumulation_mode=ACCUMULATING,
        timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST,
    ),
    "fixed-latest": dict(
        windowfn=window.FixedWindows(10),
        trigger=_count(2),
        accumulation_mode=DISCARDING,
        timestamp_combiner=TimestampCombiner.OUTPUT_AT_LATEST,
    ),
    "fixed-lateness-accumulating": dict(
        windowfn=window.FixedWindows(10),
        trigger=_count(3),
        accumulation_mode=ACCUMULATING,
        allowed_lateness=12,
    ),
    "sliding-earliest-lateness": dict(
        windowfn=window.SlidingWindows(10, 5),
        trigger=_count(2),
        accumulation_mode=DISCARDING,
        timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST,
        allowed_lateness=7,
    ),
}

# Around the watermark: some late, some expired, some exactly at a window's end or start.
AROUND = Mix(
    offsets=(-20, -12, -5, 0, 1, 5, 9, 13),
    jitters=(0, 0, -1, 1, 500_000),
    most=10,
    steps=(0, 1, 5, 3, 10),
    batches=30,
)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_panes_holds_and_state_as_beams_driver(name: str, seed: int) -> None:
    panes = compare_with_beams_driver(_into(CASES[name]), seed, AROUND, CountTriggerState)
    assert any(pane[5].timing == PaneInfoTiming.EARLY for pane in panes)


def test_it_stands_in_only_for_repeatedly_after_count_over_windows_that_do_not_merge() -> None:
    assert applies(_into(CASES["global"]).windowing)
    assert applies(_into(CASES["sliding-earliest-lateness"]).windowing)
    for windowfn, trigger_fn in [
        (window.Sessions(10), _count(2)),
        (window.GlobalWindows(), trigger.AfterCount(2)),
        (window.GlobalWindows(), trigger.Repeatedly(trigger.AfterProcessingTime(5))),
        (window.FixedWindows(10), trigger.AfterWatermark(early=trigger.AfterCount(2))),
        (window.FixedWindows(10), trigger.DefaultTrigger()),
    ]:
        into = beam.WindowInto(windowfn, trigger=trigger_fn, accumulation_mode=DISCARDING)
        assert not applies(into.windowing), trigger_fn


def _global_cells(run: _Run, keys: range, at: int) -> dict[bytes, list[bytes]]:
    encode = run.grouper.pre_impl.encode_nested
    ts = Timestamp(micros=at)
    return {
        str(k).encode(): [encode(WindowedValue((str(k), 1), ts, [GlobalWindow()]))] for k in keys
    }


def test_a_key_in_the_global_window_takes_a_few_dozen_bytes() -> None:
    """A key waiting for its count: about 300 bytes pickled in Beam's state, under a fifth of
    that in the runner's (the state benchmark keeps millions)."""
    shard = _Shard(_into(CASES["global"]))
    sizes = {}
    for beam_driver in (True, False):
        run = _Run(shard, beam_driver=beam_driver)
        run.batch(_global_cells(run, range(1000), SECOND), 0)
        blobs = run.state.blobs
        sizes[beam_driver] = sum(len(b) for b in blobs.values()) / len(blobs)
    assert sizes[True] > 250
    assert sizes[False] < 60


def test_keys_a_checkpoint_holds_in_beams_state_stay_with_beams_driver() -> None:
    """A shard restored from a checkpoint written with Beam's driver (before this driver)
    goes on: its keys stay with Beam's driver and count on, new keys get the runner's."""
    shard = _Shard(_into(CASES["global"]))
    old, reference = _Run(shard, beam_driver=True), _Run(shard, beam_driver=True)
    for run in (old, reference):
        run.batch(_global_cells(run, range(4), SECOND), 0)
        run.batch(_global_cells(run, range(4), SECOND), 0)
    upgraded = _Run(shard, beam_driver=False)
    upgraded.state = grouping.decode_shard_state(grouping.encode_shard_state(old.state))
    for keys in (range(2, 6), range(0, 6), range(4, 6)):
        (panes, output), (expected, expected_output) = (
            upgraded.batch(_global_cells(upgraded, keys, 2 * SECOND), SECOND),
            reference.batch(_global_cells(reference, keys, 2 * SECOND), SECOND),
        )
        assert sorted(panes, key=lambda p: p[0]) == sorted(expected, key=lambda p: p[0])
        assert output == expected_output
    kinds = {
        k: type(upgraded.state.key_state(k).state).__name__  # type: ignore[union-attr]
        for k in upgraded.state.blobs
    }
    assert kinds == {
        **{str(k).encode(): "InMemoryUnmergedState" for k in range(4)},
        **{str(k).encode(): "CountTriggerState" for k in range(4, 6)},
    }
