"""The Python-per-event floor's q7 and q8: elements encoded by Beam's coder into compressed
runs per window (and shard), then decoded at the window's end for Beam's user code; checked
against the plain-Python references of Beam's queries (``nexmark.python_query``). Windows
are by the events' own times here; the floor's Spark query windows them by the ``rate``
rows' times, as ours does."""

from __future__ import annotations

from benchmarks import nexmark
from benchmarks.streaming_floor_buffered import (
    floor_q7_pack,
    floor_q7_select,
    floor_q8_join,
    floor_q8_pack,
)
from tests.benchmarks.floor_events import TOTAL, event_batches


def test_the_python_floors_q7_selects_the_bids_beams_q7_gives() -> None:
    """Encoded, packed per window and Arrow batch, and selected per window by Beam's
    ``SelectMaxBidFn``, the floor's bids are the plain-Python reference's. Its runs are
    compressed."""
    items = list(nexmark.events(0, TOTAL))
    windows: dict[int, list[tuple[bytes, int, int]]] = {}
    for numbers, micros in event_batches():
        for start, run in floor_q7_pack(numbers, micros).items():
            windows.setdefault(start, []).append(run)
    assert len(windows) > 1
    bids = [item for item in items if nexmark._is_bid(item)]
    assert sum(len(run) for runs in windows.values() for run, _, _ in runs) < 200 * len(bids)
    for start, runs in windows.items():
        in_window = [b for b in bids if nexmark.fixed_window(nexmark.millis(b)) * 1000 == start]
        assert max(best for _, best, _ in runs) == max(bid.price for bid in in_window)
        latest = max(nexmark.millis(bid) for bid in in_window) * 1000
        assert max(at for _, _, at in runs) == latest
    selected = [
        bid
        for runs in windows.values()
        for bid in floor_q7_select(max(best for _, best, _ in runs), [run for run, _, _ in runs])
    ]
    expected = nexmark.python_query(7, items)
    assert expected
    assert sorted(map(nexmark.q7_fingerprint, selected)) == sorted(
        map(nexmark.q7_fingerprint, expected)
    )


def test_the_python_floors_q8_joins_each_windows_persons_and_auctions_as_beams_q8() -> None:
    """Persons keyed by id and auctions by seller, in their fixed windows, encoded into
    runs per window and key shard, then per window and shard decoded, grouped by key and
    joined by Beam's ``JoinPersonAuctionFn``: the plain-Python reference's q8. A shard
    holds only its keys, so no join crosses shards."""
    items = list(nexmark.events(0, TOTAL))
    shards = 2
    runs: dict[tuple[int, int], list[bytes]] = {}
    for numbers, micros in event_batches():
        for (start, shard), (run, best, latest) in floor_q8_pack(numbers, micros, shards).items():
            assert best == 0 and start <= latest < start + nexmark.WINDOW_SIZE_MS * 1000
            runs.setdefault((start, shard), []).append(run)
    assert {shard for _, shard in runs} == {0, 1}
    joined = [row for packed in runs.values() for row in floor_q8_join(packed)]
    expected = nexmark.python_query(8, items)
    assert len(expected) > 10
    assert sorted(map(nexmark.q8_fingerprint, joined)) == sorted(
        map(nexmark.q8_fingerprint, expected)
    )
    assert floor_q8_join([]) == []
