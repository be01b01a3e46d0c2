"""The Python-per-event floor (``benchmarks.streaming``'s ``pyspark-python`` runner): per query,
the least any runner that runs Beam's query in Python per event must do, in PySpark with
nothing of a runner around it.

PySpark Structured Streaming over the ``rate`` source hands each micro-batch's rows to
Python in Arrow batches (``mapInArrow``). Each row's event comes from the Python generator
ours runs (``nexmark.event``), at the row's time, and goes through Beam's own user code of
the query up to its grouping: filters, maps, and on windowed queries the window assignment
in Python, as a Beam runner does it: Beam's ``WindowFn.assign`` once per window key (for
Beam's own ``FixedWindows``, ``SlidingWindows`` and ``Sessions`` the windows depend on the
timestamp only), each element given its windows (ours' ``micros_windows``, the least a
runner must do). No windowed values, panes or watermarks of a runner. Across the grouping:

* q0-q2 have none: a ``long`` per row out, how many outputs its event gave;
* q5 and q11 count per key and window, Beam's builtin ``Count``, which a runner could lift
  to Spark: Spark counts natively over the columns Python gave (the window, the key;
  ``Count``'s own pairing of each key with ``None`` is left out, as a runner lifting it
  would). q5's second step, Beam's ``MostBidCombineFn`` (user code, which no runner can lift to
  SQL), runs in Python over each window's counts as the counts come out of Spark, a partial
  result per task, merged per window on the driver with the same ``CombineFn``
  (:func:`floor_q5`). q11's windows are sessions: Python assigns each bid its window
  (``Sessions.assign``), Spark's ``session_window`` merges them (:func:`floor_q11`);
* q7 and q8, whose user code reads a window's grouped elements at its end, keep them as
  Beam-coded bytes until then (``streaming_floor_buffered``).

Each query gives one small row per window (q5, q7, q8: and shard or task; q11: per
session), so the sink costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import nexmark
from benchmarks.streaming_floor_buffered import buffered_floor

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# The queries the floor has.
PYTHON_FLOOR_QUERIES = (0, 1, 2, 5, 7, 8, 11)


@dataclasses.dataclass
class FloorQuery:
    """A floor query's frame and, if it has one, what its sink runs per micro-batch (else
    the ``noop`` sink)."""

    frame: DataFrame
    each_batch: Callable[[DataFrame, int], None] | None = None


def python_floor_steps(query: int) -> Callable[[Any], list[Any]]:
    """Query ``query``'s Beam user code for one event, as plain Python: the outputs of
    one event through the query's own DoFn (q0, Beam's ``RoundTripFn``), or through the
    functions that do its ``Filter`` and ``Map`` steps' work (q1, q2: those of the
    hand-written RDD versions, ``nexmark``, checked against Beam's queries)."""
    from apache_beam.testing.benchmarks.nexmark.queries import query0

    if query == 0:
        round_trip = query0.RoundTripFn()
        return lambda event: list(round_trip.process(event))
    if query == 1:
        return lambda event: [nexmark._to_euro(event)] if nexmark._is_bid(event) else []
    if query == 2:
        return lambda event: [nexmark._q2_project(event)] if nexmark._q2_keep(event) else []
    raise ValueError(
        f"the Python-per-event floor has per-event steps for queries 0, 1 and 2, not query {query}"
    )


def _arrow_columns(batch: pa.RecordBatch) -> tuple[list[int], list[int]]:
    """A ``rate`` batch's event numbers and times (microseconds)."""
    import pyarrow as pa

    micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
    return batch.column("value").to_pylist(), micros


def floor_q5_assign(numbers: Sequence[int], micros: Sequence[int]) -> tuple[list[int], list[int]]:
    """The floor's q5 for one Arrow batch: each row's event, at the row's time, through
    Beam's q5 up to its ``Count``: ``JustBids``' filter, ``SlidingWindows.assign`` (once
    per window key), the ``Map`` to the bid's auction. Per bid and window: the window's
    end (us), the auction."""
    from apache_beam.testing.benchmarks.nexmark.queries import nexmark_query_util as util
    from apache_beam.transforms import window

    from beam_spark_runner.execution.batched_dofns import micros_windows

    assign = micros_windows(
        window.SlidingWindows(
            nexmark.QUERY_ARGS["window_size_sec"], nexmark.QUERY_ARGS["window_period_sec"]
        )
    )
    assert assign is not None, "SlidingWindows' assignment depends on the timestamp only"
    is_bid, event = util.is_bid, nexmark.event
    ends: list[int] = []
    auctions: list[int] = []
    for n, at in zip(numbers, micros, strict=True):
        item = event(n)
        if not is_bid(item):
            continue
        windows = assign(at)
        auction = item.auction  # query5's extract_bid_auction
        for assigned in windows:
            ends.append(assigned.end.micros)
            auctions.append(auction)
    return ends, auctions


def floor_q5_most(
    ends: Sequence[int], auctions: Sequence[int], counts: Sequence[int]
) -> dict[int, tuple[list[int], int]]:
    """Beam's ``MostBidCombineFn`` over counted ``(auction, count)`` pairs, an accumulator
    per window end: what one task of the floor's q5 gives per window."""
    from apache_beam.testing.benchmarks.nexmark.queries.query5 import MostBidCombineFn

    combine = MostBidCombineFn()
    add = combine.add_input
    accumulators: dict[int, Any] = {}
    for end, auction, count in zip(ends, auctions, counts, strict=True):
        accumulator = accumulators.get(end)
        if accumulator is None:
            accumulator = combine.create_accumulator()
        accumulators[end] = add(accumulator, (auction, count))
    return accumulators


def floor_q5_rows(accumulators: Sequence[tuple[list[int], int]]) -> list[dict[str, Any]]:
    """One window's partial ``MostBidCombineFn`` accumulators merged and extracted, then
    q5's last ``FlatMap``: a row per auction with the most bids."""
    from apache_beam.testing.benchmarks.nexmark.queries.nexmark_query_util import ResultNames
    from apache_beam.testing.benchmarks.nexmark.queries.query5 import MostBidCombineFn

    combine = MostBidCombineFn()
    auctions, count = combine.extract_output(combine.merge_accumulators(list(accumulators)))
    return [{ResultNames.AUCTION_ID: auction, ResultNames.NUM: count} for auction in auctions]


def floor_q5(source: DataFrame) -> FloorQuery:
    """The floor's q5: Python assigns each bid its sliding windows (:func:`floor_q5_assign`);
    Spark counts bids per window end and auction, in append mode (the watermark, on the
    window end with the window's size as delay, passes an end when the latest row's time
    does: the latest end of a time ``t`` is ``t``'s period start plus the size); Python
    runs ``MostBidCombineFn`` over each window's counts in each task
    (:func:`floor_q5_most`), and the sink merges a window's partial results
    (:func:`floor_q5_rows`)."""
    import pyarrow as pa

    def assigned(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ends, auctions = floor_q5_assign(*_arrow_columns(batch))
            yield pa.RecordBatch.from_arrays(
                [pa.array(ends, pa.timestamp("us", tz="UTC")), pa.array(auctions, pa.int64())],
                ["end", "auction"],
            )

    def most(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ends: list[int] = []
        auctions: list[int] = []
        counts: list[int] = []
        for batch in batches:
            ends += batch.column("end").cast(pa.int64()).to_pylist()
            auctions += batch.column("auction").to_pylist()
            counts += batch.column("count").to_pylist()
        accumulators = floor_q5_most(ends, auctions, counts)
        if accumulators:
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(list(accumulators), pa.int64()),
                    pa.array([a for a, _ in accumulators.values()], pa.list_(pa.int64())),
                    pa.array([c for _, c in accumulators.values()], pa.int64()),
                ],
                ["end", "auctions", "most"],
            )

    size = f"{nexmark.QUERY_ARGS['window_size_sec']} seconds"
    counted = (
        source.mapInArrow(assigned, "end timestamp, auction long")
        .withWatermark("end", size)
        .groupBy("end", "auction")
        .count()
    )
    partial = counted.mapInArrow(most, "end long, auctions array<long>, most long")

    def each_batch(frame: DataFrame, unused_batch_id: int) -> None:
        windows: dict[int, list[tuple[list[int], int]]] = {}
        for row in frame.collect():
            windows.setdefault(row.end, []).append((list(row.auctions), row.most))
        for accumulators in windows.values():
            floor_q5_rows(accumulators)

    return FloorQuery(partial, each_batch)


def floor_q11_assign(
    numbers: Sequence[int], micros: Sequence[int]
) -> tuple[list[int], list[int], list[int]]:
    """The floor's q11 for one Arrow batch: each row's event, at the row's time, through
    Beam's q11 up to its ``Count``: ``JustBids``' filter, the ``Map`` to the bidder,
    ``Sessions.assign`` (once per timestamp). Per bid: its bidder and its window's start
    and end (us)."""
    from apache_beam.testing.benchmarks.nexmark.queries import nexmark_query_util as util
    from apache_beam.transforms import window

    from beam_spark_runner.execution.batched_dofns import micros_windows

    assign = micros_windows(window.Sessions(nexmark.QUERY_ARGS["window_size_sec"]))
    assert assign is not None, "Sessions' assignment depends on the timestamp only"
    is_bid, event = util.is_bid, nexmark.event
    bidders: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    for n, at in zip(numbers, micros, strict=True):
        item = event(n)
        if not is_bid(item):
            continue
        bidder = item.bidder  # query11's extract_bidder
        (assigned,) = assign(at)
        bidders.append(bidder)
        starts.append(assigned.start.micros)
        ends.append(assigned.end.micros)
    return bidders, starts, ends


def floor_q11(source: DataFrame) -> DataFrame:
    """The floor's q11: Python assigns each bid its session window
    (:func:`floor_q11_assign`); Spark's ``session_window`` over the windows' starts, with
    Beam's gap, merges them, and counts each bidder's bids per session in
    append mode (a row per session, when the watermark passes its end). Beam's last
    ``Map`` (a dict per session) is left out: sessions rarely close within a trial."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    def assigned(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            bidders, starts, _ = floor_q11_assign(*_arrow_columns(batch))
            yield pa.RecordBatch.from_arrays(
                [pa.array(bidders, pa.int64()), pa.array(starts, pa.timestamp("us", tz="UTC"))],
                ["bidder", "start"],
            )

    gap = f"{nexmark.QUERY_ARGS['window_size_sec']} seconds"  # Sessions' gap: its windows' length
    sessions = (
        source.mapInArrow(assigned, "bidder long, start timestamp")
        .withWatermark("start", "0 seconds")
        .groupBy(F.session_window("start", gap), "bidder")
        .count()
    )
    return sessions.select(F.col("session_window.end").alias("end"), "bidder", "count")


def _stateless(query: int, source: DataFrame) -> DataFrame:
    """q0-q2: a ``long`` per row, how many outputs its event gave."""
    import pyarrow as pa

    python_floor_steps(query)  # fails here, not in a task, for a query without steps

    def per_event(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        steps = python_floor_steps(query)
        event = nexmark.event
        for batch in batches:
            outputs = [len(steps(event(n))) for n in batch.column("value").to_pylist()]
            yield pa.RecordBatch.from_arrays([pa.array(outputs, pa.int64())], ["outputs"])

    return source.select("value").mapInArrow(per_event, "outputs long")


def floor_query(query: int, source: DataFrame) -> FloorQuery:
    """The floor's query ``query`` over the ``rate`` source's rows (``value``, ``timestamp``)."""
    if query not in PYTHON_FLOOR_QUERIES:
        raise ValueError(
            f"the Python-per-event floor has queries {PYTHON_FLOOR_QUERIES}, not query {query}"
        )
    if query == 5:
        return floor_q5(source)
    if query in (7, 8):
        return FloorQuery(buffered_floor(query, source))
    if query == 11:
        return FloorQuery(floor_q11(source))
    return FloorQuery(_stateless(query, source))


def batch_step(query: int) -> Callable[[pa.RecordBatch], int]:
    """The Python the floor's first ``mapInArrow`` runs on one ``rate`` batch, as a function
    giving how many rows it made (``benchmarks.first_stage_cpu`` times it)."""
    from benchmarks.streaming_floor_buffered import floor_q7_pack, floor_q8_pack

    if query == 5:
        return lambda batch: len(floor_q5_assign(*_arrow_columns(batch))[0])
    if query == 7:
        return lambda batch: len(floor_q7_pack(*_arrow_columns(batch)))
    if query == 8:
        return lambda batch: len(floor_q8_pack(*_arrow_columns(batch), 2))
    if query == 11:
        return lambda batch: len(floor_q11_assign(*_arrow_columns(batch))[0])
    steps, event = python_floor_steps(query), nexmark.event
    return lambda batch: sum(len(steps(event(n))) for n in batch.column("value").to_pylist())
