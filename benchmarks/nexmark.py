"""A deterministic Nexmark event generator, in Python and in Spark SQL, and Beam's queries.

Beam's Nexmark launcher (``apache_beam.testing.benchmarks.nexmark``) reads a JSON-lines
event file that only Beam's Java suite writes. This module generates the events instead,
as a pure function of the event number ``n``, so every runner sees the same events:

* events come in epochs of 50: 1 person, 3 auctions, 46 bids (Nexmark's 1:3:46);
* ids start at 1000; an auction's seller and a bid's bidder are persons that already
  exist, a bid's auction is an auction that already exists;
* the other fields come from three 32-bit multiplicative hashes of ``n``, written with
  integer arithmetic that Spark SQL evaluates identically (no floating point, no RNG);
* event time is ``BASE_TIME_MS + n`` milliseconds; as the launcher does, every event is
  timestamped with its ``date_time``.

The queries themselves are Beam's own ``queryN.load(events, query_args)``, with the
launcher's query arguments; the hand-written PySpark and Spark SQL versions of each query
are here too, next to a *fingerprint* of each query's output element, summed into a
checksum so that runners can be compared on more than a count.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from apache_beam.testing.benchmarks.nexmark.models import auction_bid, nexmark_model
from apache_beam.testing.benchmarks.nexmark.queries.nexmark_query_util import ResultNames
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import Column, DataFrame, SparkSession

Event = Any  # nexmark_model.Person | nexmark_model.Auction | nexmark_model.Bid

BASE_TIME_MS = 1_700_000_000_000
EPOCH = 50  # events per epoch: offset 0 is a person, 1..3 auctions, 4..49 bids
FIRST_ID = 1000
USD_TO_EURO = 0.89  # query1.USD_TO_EURO
# The launcher's query arguments (nexmark_launcher.NexmarkLauncher.run).
QUERY_ARGS: dict[str, int] = {
    "auction_skip": 123,
    "window_size_sec": 10,
    "window_period_sec": 5,
    "fanout": 5,
    "num_max_workers": 5,
    "max_log_events": 100000,
    "occasional_delay_sec": 3,
    "max_auction_waiting_time": 600,
}
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10
WINDOW_SIZE_MS = QUERY_ARGS["window_size_sec"] * 1000
WINDOW_PERIOD_MS = QUERY_ARGS["window_period_sec"] * 1000

_M32 = 1 << 32
_K1, _C1, _K2 = 2654435761, 97531, 69069
STATES = ("OR", "ID", "CA", "WA", "NY", "AZ", "NV", "UT", "TX", "MA")
CITIES = (
    "Portland",
    "Boise",
    "San Francisco",
    "Seattle",
    "New York",
    "Phoenix",
    "Reno",
    "Provo",
    "Austin",
    "Boston",
)
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones")
FILLER = "abcdefghijklmnopqrstuvwxyz0123456789" * 4


def _hashes(n: int) -> tuple[int, int, int]:
    h1 = (n * _K1 + _C1) % _M32
    h2 = (h1 * _K2 + 1) % _M32
    h3 = (h2 * _K2 + 1) % _M32
    return h1, h2, h3


def event(n: int) -> Event:
    """The ``n``-th event (0-based)."""
    epoch, offset = divmod(n, EPOCH)
    h1, h2, h3 = _hashes(n)
    millis = BASE_TIME_MS + n
    date_time = Timestamp(micros=millis * 1000)
    if offset == 0:
        person_id = FIRST_ID + epoch
        return nexmark_model.Person(
            person_id,
            f"{FIRST_NAMES[h1 % 8]} {LAST_NAMES[h2 % 8]}",
            f"p{person_id}@example.com",
            str(h3),
            CITIES[h2 % 10],
            STATES[h3 % 10],
            date_time,
            FILLER[: 20 + h1 % 40],
        )
    if offset <= 3:
        initial_bid = 100 + h1 % 1000
        return nexmark_model.Auction(
            FIRST_ID + epoch * 3 + offset - 1,
            f"item {h1 % 1000}",
            f"description {h2 % 1000}",
            initial_bid,
            initial_bid + h2 % 1000,
            date_time,
            Timestamp(micros=(millis + 10_000 + h3 % 100_000) * 1000),
            FIRST_ID + h2 % (epoch + 1),
            Q3_CATEGORY + h3 % 5,
            FILLER[: 40 + h1 % 80],
        )
    return nexmark_model.Bid(
        FIRST_ID + h1 % (3 * (epoch + 1)),
        FIRST_ID + h2 % (epoch + 1),
        100 + h3 % 100_000,
        date_time,
        FILLER[: 10 + h1 % 20],
    )


def events(start: int, stop: int) -> Iterator[Event]:
    """Events ``start`` to ``stop - 1``."""
    return (event(n) for n in range(start, stop))


def timestamped_events(seed: int, total: int, seeds: int) -> Iterator[Any]:
    """The share of events of one seed, timestamped as the Nexmark launcher does."""
    start, stop = seed_range(seed, total, seeds)
    for item in events(start, stop):
        yield window.TimestampedValue(item, item.date_time)


def seed_range(seed: int, total: int, seeds: int) -> tuple[int, int]:
    """The ``[start, stop)`` range of element numbers that one of ``seeds`` seeds expands to."""
    return seed * total // seeds, (seed + 1) * total // seeds


# --- Fingerprints: one int per output element of each query, summed into a checksum.


def event_fingerprint(item: Event) -> int:
    """Query 0 outputs events: a person's or auction's id, a bid's auction."""
    if isinstance(item, nexmark_model.Bid):
        return int(item.auction)
    return int(item.id)


def q1_fingerprint(bid: Any) -> int:
    """Query 1 outputs bids priced in euros: the price, truncated."""
    return int(bid.price)


def q2_fingerprint(row: dict[str, Any]) -> int:
    """Query 2 outputs {auction_id, price}."""
    return int(row[ResultNames.AUCTION_ID]) + int(row[ResultNames.PRICE])


def q3_fingerprint(row: dict[str, Any]) -> int:
    """Query 3 outputs {name, city, state, auction_id}."""
    return int(row[ResultNames.AUCTION_ID])


def _bid_fingerprint(bid: Any) -> int:
    return int(bid.auction) * 1_000_003 + int(bid.bidder) * 1_009 + int(bid.price)


def q4_fingerprint(row: dict[str, Any]) -> int:
    """Query 4 outputs {category, price, is_last}: per sliding window, a category's mean price.

    ``is_last`` is left out: Beam's Python trigger driver (FnApiRunner's, and so ours) marks
    the on-time pane of a non-global window ``is_last=False`` in batch, though with the
    default trigger it is the last pane (docs/performance.md); the hand-written versions
    have no panes.
    """
    return int(row[ResultNames.CATEGORY]) * 10**9 + int(row[ResultNames.PRICE] * 1000)


def q5_fingerprint(row: dict[str, Any]) -> int:
    """Query 5 outputs {auction_id, num}: per window, each auction with the most bids."""
    return int(row[ResultNames.AUCTION_ID]) * 100_000 + int(row[ResultNames.NUM])


def q7_fingerprint(bid: Any) -> int:
    """Query 7 outputs the bids with the highest price of their window: auction, bidder, price."""
    return _bid_fingerprint(bid)


def q8_fingerprint(row: dict[str, Any]) -> int:
    """Query 8 outputs {id, name, reserve}: a new person's id and their new auction's reserve."""
    return int(row[ResultNames.ID]) * 10_000 + int(row[ResultNames.RESERVE])


def q9_fingerprint(winner: Any) -> int:
    """Query 9 outputs AuctionBid(auction, winning bid): the auction's id and the bid."""
    return int(winner.auction.id) * 1_000_003 + _bid_fingerprint(winner.bid)


def q11_fingerprint(row: dict[str, Any]) -> int:
    """Query 11 outputs {bidder_id, bid_count}: a bidder's bids in one session.

    The count enters squared: the counts alone sum to the number of bids however the
    sessions are cut.
    """
    count = int(row[ResultNames.BID_COUNT])
    return int(row[ResultNames.BIDDER_ID]) * 1_000_000 + count * count


FINGERPRINTS: dict[int, Callable[[Any], int]] = {
    0: event_fingerprint,
    1: q1_fingerprint,
    2: q2_fingerprint,
    3: q3_fingerprint,
    4: q4_fingerprint,
    5: q5_fingerprint,
    7: q7_fingerprint,
    8: q8_fingerprint,
    9: q9_fingerprint,
    11: q11_fingerprint,
}


# --- Hand-written PySpark (RDD of the same Python event objects).


def _round_trip(item: Event) -> Event:
    coder = item.CODER
    return coder.decode(coder.encode(item))


def _to_euro(bid: Any) -> Any:
    return nexmark_model.Bid(
        bid.auction, bid.bidder, bid.price * USD_TO_EURO, bid.date_time, bid.extra
    )


def _is_bid(item: Event) -> bool:
    return isinstance(item, nexmark_model.Bid)


def _q2_keep(item: Event) -> bool:
    return isinstance(item, nexmark_model.Bid) and item.auction % QUERY_ARGS["auction_skip"] == 0


def _q2_project(bid: Any) -> dict[str, Any]:
    return {ResultNames.AUCTION_ID: bid.auction, ResultNames.PRICE: bid.price}


def _q3_auction(item: Event) -> bool:
    return isinstance(item, nexmark_model.Auction) and item.category == Q3_CATEGORY


def _q3_person(item: Event) -> bool:
    return isinstance(item, nexmark_model.Person) and item.state in Q3_STATES


def _q3_project(joined: tuple[int, tuple[Any, Any]]) -> dict[str, Any]:
    _, (auction, person) = joined
    return {
        ResultNames.NAME: person.name,
        ResultNames.CITY: person.city,
        ResultNames.STATE: person.state,
        ResultNames.AUCTION_ID: auction.id,
    }


def millis(item: Event) -> int:
    """An event's time (its element timestamp) in milliseconds."""
    return int(item.date_time.micros) // 1000


def fixed_window(ms: int) -> int:
    """The start of the FixedWindows(window_size_sec) window holding time ``ms``."""
    return ms - ms % WINDOW_SIZE_MS


def sliding_windows(time: int, per_ms: int = 1) -> range:
    """The starts of the SlidingWindows(window_size_sec, window_period_sec) windows of ``time``.

    As Beam's ``SlidingWindows.assign``: every ``[start, start + size)`` with ``start`` a
    multiple of the period that holds ``time``. ``time`` and the starts are in units of
    ``1 / per_ms`` ms (1: milliseconds, 1000: microseconds).
    """
    period, size = WINDOW_PERIOD_MS * per_ms, WINDOW_SIZE_MS * per_ms
    return range(time - time % period, time - size, -period)


def _q5_window_auction_ones(bid: Any) -> Iterator[tuple[tuple[int, int], int]]:
    for start in sliding_windows(millis(bid)):
        yield (start, bid.auction), 1


def _q5_by_window(counted: tuple[tuple[int, int], int]) -> tuple[int, tuple[int, list[int]]]:
    (start, auction), count = counted
    return start, (count, [auction])


def _most(a: tuple[int, list[Any]], b: tuple[int, list[Any]]) -> tuple[int, list[Any]]:
    """The larger of two (value, items) pairs; on a tie, both pairs' items."""
    if a[0] == b[0]:
        return a[0], a[1] + b[1]
    return a if a[0] > b[0] else b


def _q5_rows(windowed: tuple[int, tuple[int, list[int]]]) -> list[dict[str, Any]]:
    _, (count, auctions) = windowed
    return [{ResultNames.AUCTION_ID: a, ResultNames.NUM: count} for a in auctions]


def _q7_by_window(bid: Any) -> tuple[int, tuple[int, list[Any]]]:
    return fixed_window(millis(bid)), (bid.price, [bid])


def _q7_bids(windowed: tuple[int, tuple[int, list[Any]]]) -> list[Any]:
    return windowed[1][1]


def _is_person(item: Event) -> bool:
    return isinstance(item, nexmark_model.Person)


def _is_auction(item: Event) -> bool:
    return isinstance(item, nexmark_model.Auction)


def _q8_person_key(person: Any) -> tuple[int, int]:
    return fixed_window(millis(person)), person.id


def _q8_auction_key(auction: Any) -> tuple[int, int]:
    return fixed_window(millis(auction)), auction.seller


def _q8_project(joined: tuple[tuple[int, int], tuple[Any, Any]]) -> dict[str, Any]:
    _, (person, auction) = joined
    return {
        ResultNames.ID: person.id,
        ResultNames.NAME: person.name,
        ResultNames.RESERVE: auction.reserve,
    }


def _higher_bid(bid: Any, other: Any) -> bool:
    """winning_bids.JoinAuctionBidFn.higher_bid: higher price, then the earlier bid."""
    if bid.price != other.price:
        return bool(bid.price > other.price)
    return bool(bid.date_time < other.date_time)


def _q9_candidate(joined: tuple[int, tuple[Any, Any]]) -> bool:
    """A bid takes part in its auction if it falls in the auction's window, reserve met.

    WinningBids merges a bid's window into its auction's ``[date_time, expires)`` when the
    bid's window starts (at the bid's time) before ``expires``; every bid of an auction
    comes after the auction here, so that is exactly ``bid time < expires``. Bid windows
    not merged hold no auction and give no output. JoinAuctionBidFn skips bids below
    the reserve.
    """
    _, (auction, bid) = joined
    return bool(bid.date_time < auction.expires and bid.price >= auction.reserve)


def _q9_better(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    return b if _higher_bid(b[1], a[1]) else a


def _q9_winner(best: tuple[int, tuple[Any, Any]]) -> Any:
    auction, bid = best[1]
    return auction_bid.AuctionBid(auction, bid)


def _q4_window_category_prices(
    winner: Any,
) -> Iterator[tuple[tuple[int, int], tuple[int, int]]]:
    """A winning bid's (window, category) keys, each with (price, 1).

    WinningBids' CoGroupByKey outputs at the end of the merged auction window (the default
    timestamp combiner, end of window): at ``expires`` minus one microsecond, which is
    where query 4's SlidingWindows places the winning bid.
    """
    output_time = int(winner.auction.expires.micros) - 1
    for start in sliding_windows(output_time, per_ms=1000):
        yield (start, winner.auction.category), (winner.bid.price, 1)


def _add_pairs(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], a[1] + b[1]


def _q4_row(summed: tuple[tuple[int, int], tuple[int, int]]) -> dict[str, Any]:
    """MeanCombineFn's output (sum / count), projected; the only pane is the last."""
    (_, category), (total, count) = summed
    return {
        ResultNames.CATEGORY: category,
        ResultNames.PRICE: total / count,
        ResultNames.IS_LAST: True,
    }


def _q11_bidder_time(bid: Any) -> tuple[int, int]:
    return bid.bidder, millis(bid)


def _q11_sessions(grouped: tuple[int, Iterable[int]]) -> Iterator[dict[str, Any]]:
    """A bidder's bids counted per session, as Beam's ``Sessions(gap)`` merges them.

    Each bid's window is ``[t, t + gap)``; windows sorted by start merge while the next one
    starts before the merged end, so a session ends where a bid comes ``gap`` or more after
    the previous one. query11's early trigger (AfterCount(max_log_events)) never fires: no
    session reaches max_log_events bids here, so each session is one on-time pane.
    """
    bidder, times = grouped
    count, previous = 0, None
    for ms in sorted(times):
        if previous is not None and ms >= previous + WINDOW_SIZE_MS:
            yield {ResultNames.BIDDER_ID: bidder, ResultNames.BID_COUNT: count}
            count = 0
        count += 1
        previous = ms
    if count:
        yield {ResultNames.BIDDER_ID: bidder, ResultNames.BID_COUNT: count}


def python_query(query: int, items: Iterable[Event]) -> list[Any]:
    """Query ``query`` in plain Python over events (for tests): the same functions as PySpark."""
    events_list = list(items)
    if query == 4:
        sums = _reduce_by_key(
            (kv for w in python_query(9, events_list) for kv in _q4_window_category_prices(w)),
            _add_pairs,
        )
        return [_q4_row(kv) for kv in sums]
    if query == 5:
        counts: dict[tuple[int, int], int] = {}
        for bid in filter(_is_bid, events_list):
            for key, one in _q5_window_auction_ones(bid):
                counts[key] = counts.get(key, 0) + one
        return [
            row
            for best in _reduce_by_key(map(_q5_by_window, counts.items()), _most)
            for row in _q5_rows(best)
        ]
    if query == 7:
        by_window = map(_q7_by_window, filter(_is_bid, events_list))
        return [bid for best in _reduce_by_key(by_window, _most) for bid in _q7_bids(best)]
    if query == 8:
        persons = {_q8_person_key(p): p for p in filter(_is_person, events_list)}
        return [
            _q8_project((key, (persons[key], a)))
            for a in filter(_is_auction, events_list)
            if (key := _q8_auction_key(a)) in persons
        ]
    if query == 9:
        auctions = {a.id: a for a in filter(_is_auction, events_list)}
        joined = [(b.auction, (auctions[b.auction], b)) for b in filter(_is_bid, events_list)]
        candidates = [(k, pair) for k, pair in joined if _q9_candidate((k, pair))]
        return [_q9_winner(best) for best in _reduce_by_key(candidates, _q9_better)]
    if query == 11:
        by_bidder: dict[int, list[int]] = {}
        for bidder, ms in map(_q11_bidder_time, filter(_is_bid, events_list)):
            by_bidder.setdefault(bidder, []).append(ms)
        return [row for grouped in by_bidder.items() for row in _q11_sessions(grouped)]
    raise ValueError(f"no plain Python version of Nexmark query {query}")


def _reduce_by_key(pairs: Iterable[tuple[Any, Any]], merge: Callable[[Any, Any], Any]) -> list[Any]:
    merged: dict[Any, Any] = {}
    for key, value in pairs:
        merged[key] = merge(merged[key], value) if key in merged else value
    return list(merged.items())


def pyspark_query(query: int, event_rdd: RDD[Any]) -> RDD[Any]:
    """Query ``query`` over an RDD of events, in plain PySpark; its output elements."""
    if query == 0:
        return event_rdd.map(_round_trip)
    if query == 1:
        return event_rdd.filter(_is_bid).map(_to_euro)
    if query == 2:
        return event_rdd.filter(_q2_keep).map(_q2_project)
    if query == 3:
        auctions = event_rdd.filter(_q3_auction).keyBy(lambda a: a.seller)
        persons = event_rdd.filter(_q3_person).keyBy(lambda p: p.id)
        return auctions.join(persons).map(_q3_project)
    if query == 5:
        counts = (
            event_rdd.filter(_is_bid).flatMap(_q5_window_auction_ones).reduceByKey(operator.add)
        )
        return counts.map(_q5_by_window).reduceByKey(_most).flatMap(_q5_rows)
    if query == 7:
        return event_rdd.filter(_is_bid).map(_q7_by_window).reduceByKey(_most).flatMap(_q7_bids)
    if query == 8:
        persons = event_rdd.filter(_is_person).keyBy(_q8_person_key)
        auctions = event_rdd.filter(_is_auction).keyBy(_q8_auction_key)
        return persons.join(auctions).map(_q8_project)
    if query == 9:
        auctions = event_rdd.filter(_is_auction).keyBy(lambda a: a.id)
        bids = event_rdd.filter(_is_bid).keyBy(lambda b: b.auction)
        candidates = auctions.join(bids).filter(_q9_candidate)
        return candidates.reduceByKey(_q9_better).map(_q9_winner)
    if query == 4:
        winners = pyspark_query(9, event_rdd)
        return winners.flatMap(_q4_window_category_prices).reduceByKey(_add_pairs).map(_q4_row)
    if query == 11:
        return event_rdd.filter(_is_bid).map(_q11_bidder_time).groupByKey().flatMap(_q11_sessions)
    raise ValueError(f"no PySpark version of Nexmark query {query}")


# --- Spark SQL: the same events as columns, and each query over them.


def sql_events(spark: SparkSession, total: int, partitions: int) -> DataFrame:
    """The events 0..total-1 as a DataFrame with the fields the queries need.

    ``kind`` is 0 for a person, 1 for an auction, 2 for a bid. Columns a query does not
    read are never computed (Spark prunes them), as a SQL engine should.
    """
    return event_columns(spark.range(0, total, 1, partitions))


def event_columns(frame: DataFrame, keep: tuple[str, ...] = ()) -> DataFrame:
    """The events whose numbers are ``frame``'s ``id`` column, as ``sql_events`` has them,
    plus ``frame``'s columns named in ``keep``, unchanged.

    A streaming DataFrame works too (the streaming benchmark numbers Spark's ``rate``
    source's rows so, and keeps its ``timestamp`` as the event time).
    """
    from pyspark.sql import functions as F

    def pick(values: tuple[str, ...], index: Column) -> Column:
        return F.element_at(F.array(*[F.lit(v) for v in values]), (index + 1).cast("int"))

    n = F.col("id")
    frame = frame.select(
        n.alias("n"),
        (n / EPOCH).cast("long").alias("epoch"),
        (n % EPOCH).alias("offset"),
        ((n * F.lit(_K1) + F.lit(_C1)) % F.lit(_M32)).alias("h1"),
        *keep,
    )
    frame = frame.withColumn("h2", (F.col("h1") * F.lit(_K2) + 1) % F.lit(_M32))
    frame = frame.withColumn("h3", (F.col("h2") * F.lit(_K2) + 1) % F.lit(_M32))
    epoch, offset = F.col("epoch"), F.col("offset")
    h1, h2, h3 = F.col("h1"), F.col("h2"), F.col("h3")
    kind = F.when(offset == 0, 0).when(offset <= 3, 1).otherwise(2)
    return frame.select(
        kind.alias("kind"),
        F.when(offset == 0, F.lit(FIRST_ID) + epoch)
        .when(offset <= 3, F.lit(FIRST_ID) + epoch * 3 + offset - 1)
        .alias("id"),
        pick(STATES, h3 % 10).alias("state"),
        pick(CITIES, h2 % 10).alias("city"),
        F.concat(pick(FIRST_NAMES, h1 % 8), F.lit(" "), pick(LAST_NAMES, h2 % 8)).alias("name"),
        (F.lit(FIRST_ID) + h2 % (epoch + 1)).alias("seller"),
        (F.lit(FIRST_ID) + h2 % (epoch + 1)).alias("bidder"),
        (F.lit(100) + h1 % 1000 + h2 % 1000).alias("reserve"),
        (F.lit(BASE_TIME_MS) + F.col("n")).alias("ms"),
        (F.lit(BASE_TIME_MS + 10_000) + F.col("n") + h3 % 100_000).alias("expires"),
        (F.lit(Q3_CATEGORY) + h3 % 5).alias("category"),
        (F.lit(FIRST_ID) + h1 % (epoch * 3 + 3)).alias("auction"),
        (F.lit(100) + h3 % 100_000).alias("price"),
        *keep,
    )


def sql_query(query: int, frame: DataFrame) -> DataFrame:
    """Query ``query`` in Spark SQL: one row, columns ``results`` and ``checksum``."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    kind = F.col("kind")
    bids = frame.where(kind == 2)
    if query == 0:
        fingerprint = F.when(kind == 2, F.col("auction")).otherwise(F.col("id"))
        return frame.agg(F.count(F.lit(1)).alias("results"), F.sum(fingerprint).alias("checksum"))
    if query == 1:
        euros = (F.col("price") * F.lit(USD_TO_EURO)).cast("long")
        return bids.agg(F.count(F.lit(1)).alias("results"), F.sum(euros).alias("checksum"))
    if query == 2:
        kept = bids.where(F.col("auction") % QUERY_ARGS["auction_skip"] == 0)
        return kept.agg(
            F.count(F.lit(1)).alias("results"),
            F.sum(F.col("auction") + F.col("price")).alias("checksum"),
        )
    if query == 3:
        auctions = frame.where((kind == 1) & (F.col("category") == Q3_CATEGORY)).select(
            F.col("id").alias("auction_id"), "seller"
        )
        persons = frame.where((kind == 0) & F.col("state").isin(*Q3_STATES)).select(
            F.col("id").alias("person_id"), "name", "city", "state"
        )
        joined = auctions.join(persons, auctions.seller == persons.person_id)
        return joined.agg(F.count(F.lit(1)).alias("results"), F.sum("auction_id").alias("checksum"))
    if query == 5:
        return _sql_q5(bids)
    if query == 7:
        best = F.max("price").over(Window.partitionBy("w"))
        windowed = bids.select("auction", "bidder", "price", _sql_fixed_window().alias("w"))
        top = windowed.withColumn("best", best).where(F.col("price") == F.col("best"))
        return top.agg(
            F.count(F.lit(1)).alias("results"), F.sum(_sql_bid_fingerprint()).alias("checksum")
        )
    if query == 8:
        persons = frame.where(kind == 0).select(
            _sql_fixed_window().alias("w"), F.col("id").alias("person_id")
        )
        auctions = frame.where(kind == 1).select(
            _sql_fixed_window().alias("w"), "seller", "reserve"
        )
        joined = persons.join(
            auctions, (persons.w == auctions.w) & (persons.person_id == auctions.seller)
        )
        fingerprint = F.col("person_id") * 10_000 + F.col("reserve")
        return joined.agg(F.count(F.lit(1)).alias("results"), F.sum(fingerprint).alias("checksum"))
    if query == 9:
        winners = _sql_winning_bids(frame)
        fingerprint = F.col("auction_id") * 1_000_003 + _sql_bid_fingerprint()
        return winners.agg(F.count(F.lit(1)).alias("results"), F.sum(fingerprint).alias("checksum"))
    if query == 4:
        return _sql_q4(frame)
    if query == 11:
        by_time = Window.partitionBy("bidder").orderBy("ms")
        gap = F.col("ms") - F.lag("ms").over(by_time)
        starts = bids.select(
            "bidder", "ms", F.when(gap < WINDOW_SIZE_MS, 0).otherwise(1).alias("starts")
        )
        numbered = starts.select("bidder", F.sum("starts").over(by_time).alias("session"))
        counts = numbered.groupBy("bidder", "session").count()
        fingerprint = F.col("bidder") * 1_000_000 + F.col("count") * F.col("count")
        return counts.agg(F.count(F.lit(1)).alias("results"), F.sum(fingerprint).alias("checksum"))
    raise ValueError(f"no Spark SQL version of Nexmark query {query}")


def _sql_fixed_window() -> Column:
    from pyspark.sql import functions as F

    return F.col("ms") - F.col("ms") % WINDOW_SIZE_MS


def _sql_bid_fingerprint() -> Column:
    from pyspark.sql import functions as F

    return F.col("auction") * 1_000_003 + F.col("bidder") * 1_009 + F.col("price")


def _sql_sliding_windows(time: Column, per_ms: int = 1) -> Column:
    """:func:`sliding_windows` as an array column (``time`` in units of ``1 / per_ms`` ms)."""
    from pyspark.sql import functions as F

    period, size = WINDOW_PERIOD_MS * per_ms, WINDOW_SIZE_MS * per_ms
    last = time - time % period
    # SlidingWindows.assign: starts last, last - period, ... while start > time - size.
    return F.filter(
        F.array(*[last - k * period for k in range(-(-size // period))]),
        lambda start: start > time - size,
    )


def _sql_q5(bids: DataFrame) -> DataFrame:
    """Per sliding window, the auctions with the most bids (ties all kept)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    starts = _sql_sliding_windows(F.col("ms"))
    counts = bids.select(F.explode(starts).alias("w"), "auction").groupBy("w", "auction").count()
    most = F.max("count").over(Window.partitionBy("w"))
    top = counts.withColumn("most", most).where(F.col("count") == F.col("most"))
    fingerprint = F.col("auction") * 100_000 + F.col("count")
    return top.agg(F.count(F.lit(1)).alias("results"), F.sum(fingerprint).alias("checksum"))


def _sql_q4(frame: DataFrame) -> DataFrame:
    """Per sliding window (of expires - 1 us, in microseconds) and category, the mean price."""
    from pyspark.sql import functions as F

    starts = _sql_sliding_windows(F.col("expires") * 1000 - 1, per_ms=1000)
    winners = _sql_winning_bids(frame).select(F.explode(starts).alias("w"), "category", "price")
    means = winners.groupBy("w", "category").agg(F.avg("price").alias("mean"))
    # q4_fingerprint: int(mean * 1000) truncates as the cast does.
    fingerprint = F.col("category") * 10**9 + (F.col("mean") * 1000).cast("long")
    return means.agg(F.count(F.lit(1)).alias("results"), F.sum(fingerprint).alias("checksum"))


def _sql_winning_bids(frame: DataFrame) -> DataFrame:
    """Per auction, its best bid (price, then earliest) among bids before it expires, >= reserve."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    kind = F.col("kind")
    auctions = frame.where(kind == 1).select(
        F.col("id").alias("auction_id"),
        "expires",
        "category",
        F.col("reserve").alias("auction_reserve"),
    )
    bids = frame.where(kind == 2).select("auction", "bidder", "price", "ms")
    joined = bids.join(auctions, bids.auction == auctions.auction_id).where(
        (F.col("ms") < F.col("expires")) & (F.col("price") >= F.col("auction_reserve"))
    )
    rank = F.row_number().over(
        Window.partitionBy("auction_id").orderBy(F.col("price").desc(), F.col("ms").asc())
    )
    return joined.withColumn("rank", rank).where(F.col("rank") == 1)
