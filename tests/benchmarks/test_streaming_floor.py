"""The Python-per-event floor's own Python: each query's user code up to its grouping and,
for q5, Beam's ``MostBidCombineFn`` after Spark's count; checked against the plain-Python
references of Beam's queries (``nexmark.python_query``, which match Beam's queries on
FnApiRunner: test_benchmark_nexmark). Windows are by the events' own times here; the
floor's Spark query windows them by the ``rate`` rows' times, as ours does."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from benchmarks import nexmark, streaming_floor
from tests.benchmarks.floor_events import TOTAL, event_batches


def _stateless_reference(query: int, items: list[Any]) -> list[Any]:
    bids = [b for b in items if nexmark._is_bid(b)]
    if query == 1:
        return [nexmark._to_euro(b) for b in bids]
    return [nexmark._q2_project(b) for b in bids if nexmark._q2_keep(b)]


@pytest.mark.parametrize("query", [0, 1, 2])
def test_the_python_floor_runs_each_querys_own_user_code(query: int) -> None:
    """The floor's per-event steps give what Beam's query gives: q0 each event back (its
    coder's round trip), q1 and q2 the plain-Python reference's outputs."""
    items = list(nexmark.events(0, TOTAL))
    steps = streaming_floor.python_floor_steps(query)
    outputs = [out for item in items for out in steps(item)]
    expected = items if query == 0 else _stateless_reference(query, items)
    assert expected, "the reference has results to compare"
    assert sorted(map(nexmark.FINGERPRINTS[query], outputs)) == sorted(
        map(nexmark.FINGERPRINTS[query], expected)
    )
    if query == 0:  # a round trip through the coder: new objects
        assert all(out is not item for out, item in zip(outputs, items, strict=True))


def test_the_python_floor_has_the_streaming_benchmarks_queries() -> None:
    from benchmarks import streaming
    from benchmarks.streaming import run_pyspark_python

    assert streaming.PYTHON_FLOOR_QUERIES == (0, 1, 2, 5, 7, 8, 11)
    with pytest.raises(ValueError, match="not query 5"):
        streaming_floor.python_floor_steps(5)  # windowed: no per-event steps
    with pytest.raises(ValueError, match="not query 3"):
        run_pyspark_python(3, 1000, 1.0)  # before any Spark starts
    with pytest.raises(ValueError, match="not query 4"):
        streaming_floor.floor_query(4, None)  # type: ignore[arg-type]


def test_the_floors_q5_assigns_sliding_windows_and_selects_beams_hot_items() -> None:
    """Each bid in its two sliding windows (Beam's ``SlidingWindows.assign``), keyed by
    auction; counted per window and auction (Spark's part, a ``Counter`` here), split over
    two tasks that each run ``MostBidCombineFn`` per window, merged per window: Beam's q5."""
    items = list(nexmark.events(0, TOTAL))
    bids = [b for b in items if nexmark._is_bid(b)]
    counts: Counter[tuple[int, int]] = Counter()
    for numbers, micros in event_batches():
        ends, auctions = streaming_floor.floor_q5_assign(numbers, micros)
        counts.update(zip(ends, auctions, strict=True))
    assert sum(counts.values()) == 2 * len(bids), "every bid in two windows"
    tasks: list[dict[int, tuple[list[int], int]]] = []
    counted = sorted(counts.items())
    for task in (counted[0::2], counted[1::2]):
        ends = [end for (end, _), _ in task]
        auctions = [auction for (_, auction), _ in task]
        tasks.append(streaming_floor.floor_q5_most(ends, auctions, [c for _, c in task]))
    rows = [
        row
        for end in {end for end, _ in counts}
        for row in streaming_floor.floor_q5_rows([t[end] for t in tasks if end in t])
    ]
    expected = nexmark.python_query(5, items)
    assert len(expected) > 3
    assert sorted(map(nexmark.q5_fingerprint, rows)) == sorted(
        map(nexmark.q5_fingerprint, expected)
    )


def test_the_floors_q11_assigns_each_bid_its_session_window() -> None:
    """Each bid, keyed by bidder, in the window ``Sessions.assign`` gives it (its time to
    its time plus the gap); those windows merged per bidder as Spark's ``session_window``
    merges them (overlapping windows join) and counted: Beam's q11."""
    items = list(nexmark.events(0, TOTAL))
    by_bidder: dict[int, list[tuple[int, int]]] = {}
    for numbers, micros in event_batches():
        bidders, starts, ends = streaming_floor.floor_q11_assign(numbers, micros)
        for bidder, start, end in zip(bidders, starts, ends, strict=True):
            by_bidder.setdefault(bidder, []).append((start, end))
    rows = []
    for bidder, windows in by_bidder.items():
        count, session_end = 0, None
        for start, end in sorted(windows):
            if session_end is not None and start >= session_end:
                rows.append({"bidder_id": bidder, "bid_count": count})
                count = 0
            count += 1
            session_end = end if session_end is None else max(session_end, end)
        rows.append({"bidder_id": bidder, "bid_count": count})
    assert all(
        end - start == nexmark.WINDOW_SIZE_MS * 1000
        for ws in by_bidder.values()
        for start, end in ws
    )
    expected = nexmark.python_query(11, items)
    assert any(row["bid_count"] > 1 for row in expected)
    assert sorted(map(nexmark.q11_fingerprint, rows)) == sorted(
        map(nexmark.q11_fingerprint, expected)
    )


@pytest.mark.parametrize("query", [0, 1, 2, 5, 7, 8, 11])
def test_the_floors_first_step_runs_on_a_rate_batch(query: int) -> None:
    """What ``benchmarks.first_stage_cpu`` times: the floor's first ``mapInArrow`` body."""
    from benchmarks.first_stage_cpu import rate_batch

    assert streaming_floor.batch_step(query)(rate_batch(0, 5_000)) > 0


def _q8_windows(items: list[Any]) -> Counter[int]:
    """The plain-Python reference's q8 outputs per window start (us)."""
    persons = {nexmark._q8_person_key(p) for p in items if nexmark._is_person(p)}
    keys = (nexmark._q8_auction_key(a) for a in items if nexmark._is_auction(a))
    return Counter(start * 1000 for start, seller in keys if (start, seller) in persons)


def _q7_windows(items: list[Any]) -> Counter[int]:
    """The plain-Python reference's q7 outputs per window start (us)."""
    best = nexmark.python_query(7, items)
    return Counter(nexmark.fixed_window(nexmark.millis(bid)) * 1000 for bid in best)


@pytest.mark.parametrize("query", [5, 7, 8, 11])
def test_the_floors_streaming_query_gives_beams_windows(
    spark_session: Any, tmp_path: Any, query: int
) -> None:
    """The floor's whole Structured Streaming query (``floor_query``), over a stream of the
    ``rate`` source's columns whose rows are the events at their own times: its windows'
    outputs are Beam's (the plain-Python reference's). The stream comes as three files, a
    micro-batch each: the events, then a person and a bid a minute later, then two
    minutes later, which move the watermark past every window of the events."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.group import GroupedData

    from beam_spark_runner.streaming.query import ensure_state_store

    if query in (7, 8) and not hasattr(GroupedData, "transformWithState"):
        pytest.skip("the floor's q7 and q8 keep their runs in transformWithState: PySpark 4.1+")

    ensure_state_store(spark_session)
    items = list(nexmark.events(0, TOTAL))
    last_ms = nexmark.BASE_TIME_MS + TOTAL
    late = 50 * TOTAL  # a person, then a bid: each query's watermark moves
    files = [
        (list(range(TOTAL)), [nexmark.millis(item) for item in items]),
        ([late, late + 4], [last_ms + 60_000] * 2),
        ([late + 50, late + 54], [last_ms + 120_000] * 2),
    ]
    directory = tmp_path / "rows"
    directory.mkdir()
    for i, (numbers, millis) in enumerate(files):
        table = pa.table(
            {
                "value": pa.array(numbers, pa.int64()),
                "timestamp": pa.array([m * 1000 for m in millis], pa.timestamp("us", tz="UTC")),
            }
        )
        pq.write_table(table, str(directory / f"{i}.parquet"))
    source = (
        spark_session.readStream.schema("value long, timestamp timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(directory))
    )
    floor = streaming_floor.floor_query(query, source)
    rows: list[Any] = []

    def collect(frame: Any, batch_id: int) -> None:
        rows.extend(frame.collect())
        if floor.each_batch is not None:
            floor.each_batch(frame, batch_id)  # the floor's own sink runs on it too

    running = (
        floor.frame.writeStream.option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(collect)
        .trigger(availableNow=True)
        .start()
    )
    running.awaitTermination(600)
    assert running.exception() is None
    cut = (last_ms + 30_000) * 1000  # windows of the events, not of the late rows
    if query == 5:
        windows: dict[int, list[tuple[list[int], int]]] = {}
        for row in rows:
            if row.end < cut:
                windows.setdefault(row.end, []).append((list(row.auctions), row.most))
        out = [r for accs in windows.values() for r in streaming_floor.floor_q5_rows(accs)]
        assert sorted(map(nexmark.q5_fingerprint, out)) == sorted(
            map(nexmark.q5_fingerprint, nexmark.python_query(5, items))
        )
    elif query == 11:
        out = [
            {"bidder_id": row.bidder, "bid_count": row["count"]}
            for row in rows
            if row.end.timestamp() * 1e6 < cut
        ]
        assert sorted(map(nexmark.q11_fingerprint, out)) == sorted(
            map(nexmark.q11_fingerprint, nexmark.python_query(11, items))
        )
    else:
        made: Counter[int] = Counter()
        for row in rows:
            if row.window < cut:
                made[row.window] += row.outputs
        expected = _q7_windows(items) if query == 7 else _q8_windows(items)
        assert +made == expected and len(expected) == 3  # the events fill three windows
