"""The Python-per-event floor's q7 and q8: elements kept as Beam-coded bytes to their window's end.

Where Beam's user code reads a window's grouped elements at its end (q7's ``SelectMaxBidFn``
over the window's bids, q8's ``JoinPersonAuctionFn`` over each key's persons and auctions), a
runner must keep those elements until then. The least it can do per element, besides making
it and running the query's code up to the grouping: encode it with the pipeline's coder and
keep the bytes. So the floor's Python encodes each element with the coder Beam gives it
there, concatenates an Arrow batch's elements of one window (and shard) and compresses them
as ours compresses what it buffers (``streaming.compression.pack``): one run. Spark hands the
runs to a ``transformWithState`` per shard, which keeps them in a list state with an
event-time timer at the window's end; when Spark's watermark (the rows' latest time, no
delay) passes it, the shard decodes the window's runs and hands them to Beam's user code,
and gives one row: the window and how many outputs it made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import nexmark

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

# A window's elements of one Arrow batch (and shard): its start (us) -> (run, highest price
# (q7; 0 on q8), latest time (us)).
Runs = dict[tuple[int, int], tuple[bytes, int, int]]
# A window's end for one shard: (start us, highest price sent, runs) -> how many outputs.
Finish = Callable[[int, int, list[bytes]], int]
WINDOW_MICROS = nexmark.WINDOW_SIZE_MS * 1000


def floor_q7_pack(
    numbers: Sequence[int], micros: Sequence[int]
) -> dict[int, tuple[bytes, int, int]]:
    """The floor's q7 for one Arrow batch of the ``rate`` source's rows: event ``n`` of
    each row, at the row's time (``micros``, microseconds); per fixed window (its start in
    microseconds), its bids encoded by Beam's coder for the query's bids, concatenated and
    compressed as ours compresses what it buffers (``streaming.compression.pack``), with
    their highest price and latest time.

    The bids have no type hint, so Beam's coder is ``FastPrimitivesCoder``, which pickles
    them. That is the least a runner buffering Beam's elements until their window's
    highest price is known must do per event, besides making it: encode it, and keep it.
    """
    from apache_beam.coders import coders
    from apache_beam.coders.coder_impl import create_OutputStream

    from beam_spark_runner.streaming.compression import pack

    encode = coders.FastPrimitivesCoder().get_impl().encode_to_stream
    is_bid, event = nexmark._is_bid, nexmark.event
    windows: dict[int, list[Any]] = {}
    for n, at in zip(numbers, micros, strict=True):
        item = event(n)
        if not is_bid(item):
            continue
        start = at - at % WINDOW_MICROS
        kept = windows.get(start)
        if kept is None:
            kept = windows[start] = [create_OutputStream(), item.price, at]
        encode(item, kept[0], True)
        if item.price > kept[1]:
            kept[1] = item.price
        if at > kept[2]:
            kept[2] = at
    return {
        start: (pack(out.get()), best, latest) for start, (out, best, latest) in windows.items()
    }


def floor_q7_select(best: int, packed: Sequence[bytes]) -> list[Any]:
    """The floor's q7 for one window: its bids (runs :func:`floor_q7_pack` made) decoded
    by Beam's coder and passed through Beam's ``SelectMaxBidFn`` with the window's highest
    price as its side input."""
    from apache_beam.coders import coders
    from apache_beam.coders.coder_impl import create_InputStream
    from apache_beam.testing.benchmarks.nexmark.queries.query7 import SelectMaxBidFn

    from beam_spark_runner.streaming.compression import unpack

    decode = coders.FastPrimitivesCoder().get_impl().decode_from_stream
    select = SelectMaxBidFn().process
    selected: list[Any] = []
    for data in packed:
        stream = create_InputStream(unpack(data))
        while stream.size():
            selected.extend(select(decode(stream, True), best))
    return selected


def q8_coder() -> Any:
    """The coder Beam gives q8's ``CoGroupByKey`` input (its ``GroupByKey``'s): the key
    deterministic, the value its tag and the element (no type hint: pickled)."""
    from apache_beam.coders import coders

    key = coders.DeterministicFastPrimitivesCoderV2(coders.FastPrimitivesCoder(), "CoGroupByKey")
    tagged = coders.TupleCoder([coders.StrUtf8Coder(), coders.FastPrimitivesCoder()])
    return coders.TupleCoder([key, tagged])


def floor_q8_pack(numbers: Sequence[int], micros: Sequence[int], shards: int) -> Runs:
    """The floor's q8 for one Arrow batch of the ``rate`` source's rows: each row's event,
    at the row's time, through Beam's q8 up to its ``CoGroupByKey``: both branches' filters
    (``JustPerson``, ``JustAuctions``: every event goes through both), the window
    assignment (``FixedWindows.assign`` once per window, as ours' ``micros_windows``),
    ``PersonByIdFn`` or ``AuctionBySellerFn`` and ``CoGroupByKey``'s tagging; each tagged
    element encoded by :func:`q8_coder` into the compressed run of its window and of its
    key's shard (the key modulo ``shards``), with the run's latest time."""
    from apache_beam.coders.coder_impl import create_OutputStream
    from apache_beam.testing.benchmarks.nexmark.queries import nexmark_query_util as util
    from apache_beam.transforms import window

    from beam_spark_runner.execution.batched_dofns import micros_windows
    from beam_spark_runner.streaming.compression import pack

    encode = q8_coder().get_impl().encode_to_stream
    assign = micros_windows(window.FixedWindows(nexmark.QUERY_ARGS["window_size_sec"]))
    assert assign is not None, "FixedWindows' assignment depends on the timestamp only"
    person_by_id = util.PersonByIdFn().process
    auction_by_seller = util.AuctionBySellerFn().process
    is_person, is_auction, event = util.is_person, util.is_auction, nexmark.event
    runs: dict[tuple[int, int], list[Any]] = {}
    for n, at in zip(numbers, micros, strict=True):
        item = event(n)
        person, auction = is_person(item), is_auction(item)
        if not (person or auction):
            continue
        (assigned,) = assign(at)
        keyed, tag = (
            (person_by_id, util.PERSON_TAG) if person else (auction_by_seller, util.AUCTION_TAG)
        )
        for key, value in keyed(item):
            index = (assigned.start.micros, key % shards)
            kept = runs.get(index)
            if kept is None:
                kept = runs[index] = [create_OutputStream(), at]
            encode((key, (tag, value)), kept[0], True)  # _CoGBKImpl's add_tag
            if at > kept[1]:
                kept[1] = at
    return {index: (pack(out.get()), 0, latest) for index, (out, latest) in runs.items()}


def floor_q8_join(packed: Sequence[bytes]) -> list[Any]:
    """The floor's q8 for one window and shard: its runs (:func:`floor_q8_pack`) decoded,
    grouped by key as ``CoGroupByKey`` groups them (the ``{tag: [values]}`` of its
    ``collect_values``), and each key's group passed through Beam's ``JoinPersonAuctionFn``."""
    from apache_beam.coders.coder_impl import create_InputStream
    from apache_beam.testing.benchmarks.nexmark.queries import nexmark_query_util as util
    from apache_beam.testing.benchmarks.nexmark.queries.query8 import JoinPersonAuctionFn

    from beam_spark_runner.streaming.compression import unpack

    decode = q8_coder().get_impl().decode_from_stream
    grouped: dict[Any, list[Any]] = {}
    for data in packed:
        stream = create_InputStream(unpack(data))
        while stream.size():
            key, tagged = decode(stream, True)
            grouped.setdefault(key, []).append(tagged)
    join = JoinPersonAuctionFn().process
    joined: list[Any] = []
    for key, tagged_values in grouped.items():
        values: dict[str, list[Any]] = {util.PERSON_TAG: [], util.AUCTION_TAG: []}
        for tag, value in tagged_values:
            values[tag].append(value)
        joined.extend(join((key, values)))
    return joined


def floor_shards(spark: Any) -> tuple[int, ...]:
    """A shard number per shuffle partition, each landing on its own partition when Spark
    groups by it (Spark hashes a grouping key as ``hash`` does, modulo the partitions),
    so each shard's elements are decoded on their own core."""
    from pyspark.sql import functions as F

    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    numbers = spark.range(64).select(F.col("id").cast("int").alias("shard"))
    placed = numbers.select("shard", F.pmod(F.hash("shard"), F.lit(partitions)).alias("p"))
    first: dict[int, int] = {}
    for row in placed.collect():
        first.setdefault(row.p, row.shard)
    return tuple(first[p] for p in sorted(first))


def _processor(finish: Finish) -> Any:
    """A shard of the floor's q7 or q8 (a ``transformWithState`` processor; PySpark before
    4.0 has none, hence made on demand): it keeps each window's compressed runs and every
    highest price it is sent in a list state, with an event-time timer at the window's
    end; when Spark's watermark passes it, ``finish`` gets the window's runs."""
    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    class FloorShard(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            fields = [
                StructField("window", LongType()),
                StructField("best", LongType()),
                StructField("runs", BinaryType()),
            ]
            self.handle = handle
            self.kept = handle.getListState("kept", StructType(fields))

        def handleInputRows(  # noqa: N802 - PySpark's name
            self,
            key: Any,
            rows: Iterator[Any],
            timerValues: Any,  # noqa: N803
        ) -> Iterator[Any]:
            added = [(row.window, row.best, row.runs) for row in rows]
            self.kept.appendList(added)
            for start in {window for window, _, _ in added}:
                self.handle.registerTimer((start + WINDOW_MICROS) // 1000)
            return iter(())

        def handleExpiredTimer(  # noqa: N802 - PySpark's name
            self,
            key: Any,
            timerValues: Any,  # noqa: N803
            expiredTimerInfo: Any,  # noqa: N803
        ) -> Iterator[Any]:
            start = expiredTimerInfo.getExpiryTimeInMs() * 1000 - WINDOW_MICROS
            best, runs, kept = -1, [], []
            for window, price, data in self.kept.get():
                if window == start:
                    best = max(best, price)
                    if data:
                        runs.append(bytes(data))
                else:
                    kept.append((window, price, bytes(data)))
            if kept:
                self.kept.put(kept)
            else:
                self.kept.clear()
            yield Row(window=start, outputs=finish(start, best, runs))

        def close(self) -> None:
            pass

    return FloorShard()


def _q7_finish(start: int, best: int, runs: list[bytes]) -> int:
    return len(floor_q7_select(best, runs))


def _q8_finish(start: int, best: int, runs: list[bytes]) -> int:
    return len(floor_q8_join(runs))


def buffered_floor(query: int, source: DataFrame) -> DataFrame:
    """The floor's q7 or q8 over the ``rate`` source (see the module doc). q7: each
    batch's run of a window goes to the shard of the task that made it, the window's
    highest price to every shard (as ours sends a side input's elements). q8: a run goes
    to the shard of its keys. One row per window and shard out."""
    import pyarrow as pa
    from pyspark import TaskContext

    if query not in (7, 8):
        raise ValueError(f"the buffered floor has queries 7 and 8, not query {query}")
    if not hasattr(source.groupBy(), "transformWithState"):
        raise RuntimeError(
            f"the floor's q{query} keeps its runs in transformWithState, which PySpark "
            f"{source.sparkSession.version} lacks: run it on PySpark 4.1 or later"
        )
    shards = floor_shards(source.sparkSession)

    def rows(batch: pa.RecordBatch, mine: int) -> list[tuple[int, int, int, int, bytes]]:
        numbers = batch.column("value").to_pylist()
        micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
        if query == 7:
            return [
                (shard, start, latest, best, runs if shard == mine else b"")
                for start, (runs, best, latest) in floor_q7_pack(numbers, micros).items()
                for shard in shards
            ]
        packed = floor_q8_pack(numbers, micros, len(shards))
        return [
            (shards[index], start, latest, 0, runs)
            for (start, index), (runs, _, latest) in packed.items()
        ]

    def packed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        assert context is not None, "mapInArrow runs its function in a Spark task"
        mine = shards[context.partitionId() % len(shards)]
        for batch in batches:
            made = rows(batch, mine)
            if not made:
                continue
            shard, start, latest, best, runs = (list(column) for column in zip(*made, strict=True))
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(shard, pa.int32()),
                    pa.array(start, pa.int64()),
                    pa.array(latest, pa.timestamp("us", tz="UTC")),
                    pa.array(best, pa.int64()),
                    pa.array(runs, pa.binary()),
                ],
                ["shard", "window", "t", "best", "runs"],
            )

    schema = "shard int, window long, t timestamp, best long, runs binary"
    finish = _q7_finish if query == 7 else _q8_finish
    return (
        source.mapInArrow(packed, schema)
        .withWatermark("t", "0 seconds")
        .groupBy("shard")
        .transformWithState(_processor(finish), "window long, outputs long", "Append", "EventTime")
    )
