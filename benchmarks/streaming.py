"""Streaming Nexmark: which event rates each runner keeps up with, and window latency.

    .venv/bin/python -m benchmarks.streaming [--queries 0,1,2,5,7,8,11]
        [--rates 250,500,1000,...] [--seconds 30]
        [--runners ours,pyspark,pyspark-python,direct,direct-mp] [--within 0.1]

Each trial runs one query at one event rate on ``local[2]``, for ``--seconds`` after its first
micro-batch (Python workers start then):

* ``ours``: Beam's own ``queryN.load`` on SparkStructuredRunner, its events from Spark's
  ``rate`` source (``ReadFromSparkStream``: event ``n`` is the rate source's ``value``, its
  event time the source's ``timestamp``, so event time follows the wall clock);
* ``pyspark``: the same query hand-written in PySpark Structured Streaming over the same
  ``rate`` source and the same event function in SQL (``nexmark.event_columns``), its
  event time the same ``timestamp`` under a watermark of no delay (:func:`pyspark_query`);
* ``pyspark-python``: a floor for any runner that runs Beam's Python per event
  (:mod:`benchmarks.streaming_floor`). PySpark Structured Streaming over the same ``rate``
  source hands each micro-batch's rows to Python in Arrow batches (``mapInArrow``); each
  row's event comes from the Python generator ours runs and goes through the query's user
  code up to its grouping, window assignment included, with nothing of a runner around
  it. Across the grouping Spark counts natively where Beam's query counts (q5, q11); where
  Beam's user code reads a window's elements (q7, q8) they are kept as Beam-coded,
  compressed runs in a ``transformWithState`` list state until Spark's watermark passes
  the window's end, then decoded and handed to that code.

Ours makes each row's event in its first step: for windowed queries ``_Events``, which
also records the event times it read (the latency past the watermark, below); for q0-q2,
which have no latency, a plain ``Map`` (:func:`event_of_row`), as the floor calls the
generator.

Both are Structured Streaming queries with the same trigger interval, so the same numbers
describe them: Spark's progress reports each micro-batch's input rows and duration. The
``rate`` source offers, each micro-batch, the rows that became due since the last, so a
query that keeps up has micro-batches of a steady duration; one that does not has ever
longer ones (each holds the rows that arrived during the last). A trial keeps up when its
last third of micro-batches is not slower than its middle third by more than a quarter
and under ``MAX_BATCH_SECONDS``.

For each query and runner the rates are searched, not all run (``ladder.find_limit``): from
the ladder's rate nearest 4 000 events/s, every other rate of the ascending ``--rates``
upwards while a trial keeps up (downwards until one does, if the first does not), then the
rate skipped next to the boundary, which brackets the limit within the ladder's step (2 by
default, 250 to 8 192 000 events/s); then bisection of the bracket until the highest rate
kept up with and the lowest failed are within ``--within`` (10 %) of each other.

Each trial runs in a process of its own (:func:`run_in_subprocess`), so each runner starts
its own Spark session: ours the runner's, the hand-written queries :func:`peer_session`'s
(the runner's settings, Spark's default JVM flags).

Latency, for windowed queries, two ways, p50 and p99 over the panes of windows that ended
``WARM_UP_SECONDS`` after the first micro-batch (DirectRunner: after its first event was
due); the sink records, for every pane, the wall time it processed it:

* *past the window's end*: that time minus the window's end (event time is wall time
  here). It includes the source's and the trigger's waits: the ``rate`` source offers a
  second's rows once that second has passed, and a micro-batch starts only at a trigger;
* *past the watermark* (issue 12's measure: from the moment the watermark passes the
  window's end to the window's output): that time minus the moment the query's watermark
  passed the window's end. Ours: the source's watermark is the latest event time any task
  has read (:mod:`beam_spark_runner.streaming.spark_sources`), so the moment is the
  earliest wall time at which a bundle of the first step (``_Events``) had read an event at
  or past the end. PySpark: its watermark moves at the end of a micro-batch, to the
  latest event time that batch read, so the moment is the end of the first micro-batch
  whose latest event time is at or past the end (Spark's progress reports). DirectRunner:
  not measured.

``direct``: DirectRunner in streaming, its events from a ``PeriodicImpulse`` ticking every
``TICK_SECONDS`` (each tick emits the events due, at their event times); it keeps up when
it ends within ``MAX_OVERRUN_SECONDS`` of its last event's due time. ``direct-mp``: the same
in two SDK worker processes.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import glob
import importlib
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import apache_beam as beam

from benchmarks import ladder, nexmark, streaming_floor
from benchmarks.trial_process import run_trial_process

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_LOGGER = logging.getLogger(__name__)

# The micro-batch interval of both Structured Streaming queries (--trigger): above what a
# micro-batch of ours costs with no data (1.1-1.4 s on a quiet machine, docs/performance.md).
TRIGGER_SECONDS = 2.0
# A micro-batch slower than this is not keeping up, whatever its trend.
MAX_BATCH_SECONDS = 10.0
# DirectRunner keeps up when it ends at most this long after its last event was due.
MAX_OVERRUN_SECONDS = 5.0
# A DirectRunner run that ends more than this before its last event was due did not run its
# events at their times (seen with --direct_running_mode=multi_processing): no figure.
EARLY_END_SECONDS = 1.0
# Panes of windows that ended before the first micro-batch plus this are not counted.
WARM_UP_SECONDS = 5.0
# DirectRunner's generator: a PeriodicImpulse tick this often, each emitting the events due.
TICK_SECONDS = 0.1
# A trial whose first micro-batch has not completed after this long fails.
STARTUP_LIMIT_SECONDS = 180.0
WINDOWED = (5, 7, 8, 11)
PYTHON_FLOOR_QUERIES = streaming_floor.PYTHON_FLOOR_QUERIES


@dataclasses.dataclass
class Trial:
    """One query at one rate on one runner: its micro-batches and pane latencies."""

    runner: str
    query: int
    rate: int
    # (input rows, duration in seconds) of each micro-batch, in order.
    batches: list[tuple[int, float]]
    # Per pane: output wall time minus its window's end, and minus the moment the
    # watermark passed that end (see the module doc).
    latencies: list[float] = dataclasses.field(default_factory=list)
    watermark_latencies: list[float] = dataclasses.field(default_factory=list)
    error: str | None = None
    # DirectRunner (no micro-batches): how long after its events' last due time it ended.
    overrun: float | None = None
    # The micro-batch interval, seconds.
    trigger: float = TRIGGER_SECONDS

    @property
    def keeps_up(self) -> bool:
        """Whether its micro-batches stayed steady (see the module doc); for DirectRunner,
        whether it ended within ``MAX_OVERRUN_SECONDS`` after its last event's due time (and
        not before it)."""
        if self.error is not None:
            return False
        if self.overrun is not None:
            return -EARLY_END_SECONDS <= self.overrun <= MAX_OVERRUN_SECONDS
        return keeps_up([d for _, d in self.batches], self.trigger)

    def summary(self) -> dict[str, Any]:
        """The trial as one JSON-able row."""
        durations = [d for _, d in self.batches]
        rows = sum(r for r, _ in self.batches)
        return {
            "runner": self.runner,
            "query": self.query,
            "rate": self.rate,
            "keeps_up": self.keeps_up,
            "batches": len(self.batches),
            "rows": rows,
            "median_batch_s": round(statistics.median(durations), 2) if durations else None,
            "last_batch_s": round(durations[-1], 2) if durations else None,
            "latency_p50_s": percentile(self.latencies, 50),
            "latency_p99_s": percentile(self.latencies, 99),
            "watermark_latency_p50_s": percentile(self.watermark_latencies, 50),
            "watermark_latency_p99_s": percentile(self.watermark_latencies, 99),
            "panes": len(self.latencies),
            "overrun_s": None if self.overrun is None else round(self.overrun, 1),
            "error": self.error,
            "trigger_s": self.trigger,
        }


def keeps_up(durations: Sequence[float], trigger: float = TRIGGER_SECONDS) -> bool:
    """Steady micro-batches: the last third no slower than the middle third by > 25 %."""
    if len(durations) < 6:
        return False
    third = len(durations) // 3
    middle = statistics.mean(durations[third : 2 * third])
    last = statistics.mean(durations[2 * third :])
    return last <= 1.25 * max(middle, trigger) and last <= MAX_BATCH_SECONDS


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank), rounded to 10 ms; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return round(ordered[rank - 1], 2)


def highest_kept_up(trials: Sequence[Trial], runner: str, query: int) -> int | None:
    """The highest rate ``runner`` kept up with on ``query`` (None if none)."""
    rates = [t.rate for t in trials if t.runner == runner and t.query == query and t.keeps_up]
    return max(rates, default=None)


def _pairs(directory: str) -> list[tuple[float, float]]:
    """The ``a b`` lines of the files a trial's DoFns wrote to ``directory``, as floats."""
    pairs = []
    for path in glob.glob(f"{directory}/*.txt"):
        for line in open(path).read().splitlines():
            first, second = (float(v) for v in line.split())
            pairs.append((first, second))
    return pairs


def pane_latencies(directory: str, warm: float) -> list[float]:
    """Output time minus window end of each pane recorded in ``directory`` whose window
    ended after ``warm`` (the first micro-batch starts Python workers: not a latency)."""
    return [written - end for end, written in _pairs(directory) if end >= warm]


def watermark_latencies(
    panes: Sequence[tuple[float, float]], passes: Sequence[tuple[float, float]], warm: float
) -> list[float]:
    """Per pane ``(window end, output time)`` of a window that ended after ``warm``: its
    output time minus the moment the watermark passed the window's end.

    ``passes`` are ``(watermark, wall time)`` observations: the watermark had reached that
    event time by that wall time. The moment for an end is the earliest wall time of a
    watermark at or past it (a window's last timestamp is a microsecond before its end);
    panes of windows no observation passed are left out.
    """
    ordered = sorted(passes)
    watermarks = [watermark for watermark, _ in ordered]
    # earliest[i]: the earliest wall time of the passes from the i-th lowest watermark up.
    earliest = [math.inf] * (len(ordered) + 1)
    for i in range(len(ordered) - 1, -1, -1):
        earliest[i] = min(earliest[i + 1], ordered[i][1])
    latencies = []
    for end, written in panes:
        first = bisect.bisect_left(watermarks, end - 1e-6)
        if end >= warm and first < len(ordered):
            latencies.append(written - earliest[first])
    return latencies


def _batch_watermark_passes(query: Any) -> list[tuple[float, float]]:
    """``(latest event time read, end)`` of each micro-batch of a PySpark query with an
    event-time watermark: at its end Spark moves the watermark to that time (no delay)."""
    passes = []
    for progress in query.recentProgress:
        latest = progress.get("eventTime", {}).get("max")
        if latest is not None and "triggerExecution" in progress.get("durationMs", {}):
            passes.append((_iso_seconds(latest), _batch_end(progress)))
    return passes


def _iso_seconds(text: str) -> float:
    """Seconds since the epoch of a time in Spark's progress (ISO 8601, ``Z`` for UTC)."""
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _batch_end(progress: dict[str, Any]) -> float:
    """Wall time a micro-batch ended, from its progress report."""
    return _iso_seconds(progress["timestamp"]) + progress["durationMs"]["triggerExecution"] / 1000


def _first_batch_end(query: Any) -> float:
    """Wall time the query's first micro-batch ended."""
    return _batch_end(query.recentProgress[0])


def _after_first_batch(active: Callable[[], Sequence[Any]], seconds: float) -> Any:
    """The one running query, once it has run ``seconds`` past its first micro-batch (which
    starts Python workers and opens state stores: tens of seconds on a loaded machine, so
    the trial's length is counted from its end). Fails after ``STARTUP_LIMIT_SECONDS``
    without a first micro-batch."""
    deadline = time.time() + STARTUP_LIMIT_SECONDS
    while True:
        queries = active()
        if len(queries) == 1 and queries[0].recentProgress:
            break
        if time.time() > deadline:
            raise TimeoutError(
                f"no micro-batch completed in {STARTUP_LIMIT_SECONDS} s "
                f"({len(queries)} queries running)"
            )
        time.sleep(0.5)
    time.sleep(seconds)
    return queries[0]


def _progress_batches(query: Any, skip: int = 2) -> list[tuple[int, float]]:
    """(rows, seconds) per micro-batch from Spark's progress, the first ``skip`` left out
    (Python workers start, state stores open)."""
    out = []
    for progress in query.recentProgress[skip:]:
        duration = progress.get("durationMs", {}).get("triggerExecution")
        if duration is not None:
            out.append((int(progress.get("numInputRows", 0)), duration / 1000))
    return out


class _Panes(beam.DoFn):  # type: ignore[misc]
    """Records each pane's window end and the wall time it is output, to a file per process.

    A bundle's lines are appended at its end, with one open: opening the file for every
    pane was ~5 % of the workers' time on q8 (~100 000 panes a trial).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._lines: list[str] = []

    def start_bundle(self) -> None:
        self._lines = []

    def process(self, element: Any, w: Any = beam.DoFn.WindowParam) -> None:
        end = getattr(w, "end", None)
        if end is None:
            return
        self._lines.append(f"{float(end)} {time.time()}\n")

    def finish_bundle(self) -> None:
        if not self._lines:
            return
        path = os.path.join(self.directory, f"{os.getpid()}.txt")
        with open(path, "a") as out:
            out.write("".join(self._lines))
        self._lines = []


class _Drop(beam.DoFn):  # type: ignore[misc]
    def process(self, element: Any) -> None:
        return None


class _Events(beam.DoFn):  # type: ignore[misc]
    """The events of the ``rate`` source's rows (event ``n`` from the row's ``value``).

    Also records, per bundle, the latest event time it read and the wall time of its last
    element, a line in a file per process: the source's watermark is the latest event time
    read, so it had reached that event time by then (``watermark_latencies``). Time is
    taken per element (a ``time.time()`` call, ~0.05 us), not at the bundle's end, which
    comes after the stage's later steps. The event time is the row's ``timestamp`` field,
    the column ``ReadFromSparkStream`` times the row by, not Beam's ``TimestampParam``:
    the measurement is the benchmark's, and the parameter cost ours 0.5 us an event more
    (a ``Timestamp`` made per element), which neither hand-written runner pays. For the
    same reason a ``Timestamp`` is read once for a run of rows sharing it (ours makes one
    per run of equal times): ``micros`` is a computed property.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._latest = -1
        self._at = 0.0
        self._stamp: Any = None

    def start_bundle(self) -> None:
        self._latest = -1
        self._at = 0.0
        self._stamp = None

    def process(self, row: Any) -> Iterator[Any]:
        stamp = row.timestamp
        if stamp is not self._stamp:  # ours gives rows stamped alike one Timestamp
            self._stamp = stamp
            micros = stamp.micros
            if micros > self._latest:
                self._latest = micros
        self._at = time.time()
        yield nexmark.event(int(row.value))

    def finish_bundle(self) -> None:
        if self._latest < 0:
            return
        with open(os.path.join(self.directory, f"{os.getpid()}.txt"), "a") as out:
            out.write(f"{self._latest / 1e6} {self._at}\n")


def event_of_row(row: Any) -> Any:
    """The event of a ``rate`` source's row, for queries without windows: no latency is
    measured there, so no event time is recorded (``_Events`` reads each row's event
    time and the wall clock, which neither hand-written PySpark nor the Python-per-event
    floor pays)."""
    return nexmark.event(int(row.value))


# ``--ours-conf KEY=VALUE`` entries: Spark settings of our runner's session, for A/B runs.
OURS_CONF: list[str] = []


def run_ours(query: int, rate: int, seconds: float, trigger: float = TRIGGER_SECONDS) -> Trial:
    """Beam's query ``query`` on SparkStructuredRunner at ``rate`` events/s."""
    from apache_beam.options.pipeline_options import PipelineOptions, TypeOptions
    from apache_beam.testing.benchmarks.nexmark import nexmark_util
    from pyspark.sql import SparkSession

    from beam_spark_runner.io import ReadFromSparkStream

    nexmark_util.setup_coder()
    panes = tempfile.mkdtemp(prefix="bench-streaming-panes-")
    reads = tempfile.mkdtemp(prefix="bench-streaming-reads-")
    options = PipelineOptions(
        [
            "--runner=SparkStructuredRunner",
            "--spark_master=local[2]",
            f"--spark_trigger_interval={trigger}",
            *(f"--spark_conf={entry}" for entry in OURS_CONF),
        ]
    )
    options.view_as(TypeOptions).allow_unsafe_triggers = True  # q11's trigger, as Beam's launcher
    pipeline = beam.Pipeline(options=options)
    module = importlib.import_module(f"apache_beam.testing.benchmarks.nexmark.queries.query{query}")
    events = (
        pipeline
        | ReadFromSparkStream("rate", options={"rowsPerSecond": rate, "numPartitions": 2})
        | "Event" >> (beam.ParDo(_Events(reads)) if query in WINDOWED else beam.Map(event_of_row))
    )
    output = module.load(events, dict(nexmark.QUERY_ARGS), pipeline.options)
    _ = output | "Sink" >> beam.ParDo(_Panes(panes) if query in WINDOWED else _Drop())
    result = pipeline.run()
    error = None
    warm = float("inf")
    try:
        spark = SparkSession.builder.getOrCreate()
        running = _after_first_batch(lambda: spark.streams.active, seconds)
        batches = _progress_batches(running)
        warm = _first_batch_end(running) + WARM_UP_SECONDS
    except Exception as caught:  # noqa: BLE001 - reported in the table
        batches, error = [], f"{type(caught).__name__}: {caught}"
    finally:
        result.cancel()
    return Trial(
        "ours",
        query,
        rate,
        batches,
        pane_latencies(panes, warm),
        watermark_latencies(_pairs(panes), _pairs(reads), warm),
        error,
        trigger=trigger,
    )


def pyspark_query(query: int, events: DataFrame) -> DataFrame:
    """Query ``query`` hand-written in PySpark Structured Streaming over ``events``
    (:func:`nexmark.event_columns` plus the event time ``t``, under a watermark).

    Windowed queries have an ``end`` column, their window's end, for the latency; their
    windows are Spark's ``window``/``session_window`` over ``t`` with Beam's sizes, and
    they emit in append mode, when Spark's watermark passes the window's end:

    * q5: bids counted per sliding window and auction, then per window the auctions with
      the most (ties kept): two chained aggregations (Spark 3.4+);
    * q7: per fixed window the highest price and the bids at that price (ties kept);
    * q8: persons joined with the auctions they sell in the same fixed window (a
      stream-stream join on window and id: Spark emits a match as soon as both sides
      arrived, Beam's CoGroupByKey at the window's end);
    * q11: bids per bidder per session (10 s gap); Beam's early firing after 100 000 bids
      and its 1 s allowed lateness have no counterpart (neither happens here).
    """
    from pyspark.sql import functions as F

    kind = F.col("kind")
    bids = events.where(kind == 2)
    size = f"{nexmark.QUERY_ARGS['window_size_sec']} seconds"
    period = f"{nexmark.QUERY_ARGS['window_period_sec']} seconds"
    if query == 0:
        return events
    if query == 1:
        return bids.select("auction", "bidder", (F.col("price") * nexmark.USD_TO_EURO).alias("p"))
    if query == 2:
        return bids.where(F.col("auction") % nexmark.QUERY_ARGS["auction_skip"] == 0).select(
            "auction", "price"
        )
    if query == 5:
        counts = bids.groupBy(F.window("t", size, period), "auction").count()
        top = counts.groupBy("window").agg(
            F.max("count").alias("most"),
            F.collect_list(F.struct("auction", "count")).alias("counts"),
        )
        best = F.filter("counts", lambda c: c["count"] == F.col("most"))
        return top.select(F.col("window.end").alias("end"), F.explode(best).alias("top"))
    if query == 7:
        windowed = bids.groupBy(F.window("t", size)).agg(
            F.max("price").alias("best"),
            F.collect_list(F.struct("auction", "bidder", "price")).alias("bids"),
        )
        best = F.filter("bids", lambda b: b["price"] == F.col("best"))
        return windowed.select(F.col("window.end").alias("end"), F.explode(best).alias("bid"))
    if query == 8:
        persons = events.where(kind == 0).select(
            F.window("t", size).alias("pw"), F.col("id").alias("person_id"), "name"
        )
        auctions = events.where(kind == 1).select(
            F.window("t", size).alias("aw"), "seller", "reserve"
        )
        joined = persons.join(
            auctions, (F.col("pw") == F.col("aw")) & (F.col("person_id") == F.col("seller"))
        )
        return joined.select(F.col("pw.end").alias("end"), "person_id", "name", "reserve")
    if query == 11:
        sessions = bids.groupBy(F.session_window("t", size), "bidder").count()
        return sessions.select(F.col("session_window.end").alias("end"), "bidder", "count")
    raise ValueError(f"no PySpark Structured Streaming version of Nexmark query {query}")


# Each trial runs in a process of its own (``_trial``); ``--in-process`` runs them all in
# this one instead, the hand-written queries on whatever session is active (tests, debugging).
IN_PROCESS: list[bool] = [False]
SPARK_MASTER = "local[2]"


def peer_session() -> Any:
    """The session of the hand-written queries: the settings of the runner's own session
    (``peers.runner_conf``: the driver heap, a shuffle partition per core, Python workers
    over Unix domain sockets, ...) with Spark's default JVM flags (``peers.with_default_jit``:
    C2 too), and RocksDB state stores, as ours has for its queries. With ``--in-process``,
    the session already active if there is one."""
    from pyspark.sql import SparkSession

    from beam_spark_runner.streaming.query import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER_CONF
    from benchmarks import peers

    active = SparkSession.getActiveSession() if IN_PROCESS[0] else None
    conf = peers.with_default_jit(peers.runner_conf(SPARK_MASTER))
    spark = active or peers.start_session(SPARK_MASTER, "bench-streaming", conf)
    spark.conf.set(STATE_STORE_PROVIDER_CONF, ROCKSDB_PROVIDER)
    return spark


def _rate_stream(rate: int) -> DataFrame:
    """Spark's ``rate`` source at ``rate`` rows/s in 2 partitions, on :func:`peer_session`:
    what both hand-written runners read."""
    return (
        peer_session()
        .readStream.format("rate")
        .option("rowsPerSecond", rate)
        .option("numPartitions", 2)
        .load()
    )


def run_pyspark(query: int, rate: int, seconds: float, trigger: float = TRIGGER_SECONDS) -> Trial:
    """The hand-written PySpark Structured Streaming query at ``rate`` events/s."""
    from pyspark.sql import functions as F

    source = _rate_stream(rate)
    numbered = source.select(F.col("value").alias("id"), F.col("timestamp").alias("t"))
    events = nexmark.event_columns(numbered, keep=("t",)).withWatermark("t", "0 seconds")
    out = pyspark_query(query, events)
    checkpoint = tempfile.mkdtemp(prefix="bench-streaming-checkpoint-")
    ends: list[tuple[float, float]] = []

    def record(frame: DataFrame, unused_batch_id: int) -> None:
        for row in frame.select("end").collect():
            ends.append((row.end.timestamp(), time.time()))

    writer = out.writeStream.option("checkpointLocation", checkpoint)
    writer = writer.foreachBatch(record) if query in WINDOWED else writer.format("noop")
    running = writer.trigger(processingTime=f"{trigger} seconds").start()
    try:
        _after_first_batch(lambda: [running], seconds)
        warm = _first_batch_end(running) + WARM_UP_SECONDS
        panes = list(ends)
        latencies = [written - end for end, written in panes if end >= warm]
        passes = _batch_watermark_passes(running)
        batches = _progress_batches(running)
        return Trial(
            "pyspark",
            query,
            rate,
            batches,
            latencies,
            watermark_latencies(panes, passes, warm),
            trigger=trigger,
        )
    finally:
        running.stop()


def run_pyspark_python(
    query: int, rate: int, seconds: float, trigger: float = TRIGGER_SECONDS
) -> Trial:
    """The Python-per-event floor (:mod:`benchmarks.streaming_floor`) at ``rate`` events/s:
    the least any runner that runs Beam's Python per event must do, in PySpark Structured
    Streaming over the same ``rate`` source, with nothing of a runner around it."""
    if query not in PYTHON_FLOOR_QUERIES:
        raise ValueError(
            f"the Python-per-event floor has queries {PYTHON_FLOOR_QUERIES}, not query {query}"
        )
    # Its Python workers run this interpreter (Spark's default is ``python3`` on the path).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    floor = streaming_floor.floor_query(query, _rate_stream(rate))
    checkpoint = tempfile.mkdtemp(prefix="bench-streaming-checkpoint-")
    writer = floor.frame.writeStream.option("checkpointLocation", checkpoint)
    if floor.each_batch is not None:
        writer = writer.foreachBatch(floor.each_batch)
    else:
        writer = writer.format("noop")
    running = writer.trigger(processingTime=f"{trigger} seconds").start()
    try:
        _after_first_batch(lambda: [running], seconds)
        return Trial("pyspark-python", query, rate, _progress_batches(running), trigger=trigger)
    finally:
        running.stop()


def _tick_events(tick: float, rate: int, start: float) -> Any:
    """The events due in the tick starting at ``tick``, at their event times."""
    from apache_beam.transforms.window import TimestampedValue

    index = round((float(tick) - start) / TICK_SECONDS)
    first, last = index * rate * TICK_SECONDS, (index + 1) * rate * TICK_SECONDS
    for n in range(round(first), round(last)):
        yield TimestampedValue(nexmark.event(n), float(tick) + (n - first) / rate)


def run_direct(
    query: int, rate: int, seconds: float, trigger: float = TRIGGER_SECONDS, workers: int = 1
) -> Trial:
    """Beam's query ``query`` on DirectRunner in streaming: a PeriodicImpulse ticks every
    ``TICK_SECONDS`` and emits the events due by then; it keeps up when it ends soon after
    the last tick. With ``workers`` above 1, in that many SDK worker processes
    (``--direct_num_workers``, ``--direct_running_mode=multi_processing``)."""
    from apache_beam.options.pipeline_options import PipelineOptions, TypeOptions
    from apache_beam.testing.benchmarks.nexmark import nexmark_util
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    nexmark_util.setup_coder()
    name = "direct" if workers == 1 else "direct-mp"
    panes = tempfile.mkdtemp(prefix="bench-streaming-panes-")
    args = ["--runner=DirectRunner", "--streaming"]
    if workers > 1:
        args += [f"--direct_num_workers={workers}", "--direct_running_mode=multi_processing"]
    options = PipelineOptions(args)
    options.view_as(TypeOptions).allow_unsafe_triggers = True
    pipeline = beam.Pipeline(options=options)
    module = importlib.import_module(f"apache_beam.testing.benchmarks.nexmark.queries.query{query}")
    start = time.time() + 5
    events = (
        pipeline
        | PeriodicImpulse(start, start + seconds, TICK_SECONDS)
        | "Events" >> beam.FlatMap(_tick_events, rate, start)
    )
    output = module.load(events, dict(nexmark.QUERY_ARGS), pipeline.options)
    _ = output | "Sink" >> beam.ParDo(_Panes(panes) if query in WINDOWED else _Drop())
    try:
        pipeline.run().wait_until_finish()
    except Exception as caught:  # noqa: BLE001 - reported in the table
        return Trial(name, query, rate, [], error=f"{type(caught).__name__}: {caught}")
    overrun = time.time() - (start + seconds)
    if overrun < -EARLY_END_SECONDS:
        error = (
            f"ended {-overrun:.1f} s before its last event was due: its events were not run "
            "at their times, so the trial says nothing of the rate"
        )
        return Trial(name, query, rate, [], error=error, overrun=overrun)
    latencies = pane_latencies(panes, start + WARM_UP_SECONDS)
    return Trial(name, query, rate, [], latencies, overrun=overrun)


def run_direct_multiprocess(
    query: int, rate: int, seconds: float, trigger: float = TRIGGER_SECONDS
) -> Trial:
    """:func:`run_direct` in two SDK worker processes."""
    return run_direct(query, rate, seconds, trigger, workers=2)


RUNNERS = {
    "ours": run_ours,
    "pyspark": run_pyspark,
    "pyspark-python": run_pyspark_python,
    "direct": run_direct,
    "direct-mp": run_direct_multiprocess,
}


def _run_here(runner: str, query: int, rate: int, seconds: float, trigger: float) -> Trial:
    """One trial in this process; one that fails (hand-written PySpark's q7 at 1 024 000
    events/s ran its driver JVM out of heap, which ended it) is reported as an error that
    did not keep up."""
    # From the module by its name, not ``__main__``: DirectRunner's SDK worker processes
    # (``direct-mp``) unpickle the trial's DoFns by reference and cannot find ``__main__``'s.
    runners = importlib.import_module("benchmarks.streaming").RUNNERS
    try:
        return runners[runner](query, rate, seconds, trigger)
    except Exception as caught:  # noqa: BLE001 - reported in the table
        _LOGGER.warning("%s q%d at %d events/s failed: %s", runner, query, rate, caught)
        error = f"{type(caught).__name__}: {caught}"
        return Trial(runner, query, rate, [], error=error, trigger=trigger)


# A trial's process may take this long past its seconds and start-up before it is ended.
TRIAL_MARGIN_SECONDS = 120.0


def trial_command(
    runner: str, query: int, rate: int, seconds: float, trigger: float, output: str
) -> list[str]:
    """The command line of a process running one trial, its ``Trial`` written to ``output``."""
    return [
        sys.executable,
        "-m",
        "benchmarks.streaming",
        f"--trial={runner},{query},{rate}",
        f"--seconds={seconds}",
        f"--trigger={trigger}",
        f"--trial-output={output}",
        *(f"--ours-conf={entry}" for entry in OURS_CONF),
    ]


def trial_from_json(data: dict[str, Any]) -> Trial:
    """A ``Trial`` from its fields as JSON holds them (``dataclasses.asdict``)."""
    return Trial(**{**data, "batches": [(int(r), float(d)) for r, d in data["batches"]]})


def run_in_subprocess(
    runner: str, query: int, rate: int, seconds: float, trigger: float, log_dir: str
) -> Trial:
    """One trial in a process of its own, so that each runner starts its own Spark session
    (ours with the runner's settings, the hand-written queries with :func:`peer_session`'s)
    and a JVM a trial ran out of memory does not end later trials. Its log is written to
    ``log_dir``; one that ends without a result is an error that did not keep up."""
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"q{query}-{runner}-{rate}.log")
    limit = seconds + STARTUP_LIMIT_SECONDS + TRIAL_MARGIN_SECONDS
    with tempfile.TemporaryDirectory(prefix="bench-streaming-trial-") as directory:
        output = os.path.join(directory, "trial.json")
        command = trial_command(runner, query, rate, seconds, trigger, output)
        error = run_trial_process(command, log_path, limit)
        if not os.path.exists(output):
            return Trial(runner, query, rate, [], error=error, trigger=trigger)
        with open(output) as saved:
            return trial_from_json(json.load(saved))


def _trial(
    runner: str, query: int, rate: int, seconds: float, trigger: float, log_dir: str
) -> Trial:
    if IN_PROCESS[0]:
        return _run_here(runner, query, rate, seconds, trigger)
    return run_in_subprocess(runner, query, rate, seconds, trigger, log_dir)


def main(argv: list[str] | None = None) -> int:
    """Runs every (query, runner, rate) trial, prints and saves the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", default="0,1,2,5,7,8,11")
    parser.add_argument("--rates", default=",".join(str(250 * 2**k) for k in range(16)))
    parser.add_argument("--runners", default="ours,pyspark,pyspark-python,direct,direct-mp")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument(
        "--trigger", type=float, default=TRIGGER_SECONDS, help="micro-batch interval, seconds"
    )
    parser.add_argument(
        "--ours-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of our runner's session (--spark_conf), for A/B runs; repeatable",
    )
    parser.add_argument(
        "--within",
        type=float,
        default=ladder.WITHIN,
        help="bisect each runner's limit until the highest rate kept up with and the lowest "
        "failed are within this fraction of each other (0: the ladder's rates only)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every trial in this process, the hand-written queries on the session "
        "already active (for tests and debugging: not how the baselines are measured)",
    )
    parser.add_argument("--output", default="benchmarks/results/streaming.json")
    parser.add_argument(
        "--state-keys",
        default="",
        help="then the state benchmark (benchmarks.state) with these keys in state, "
        "comma-separated (make bench-streaming: 1000,2000000)",
    )
    parser.add_argument(
        "--chart", nargs="+", metavar="JSON", help="only draw the chart of saved runs' JSON"
    )
    parser.add_argument("--trial", help=argparse.SUPPRESS)  # RUNNER,QUERY,RATE: one trial
    parser.add_argument("--trial-output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    OURS_CONF[:] = args.ours_conf
    IN_PROCESS[0] = args.in_process
    if args.chart:
        rows = [row for path in args.chart for row in json.load(open(path))]
        chart(rows, os.path.splitext(args.output)[0] + ".png")
        return 0
    # Beam sets the root logger to WARNING when imported: the trials report on a handler
    # of their own.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s bench-streaming %(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    if args.trial:
        runner, query, rate = args.trial.split(",")
        trial = _run_here(runner, int(query), int(rate), args.seconds, args.trigger)
        with open(args.trial_output, "w") as out:
            json.dump(dataclasses.asdict(trial), out)
        return 0
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    log_dir = os.path.join(os.path.dirname(args.output) or ".", "logs", "streaming")
    trials: list[Trial] = []
    rates = sorted(int(r) for r in args.rates.split(","))
    for query in (int(q) for q in args.queries.split(",")):
        for runner in args.runners.split(","):
            if runner == "pyspark-python" and query not in PYTHON_FLOOR_QUERIES:
                continue

            def attempt(rate: int, runner: str = runner, query: int = query) -> bool:
                trial = _trial(runner, query, rate, args.seconds, args.trigger, log_dir)
                trials.append(trial)
                _LOGGER.info("%s", json.dumps(trial.summary()))
                with open(args.output, "w") as out:  # after each trial: a long run may stop
                    json.dump([t.summary() for t in trials], out, indent=1)
                return trial.keeps_up

            start = rates.index(min(rates, key=lambda r: abs(r - 4000)))
            kept, failed = ladder.find_limit(rates, attempt, start, args.within)
            _LOGGER.info("q%d %s: keeps up with %s, not %s events/s", query, runner, kept, failed)
    print(markdown_table(trials))
    chart([t.summary() for t in trials], os.path.splitext(args.output)[0] + ".png")
    if args.state_keys:
        from benchmarks import state

        output = os.path.join(os.path.dirname(args.output) or ".", "state.json")
        state.main(["--keys", args.state_keys, "--output", output])
    return 0


def chart(summaries: Sequence[dict[str, Any]], path: str) -> bool:
    """Per query, the highest rate each runner kept up with (bars, log scale); and per
    windowed query, our panes' latency p50 and p99 at the highest rate it kept up with (or
    its lowest rate). From ``Trial.summary()`` rows, so also from a saved run's JSON.
    False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _LOGGER.warning("matplotlib is not installed: no chart (pip install matplotlib)")
        return False

    def best(runner: str, query: int) -> int:
        kept = [r["rate"] for r in summaries if (r["runner"], r["query"]) == (runner, query)]
        return max((r for r in kept if _kept(summaries, runner, query, r)), default=0)

    queries = sorted({r["query"] for r in summaries})
    runners = sorted({r["runner"] for r in summaries})
    figure, (rates, latency) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(runners))
    kept_up: list[int] = []
    for i, runner in enumerate(runners):
        positions = [q + i * width for q in range(len(queries))]
        heights = [best(runner, q) for q in queries]
        bars = rates.bar(positions, heights, width, label=runner)
        rates.bar_label(bars, [f"{h // 1000}k" if h else "" for h in heights], fontsize=8)
        kept_up += [h for h in heights if h]
    rates.set_xticks([q + width * (len(runners) - 1) / 2 for q in range(len(queries))])
    rates.set_xticklabels([f"q{q}" for q in queries])
    rates.set_yscale("log")
    if kept_up:  # log bars start at the axis' bottom: below the lowest, so that it shows
        rates.set_ylim(bottom=min(kept_up) / 2, top=max(kept_up) * 2)
    rates.set_ylabel("highest events/s kept up with")
    rates.legend()
    windowed = [q for q in queries if q in WINDOWED]
    bars_of = (
        ("watermark_latency_p50_s", "p50 past watermark"),
        ("watermark_latency_p99_s", "p99 past watermark"),
        ("latency_p99_s", "p99 past window end"),
    )
    for offset, (key, label) in zip((0.0, 0.27, 0.54), bars_of, strict=True):
        values = []
        for q in windowed:
            rows = sorted(
                (r for r in summaries if (r["runner"], r["query"]) == ("ours", q)),
                key=lambda r: (not r["keeps_up"], -r["rate"] if r["keeps_up"] else r["rate"]),
            )
            values.append((rows[0].get(key) or 0) if rows else 0)
        latency.bar([i + offset for i in range(len(windowed))], values, 0.27, label=label)
    trigger = max((r.get("trigger_s") or TRIGGER_SECONDS) for r in summaries)
    latency.axhline(2 * trigger, linestyle="--", color="grey", label="2 trigger intervals")
    latency.set_xticks([i + 0.27 for i in range(len(windowed))])
    latency.set_xticklabels([f"q{q}" for q in windowed])
    latency.set_ylabel("ours: pane latency at its highest rate, s")
    latency.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _kept(summaries: Sequence[dict[str, Any]], runner: str, query: int, rate: int) -> bool:
    return any(
        r["keeps_up"]
        for r in summaries
        if (r["runner"], r["query"], r["rate"]) == (runner, query, rate)
    )


def markdown_table(trials: Sequence[Trial]) -> str:
    """The trials as a Markdown table."""
    lines = [
        "| query | runner | events/s | keeps up | batches | median batch s | last batch s "
        "| latency past window end p50 s | p99 s | past watermark p50 s | p99 s |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = ("latency_p50_s", "latency_p99_s", "watermark_latency_p50_s", "watermark_latency_p99_s")
    for t in trials:
        s = t.summary()
        latencies = " | ".join("-" if s[key] is None else str(s[key]) for key in keys)
        lines.append(
            f"| q{t.query} | {t.runner} | {t.rate} | "
            f"{'yes' if s['keeps_up'] else ('error: ' + s['error'] if s['error'] else 'no')} | "
            f"{s['batches']} | {s['median_batch_s']} | {s['last_batch_s']} | {latencies} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
