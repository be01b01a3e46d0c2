"""The runner's default-trigger panes equal Beam's ``GeneralTriggerDriver``'s.

``execution.default_trigger`` stands in for Beam's driver under the default trigger over
non-merging windows. Each case feeds the same random micro-batches (several keys, elements
on time, late, exactly at window ends, watermarks landing on window ends, then +inf) to a
GroupByKey shard driven each way, and compares every pane (key, values, timestamp, window,
pane info), the shard's output watermark, the keys it keeps, and its state after a round
trip through the state store.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampCombiner
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner.execution.default_trigger import DefaultTriggerState, add_hold, applies
from beam_spark_runner.streaming import group_panes, grouping
from beam_spark_runner.streaming.chunk_lists import ChunkStore
from beam_spark_runner.streaming.watermarks import MAX_MICROS, Marker, WatermarkState
from tests.streaming.test_grouping import MemoryChunks, _Shard

SECOND = 1_000_000
DISCARDING = trigger.AccumulationMode.DISCARDING
ACCUMULATING = trigger.AccumulationMode.ACCUMULATING

CASES = {
    # A window that is not an IntervalWindow: it fires when the input ends.
    "global-latest": dict(
        windowfn=window.GlobalWindows(), timestamp_combiner=TimestampCombiner.OUTPUT_AT_LATEST
    ),
    "fixed": dict(windowfn=window.FixedWindows(10)),
    "sliding": dict(windowfn=window.SlidingWindows(10, 5)),
    "fixed-lateness": dict(windowfn=window.FixedWindows(10), allowed_lateness=7),
    "sliding-lateness-accumulating": dict(
        windowfn=window.SlidingWindows(10, 5), allowed_lateness=12, accumulation_mode=ACCUMULATING
    ),
    "fixed-earliest": dict(
        windowfn=window.FixedWindows(10), timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST
    ),
    "sliding-latest-lateness": dict(
        windowfn=window.SlidingWindows(10, 5),
        timestamp_combiner=TimestampCombiner.OUTPUT_AT_LATEST,
        allowed_lateness=5,
    ),
}


def _into(case: dict[str, Any]) -> beam.WindowInto:
    args = dict(case)
    return beam.WindowInto(args.pop("windowfn"), **args)


def _pane(key_bytes: bytes, key: Any, pane: WindowedValue) -> tuple[Any, ...]:
    return (key_bytes, key, list(pane.value), pane.timestamp, pane.windows, pane.pane_info)


class _Run:
    """One shard of the GroupByKey, with Beam's driver or the runner's."""

    def __init__(self, shard: _Shard, beam_driver: bool, chunks: ChunkStore | None = None) -> None:
        self.grouper = group_panes.StreamingGrouper(shard.spec, beam_driver=beam_driver)
        self.state = grouping.ShardState(WatermarkState(expected=shard.node.expected))
        self.source = shard.source
        self.chunks = chunks

    def batch(self, cells: dict[bytes, list[bytes]], watermark: int) -> tuple[list[Any], int]:
        marker = Marker(self.source, watermark, 0)
        process = self.grouper.process(self.state, cells, [marker], self.chunks)
        panes = [_pane(*p) for p in process]
        output = self.state.watermarks.output(self.grouper.hold(self.state))
        # Through the state store, as between micro-batches.
        self.state = grouping.decode_shard_state(grouping.encode_shard_state(self.state))
        return panes, output


@dataclasses.dataclass(frozen=True)
class Mix:
    """What random micro-batches hold: elements this many seconds from the watermark
    (plus a jitter in µs), up to ``most`` per batch, and watermark steps in seconds."""

    offsets: tuple[int, ...]
    jitters: tuple[int, ...]
    most: int
    steps: tuple[int, ...]
    batches: int
    keys: int = 3  # drawn from this many


def _per_key(panes: list[Any]) -> dict[bytes, list[Any]]:
    """Each key's panes, in the order they came."""
    by_key: dict[bytes, list[Any]] = {}
    for pane in panes:
        by_key.setdefault(pane[0], []).append(pane)
    return by_key


def compare_with_beams_driver(
    into: beam.WindowInto,
    seed: int,
    mix: Mix,
    state_type: type,
    chunks: MemoryChunks | None = None,
) -> list[Any]:
    """Drives a shard with Beam's driver and with the runner's over the same random
    micro-batches, then +inf; requires the same panes, output watermarks, keys and state
    (of ``state_type``) after each. Returns every pane the runner's gave.

    ``chunks``: the runner's shard has that chunk store (windows wait there for their
    on-time pane), left empty at the end. Its keys come back when their window fires, so
    each key's panes are the same, in the same order, but the keys may fire in another
    order; the shard holds the keys Beam's holds, less those that only wait in the store."""
    shard = _Shard(into)
    ours = _Run(shard, beam_driver=False, chunks=chunks)
    beams = _Run(shard, beam_driver=True)
    assert ours.grouper.default is not None and beams.grouper.default is None
    windowfn = into.windowing.windowfn
    encode = ours.grouper.pre_impl.encode_nested
    rng = random.Random(seed)
    watermark = 0
    panes: list[Any] = []
    for _ in range(mix.batches):
        cells: dict[bytes, list[bytes]] = {}
        for _ in range(rng.randrange(0, mix.most)):
            key = "abc"[rng.randrange(3)] if mix.keys == 3 else f"k{rng.randrange(mix.keys)}"
            at = max(0, watermark + rng.choice(mix.offsets) * SECOND)
            at = max(0, at + rng.choice(mix.jitters))
            ts = Timestamp(micros=at)
            windows = windowfn.assign(window.WindowFn.AssignContext(ts))
            value = WindowedValue((key, rng.randrange(100)), ts, windows)
            cells.setdefault(key.encode(), []).append(encode(value))
        step = rng.choice(mix.steps) * SECOND + rng.choice([0, 0, -1, 1])
        watermark = max(watermark, watermark + step)
        out, expected = ours.batch(cells, watermark), beams.batch(cells, watermark)
        if chunks is None:
            assert out == expected
            assert list(ours.state.blobs) == list(beams.state.blobs)
        else:
            assert _per_key(out[0]) == _per_key(expected[0])
            assert out[1] == expected[1]
            assert set(ours.state.blobs) <= set(beams.state.blobs)
        panes.extend(out[0])
        # Every key the runner's driver holds is its state (read from a copy, so that the
        # next batch still decodes only the keys with elements or work due).
        copy = grouping.decode_shard_state(grouping.encode_shard_state(ours.state))
        assert all(
            isinstance(copy.key_state(k).state, state_type)  # type: ignore[union-attr]
            for k in copy.blobs
        )
    final = ours.batch({}, MAX_MICROS), beams.batch({}, MAX_MICROS)
    assert _per_key(final[0][0]) == _per_key(final[1][0]) and final[0][1] == final[1][1]
    panes.extend(final[0][0])
    assert not ours.state.blobs and not beams.state.blobs
    assert not ours.state.buffered
    if chunks is not None:
        assert chunks.chunks == []
    return panes


# Around the watermark: some late, some exactly at a window's end or start.
AROUND = Mix(
    offsets=(-12, -5, 0, 1, 5, 9, 13),
    jitters=(0, 0, -1, 1, 500_000),
    most=8,
    steps=(0, 1, 5, 3, 10),
    batches=30,
)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("buffered", [False, True], ids=["in-keys", "chunk-store"])
def test_the_same_panes_holds_and_state_as_beams_driver(
    name: str, seed: int, buffered: bool
) -> None:
    chunks = MemoryChunks() if buffered else None
    compare_with_beams_driver(_into(CASES[name]), seed, AROUND, DefaultTriggerState, chunks)
    if chunks is not None:
        assert chunks.appended, "no values waited in the chunk store"


# Many keys, most new to the shard: their values skip the keys' states on the way to the
# chunk store, and a window that expires as it fires fires without them entering the shard.
MANY_KEYS = dataclasses.replace(AROUND, keys=40, most=30)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2])
def test_keys_new_to_the_shard_give_beams_panes(name: str, seed: int) -> None:
    chunks = MemoryChunks()
    compare_with_beams_driver(_into(CASES[name]), seed, MANY_KEYS, DefaultTriggerState, chunks)
    assert chunks.appended and chunks.taken


def test_it_stands_in_only_for_the_default_trigger_over_windows_that_do_not_merge() -> None:
    assert applies(_into(CASES["sliding"]).windowing)
    assert not applies(beam.WindowInto(window.Sessions(10)).windowing)
    assert not applies(
        beam.WindowInto(
            window.FixedWindows(10),
            trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
            accumulation_mode=DISCARDING,
        ).windowing
    )
    assert not applies(
        beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=DISCARDING,
        ).windowing
    )
    assert MAX_TIMESTAMP.micros >= MAX_MICROS


def test_keys_a_checkpoint_holds_in_beams_state_stay_with_beams_driver() -> None:
    """A shard restored from a checkpoint written with Beam's driver (an earlier runner
    version) goes on: its keys stay with Beam's driver, new keys get the runner's."""
    shard = _Shard(_into(CASES["sliding-lateness-accumulating"]))
    windowfn = window.SlidingWindows(10, 5)
    old, reference = _Run(shard, beam_driver=True), _Run(shard, beam_driver=True)
    encode = old.grouper.pre_impl.encode_nested

    def cells(keys: str, at: int) -> dict[bytes, list[bytes]]:
        ts = Timestamp(micros=at)
        windows = windowfn.assign(window.WindowFn.AssignContext(ts))
        return {k.encode(): [encode(WindowedValue((k, at), ts, windows))] for k in keys}

    for at in (1, 3):
        assert old.batch(cells("ab", at * SECOND), 0) == reference.batch(
            cells("ab", at * SECOND), 0
        )
    upgraded = _Run(shard, beam_driver=False)
    upgraded.state = old.state
    batches = [(cells("bc", 4 * SECOND), 2 * SECOND), (cells("c", 12 * SECOND), 11 * SECOND)]
    for new_cells, watermark in [*batches, ({}, MAX_MICROS)]:
        (panes, output), (expected, expected_output) = (
            upgraded.batch(new_cells, watermark),
            reference.batch(new_cells, watermark),
        )
        # Each key's panes in order (keys of the two kinds fire in two passes).
        assert sorted(panes, key=lambda p: p[0]) == sorted(expected, key=lambda p: p[0])
        assert output == expected_output
        kinds = {
            k: type(upgraded.state.key_state(k).state).__name__  # type: ignore[union-attr]
            for k in upgraded.state.blobs
        }
        assert kinds.get(b"c") in (None, "DefaultTriggerState")
        assert kinds.get(b"a") in (None, "InMemoryUnmergedState")
    assert not upgraded.state.blobs


def test_a_window_keeps_its_earliest_and_latest_hold_once_each() -> None:
    """One hold per bundle of elements would grow a window's state every micro-batch."""
    holds: list[int] = []
    for hold in (5, 5, 3, 9, 4, 9, 1):
        add_hold(holds, hold)
    assert holds == [1, 9]
    same: list[int] = []
    for _ in range(3):
        add_hold(same, 7)
    assert same == [7]
    # A window of an earlier runner version, every hold kept.
    earlier = [4, 8, 2, 6]
    add_hold(earlier, 5)
    assert earlier == [2, 8]
