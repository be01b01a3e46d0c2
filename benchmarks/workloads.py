"""The benchmark workloads, each written four ways: Beam, hand-written PySpark (over RDDs,
and over Arrow with ``mapInArrow``: ``benchmarks.arrow``), Spark SQL.

Every version of a workload ends in the same summary of its output: the number of output
elements (``results``) and the sum of a per-element fingerprint (``checksum``), so the
runners can be checked against each other. A Beam pipeline ends in :class:`Tally`, which
counts into two Beam counters; the Spark versions compute the two numbers with an action.

Input elements are generated inside the job (a few seeds, each expanded by a FlatMap into
its share of the elements), or read from a generated file (the word count), so that what
is measured is the runner, not building a large ``beam.Create`` or a slow source.
"""

from __future__ import annotations

import dataclasses
import operator
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from benchmarks import arrow, nexmark
from benchmarks.nexmark import seed_range

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAMESPACE = "benchmarks"
KV = typing.Tuple[int, int]  # noqa: UP006 - Beam's type hints want typing.Tuple


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big the inputs are."""

    elements: int  # GroupByKey, CombinePerKey, side input: main input elements
    keys: int  # distinct keys of those elements (and entries of the side input)
    text_mb: float  # size of the word count's text file
    events: int  # Nexmark events
    seeds: int  # generator seeds (the Beam pipelines' Create holds only these)
    partitions: int = 2  # Spark partitions of hand-written and SQL jobs (= local[2] cores)


FULL = Sizes(elements=2_000_000, keys=10_000, text_mb=100, events=2_000_000, seeds=16)
QUICK = Sizes(elements=100_000, keys=10_000, text_mb=2, events=100_000, seeds=8)
# Run once before the timed runs, in the same process: starts Spark, workers, imports.
WARMUP = Sizes(elements=10_000, keys=100, text_mb=0.05, events=10_000, seeds=4)


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The sizes, plus generated files and what they hold."""

    sizes: Sizes
    text_path: Path | None = None
    text_words: int = 0


@dataclasses.dataclass(frozen=True)
class Summary:
    """What a run produced: output element count and checksum."""

    results: int
    checksum: int


class Tally(beam.DoFn):
    """Counts the elements reaching it and sums their fingerprints into Beam counters."""

    def __init__(self, fingerprint: Callable[[Any], int]) -> None:
        self._fingerprint = fingerprint
        self._results = Metrics.counter(NAMESPACE, "results")
        self._checksum = Metrics.counter(NAMESPACE, "checksum")

    def process(self, element: Any) -> Iterator[Any]:
        self._results.inc()
        self._checksum.inc(self._fingerprint(element))
        return iter(())


def _seeds(pipeline: beam.Pipeline, seeds: int) -> beam.PCollection:
    return pipeline | "Seeds" >> beam.Create(list(range(seeds)))


def key_values(seed: int, total: int, seeds: int, keys: int) -> Iterator[tuple[int, int]]:
    """The (key, value) elements of one seed: value ``i``, key ``i % keys``."""
    start, stop = seed_range(seed, total, seeds)
    return ((i % keys, i) for i in range(start, stop))


def _key_values_of_seeds(
    seeds: Iterable[int], total: int, count: int, keys: int
) -> Iterator[tuple[int, int]]:
    for seed in seeds:
        yield from key_values(seed, total, count, keys)


def _spark_key_values(spark: SparkSession, sizes: Sizes) -> Any:
    total, count, keys = sizes.elements, sizes.seeds, sizes.keys
    return spark.sparkContext.parallelize(range(count), sizes.partitions).mapPartitions(
        lambda seeds: _key_values_of_seeds(seeds, total, count, keys)
    )


def _beam_key_values(pipeline: beam.Pipeline, sizes: Sizes) -> beam.PCollection:
    """The (key, value) elements of ``sizes`` in a Beam pipeline: seeds, expanded."""
    return _seeds(pipeline, sizes.seeds) | "Expand" >> beam.FlatMap(
        key_values, total=sizes.elements, seeds=sizes.seeds, keys=sizes.keys
    ).with_output_types(KV)


def _sql_key_values(spark: SparkSession, sizes: Sizes) -> Any:
    """The same (key, value) elements as a DataFrame with columns ``k`` and ``v``."""
    from pyspark.sql import functions as F

    return spark.range(0, sizes.elements, 1, sizes.partitions).select(
        (F.col("id") % sizes.keys).alias("k"), F.col("id").alias("v")
    )


def _rdd_summary(rdd: Any, fingerprint: Callable[[Any], int]) -> Summary:
    results, checksum = rdd.map(lambda e: (1, fingerprint(e))).fold(
        (0, 0), lambda a, b: (a[0] + b[0], a[1] + b[1])
    )
    return Summary(results, checksum)


def _sql_summary(frame: Any) -> Summary:
    row = frame.collect()[0]
    return Summary(int(row["results"]), int(row["checksum"] or 0))


def _identity(value: int) -> int:
    return value


def _second(pair: tuple[Any, int]) -> int:
    return pair[1]


def _sum_of_values(pair: tuple[Any, Iterable[int]]) -> int:
    return sum(pair[1])


def _weight(key: int) -> int:
    return key % 7 + 1


def _weighted(kv: tuple[int, int], weights: dict[int, int]) -> int:
    return kv[1] * weights[kv[0]]


class Workload:
    """One benchmark workload; subclasses implement the versions that exist."""

    name = ""
    description = ""

    def elements(self, inputs: Inputs) -> int:
        """Input elements, for elements/s."""
        return inputs.sizes.elements

    def beam(self, pipeline: beam.Pipeline, inputs: Inputs) -> None:
        """Adds the workload, ending in :class:`Tally`, to ``pipeline``."""
        raise NotImplementedError

    def pyspark(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """The same logic as Python functions over RDDs; runs it."""
        raise NotImplementedError

    def pyspark_arrow(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """The same Python per element inside ``mapInArrow`` (``benchmarks.arrow``); runs it."""
        raise NotImplementedError

    def sql(self, spark: SparkSession, inputs: Inputs) -> Summary | None:
        """Native Spark SQL, or None where the logic is not SQL-expressible."""
        return None


class WordCount(Workload):
    """Count the words of a generated text file (``str.split``), as Beam's wordcount does."""

    name = "wordcount"
    description = "word count of a generated text file"

    def elements(self, inputs: Inputs) -> int:
        """Words in the file."""
        return inputs.text_words

    def beam(self, pipeline: beam.Pipeline, inputs: Inputs) -> None:
        """ReadFromText, FlatMap(split), Count.PerElement."""
        _ = (
            pipeline
            | "Read" >> beam.io.ReadFromText(str(inputs.text_path))
            | "Split" >> beam.FlatMap(str.split).with_output_types(str)
            | "Count" >> beam.combiners.Count.PerElement()
            | "Tally" >> beam.ParDo(Tally(_second))
        )

    def pyspark(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """textFile, flatMap(split), reduceByKey."""
        counts = (
            spark.sparkContext.textFile(str(inputs.text_path), inputs.sizes.partitions)
            .flatMap(str.split)
            .map(lambda word: (word, 1))
            .reduceByKey(operator.add)
        )
        return _rdd_summary(counts, _second)

    def pyspark_arrow(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """``arrow.wordcount``."""
        return arrow.wordcount(spark, inputs)

    def sql(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """split, explode, groupBy(word).count()."""
        from pyspark.sql import functions as F

        words = spark.read.text(str(inputs.text_path)).select(
            F.explode(F.split("value", " ")).alias("word")
        )
        counts = words.where(F.col("word") != "").groupBy("word").count()
        return _sql_summary(
            counts.agg(F.count(F.lit(1)).alias("results"), F.sum("count").alias("checksum"))
        )


class GroupByKeyWorkload(Workload):
    """GroupByKey of (i % keys, i), then sum each key's values downstream."""

    name = "groupbykey"
    description = "GroupByKey, then iterate each group"

    def beam(self, pipeline: beam.Pipeline, inputs: Inputs) -> None:
        """Seeds, FlatMap(expand), GroupByKey, Tally(sum of values)."""
        _ = (
            _beam_key_values(pipeline, inputs.sizes)
            | "Group" >> beam.GroupByKey()
            | "Tally" >> beam.ParDo(Tally(_sum_of_values))
        )

    def pyspark(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """groupByKey over an RDD."""
        grouped = _spark_key_values(spark, inputs.sizes).groupByKey(inputs.sizes.partitions)
        return _rdd_summary(grouped, _sum_of_values)

    def pyspark_arrow(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """``arrow.groupbykey``."""
        return arrow.groupbykey(spark, inputs)

    def sql(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """groupBy(key).agg(collect_list(value)), then sum each list."""
        from pyspark.sql import functions as F

        frame = _sql_key_values(spark, inputs.sizes)
        grouped = frame.groupBy("k").agg(F.collect_list("v").alias("vs"))
        total = F.aggregate("vs", F.lit(0).cast("long"), lambda acc, x: acc + x)
        return _sql_summary(
            grouped.agg(F.count(F.lit(1)).alias("results"), F.sum(total).alias("checksum"))
        )


class CombinePerKeyWorkload(Workload):
    """CombinePerKey(sum) of (i % keys, i)."""

    name = "combineperkey"
    description = "CombinePerKey(sum)"

    def beam(self, pipeline: beam.Pipeline, inputs: Inputs) -> None:
        """Seeds, FlatMap(expand), CombinePerKey(sum), Tally."""
        _ = (
            _beam_key_values(pipeline, inputs.sizes)
            | "Sum" >> beam.CombinePerKey(sum)
            | "Tally" >> beam.ParDo(Tally(_second))
        )

    def pyspark(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """reduceByKey(add)."""
        sums = _spark_key_values(spark, inputs.sizes).reduceByKey(
            operator.add, inputs.sizes.partitions
        )
        return _rdd_summary(sums, _second)

    def pyspark_arrow(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """``arrow.combineperkey``."""
        return arrow.combineperkey(spark, inputs)

    def sql(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """groupBy(key).sum(value)."""
        from pyspark.sql import functions as F

        frame = _sql_key_values(spark, inputs.sizes)
        sums = frame.groupBy("k").agg(F.sum("v").alias("s"))
        return _sql_summary(
            sums.agg(F.count(F.lit(1)).alias("results"), F.sum("s").alias("checksum"))
        )


class SideInputWorkload(Workload):
    """A Map over (k, v) reading a dict side input of ``keys`` entries: v * weight[k]."""

    name = "sideinput"
    description = "ParDo with a dict side input"

    def beam(self, pipeline: beam.Pipeline, inputs: Inputs) -> None:
        """Main: seeds, FlatMap(expand). Side: Create(keys) | Map. Map(weighted, AsDict)."""
        sizes = inputs.sizes
        weights = (
            pipeline
            | "Keys" >> beam.Create(list(range(sizes.keys)))
            | "Weights" >> beam.Map(lambda k: (k, _weight(k))).with_output_types(KV)
        )
        _ = (
            _beam_key_values(pipeline, sizes)
            | "Weigh" >> beam.Map(_weighted, weights=beam.pvalue.AsDict(weights))
            | "Tally" >> beam.ParDo(Tally(_identity))
        )

    def pyspark(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """A broadcast dict read in a map."""
        sizes = inputs.sizes
        broadcast = spark.sparkContext.broadcast({k: _weight(k) for k in range(sizes.keys)})
        weighted = _spark_key_values(spark, sizes).map(lambda kv: _weighted(kv, broadcast.value))
        return _rdd_summary(weighted, _identity)

    def pyspark_arrow(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """``arrow.sideinput``."""
        return arrow.sideinput(spark, inputs)

    def sql(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """A join with the (broadcast) weights table."""
        from pyspark.sql import functions as F

        sizes = inputs.sizes
        frame = _sql_key_values(spark, sizes)
        weights = spark.range(0, sizes.keys, 1, 1).select(
            F.col("id").alias("k"), (F.col("id") % 7 + 1).alias("w")
        )
        joined = frame.join(F.broadcast(weights), "k")
        return _sql_summary(
            joined.agg(
                F.count(F.lit(1)).alias("results"),
                F.sum(F.col("v") * F.col("w")).alias("checksum"),
            )
        )


class NexmarkWorkload(Workload):
    """Beam's Nexmark query ``query`` in batch over generated events."""

    def __init__(self, query: int, description: str) -> None:
        self.query = query
        self.name = f"nexmark-q{query}"
        self.description = description

    def elements(self, inputs: Inputs) -> int:
        """Events."""
        return inputs.sizes.events

    def beam(self, pipeline: beam.Pipeline, inputs: Inputs) -> None:
        """Seeds, FlatMap(events), Beam's ``queryN.load``, Tally."""
        import importlib

        from apache_beam.options.pipeline_options import TypeOptions
        from apache_beam.testing.benchmarks.nexmark import nexmark_util

        nexmark_util.setup_coder()
        # As the launcher does (nexmark_launcher.NexmarkLauncher.parse_args): query 11's
        # AfterWatermark(early=AfterCount(...)) trigger is refused without it.
        pipeline.options.view_as(TypeOptions).allow_unsafe_triggers = True
        module = importlib.import_module(
            f"apache_beam.testing.benchmarks.nexmark.queries.query{self.query}"
        )
        sizes = inputs.sizes
        events = _seeds(pipeline, sizes.seeds) | "Events" >> beam.FlatMap(
            nexmark.timestamped_events, total=sizes.events, seeds=sizes.seeds
        )
        output = module.load(events, dict(nexmark.QUERY_ARGS), pipeline.options)
        _ = output | "Tally" >> beam.ParDo(Tally(nexmark.FINGERPRINTS[self.query]))

    def pyspark(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """The query over an RDD of the same event objects."""
        sizes = inputs.sizes
        total, count = sizes.events, sizes.seeds

        def expand(seeds: Iterable[int]) -> Iterator[Any]:
            for seed in seeds:
                yield from nexmark.events(*seed_range(seed, total, count))

        event_rdd = spark.sparkContext.parallelize(range(count), sizes.partitions).mapPartitions(
            expand
        )
        output = nexmark.pyspark_query(self.query, event_rdd)
        return _rdd_summary(output, nexmark.FINGERPRINTS[self.query])

    def pyspark_arrow(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """The events made in Python inside ``mapInArrow`` (``arrow.nexmark_query``)."""
        return arrow.nexmark_query(self.query, spark, inputs.sizes)

    def sql(self, spark: SparkSession, inputs: Inputs) -> Summary:
        """The query over the events generated as SQL columns."""
        frame = nexmark.sql_events(spark, inputs.sizes.events, inputs.sizes.partitions)
        return _sql_summary(nexmark.sql_query(self.query, frame))


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        WordCount(),
        GroupByKeyWorkload(),
        CombinePerKeyWorkload(),
        SideInputWorkload(),
        NexmarkWorkload(0, "Nexmark q0: pass-through (coder round trip)"),
        NexmarkWorkload(1, "Nexmark q1: currency conversion (map)"),
        NexmarkWorkload(2, "Nexmark q2: selection (filter)"),
        NexmarkWorkload(3, "Nexmark q3: local item suggestion (join, stateful DoFn)"),
        NexmarkWorkload(4, "Nexmark q4: average price per category (winning bids, sliding mean)"),
        NexmarkWorkload(5, "Nexmark q5: hot items (sliding windows, count, global max)"),
        NexmarkWorkload(7, "Nexmark q7: highest bid (fixed windows, max as a side input)"),
        NexmarkWorkload(8, "Nexmark q8: monitor new users (fixed windows, CoGroupByKey join)"),
        NexmarkWorkload(9, "Nexmark q9: winning bids (custom merging windows, CoGroupByKey)"),
        NexmarkWorkload(11, "Nexmark q11: bids per user session (session windows, count)"),
    )
}

# What ``make bench`` (``benchmarks.run`` without ``--workloads``) runs, 3 rounds in ~16 min.
# The windowed Nexmark queries take minutes per run on the Beam runners (q5 over 7 min on
# DirectRunner at 2M events): ``make bench-nexmark`` runs them, one round.
DEFAULT_WORKLOADS: tuple[str, ...] = (
    "wordcount",
    "groupbykey",
    "combineperkey",
    "sideinput",
    "nexmark-q0",
    "nexmark-q1",
    "nexmark-q2",
    "nexmark-q3",
)
WINDOWED_NEXMARK_WORKLOADS: tuple[str, ...] = tuple(
    name for name in WORKLOADS if name.startswith("nexmark-") and name not in DEFAULT_WORKLOADS
)
