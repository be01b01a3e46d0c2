"""The workloads hand-written in PySpark over Arrow (``mapInArrow``), as a DataFrame user would.

The same Python per element as the RDD versions (``workloads``, ``nexmark.pyspark_query``)
runs inside ``mapInArrow``, over Arrow batches of ``ARROW_BATCH_ROWS`` rows: the elements
are made from the seeds in Python (the Nexmark events as Beam's model objects, by the same
generator), and so is the per-element user code of word count (``str.split``), the side
input's lookup and Nexmark q0-q2 (coder round trip, currency conversion, selection, the
fingerprints). What Spark has an operator for runs in Spark, as it would in a user's job:
counting words and summing per key are ``groupBy`` aggregations, GroupByKey groups with
``collect_list`` and sums each key's list in Python (``mapInArrow``), and Nexmark q3-q11's
joins, windows and aggregations are ``nexmark.sql_query`` over the events' fields as
columns (made in Python from the event objects). Each ends in the same summary
(``results``, ``checksum``) as the other versions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

# benchmarks.nexmark first: it imports Beam's Nexmark models in the order Beam 2.69's
# circular imports need (nexmark_model alone fails there).
from benchmarks import nexmark  # isort: skip
from apache_beam.testing.benchmarks.nexmark.models import nexmark_model  # isort: skip

from benchmarks.nexmark import seed_range

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from benchmarks.workloads import Inputs, Sizes, Summary

# Rows per Arrow batch a Python function yields: Spark's own batch size
# (spark.sql.execution.arrow.maxRecordsPerBatch).
ARROW_BATCH_ROWS = 10_000

# The Nexmark events' fields as ``nexmark.event_columns`` has them, with their Spark types.
EVENT_FIELDS: dict[str, str] = {
    "kind": "int",
    "id": "long",
    "state": "string",
    "city": "string",
    "name": "string",
    "seller": "long",
    "bidder": "long",
    "reserve": "long",
    "ms": "long",
    "expires": "long",
    "category": "long",
    "auction": "long",
    "price": "long",
}
# The fields each of Nexmark q3-q11 reads (``nexmark.sql_query``).
QUERY_FIELDS: dict[int, tuple[str, ...]] = {
    3: ("kind", "id", "seller", "category", "name", "city", "state"),
    4: ("kind", "id", "expires", "category", "reserve", "auction", "bidder", "price", "ms"),
    5: ("kind", "auction", "ms"),
    7: ("kind", "auction", "bidder", "price", "ms"),
    8: ("kind", "id", "seller", "reserve", "ms"),
    9: ("kind", "id", "expires", "category", "reserve", "auction", "bidder", "price", "ms"),
    11: ("kind", "bidder", "ms"),
}


def _arrow_type(spark_type: str) -> pa.DataType:
    import pyarrow as pa

    return {"int": pa.int32(), "long": pa.int64(), "string": pa.string()}[spark_type]


def record_batches(
    rows: Iterable[tuple[Any, ...]], names: Sequence[str], types: Sequence[str]
) -> Iterator[pa.RecordBatch]:
    """``rows`` as Arrow batches of ``ARROW_BATCH_ROWS`` rows with columns ``names`` of
    Spark types ``types`` (int, long, string); no batch for no rows."""
    import pyarrow as pa

    arrow_types = [_arrow_type(t) for t in types]
    chunk: list[tuple[Any, ...]] = []

    def batch() -> pa.RecordBatch:
        columns = zip(*chunk, strict=True)
        arrays = [pa.array(list(c), t) for c, t in zip(columns, arrow_types, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, list(names))

    for row in rows:
        chunk.append(row)
        if len(chunk) == ARROW_BATCH_ROWS:
            yield batch()
            chunk = []
    if chunk:
        yield batch()


def _seed_frame(spark: SparkSession, sizes: Sizes) -> DataFrame:
    """The seeds 0..seeds-1 (column ``id``) over ``sizes.partitions`` partitions."""
    return spark.range(0, sizes.seeds, 1, sizes.partitions)


def _per_seed(
    spark: SparkSession,
    sizes: Sizes,
    total: int,
    rows_of: Callable[[int, int], Iterable[tuple[Any, ...]]],
    schema: Sequence[tuple[str, str]],
) -> DataFrame:
    """``mapInArrow`` over the seeds: each seed's rows, ``rows_of(start, stop)`` of its share
    ``[start, stop)`` of ``total`` elements, in Arrow batches of columns ``schema``."""
    seeds = sizes.seeds
    names = [name for name, _ in schema]
    types = [spark_type for _, spark_type in schema]

    def expand(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for seed_batch in batches:
            for seed in seed_batch.column("id").to_pylist():
                yield from record_batches(rows_of(*seed_range(seed, total, seeds)), names, types)

    ddl = ", ".join(f"{name} {spark_type}" for name, spark_type in schema)
    return _seed_frame(spark, sizes).mapInArrow(expand, ddl)


def frame_summary(frame: DataFrame, fingerprint: str) -> Summary:
    """The rows of ``frame`` counted, their column ``fingerprint`` summed."""
    from pyspark.sql import functions as F

    from benchmarks.workloads import Summary

    row = frame.agg(F.count(F.lit(1)).alias("n"), F.sum(fingerprint).alias("s")).collect()[0]
    return Summary(int(row["n"]), int(row["s"] or 0))


def key_values(spark: SparkSession, sizes: Sizes) -> DataFrame:
    """The (key, value) elements of ``sizes`` (``workloads.key_values``), columns ``k``, ``v``."""
    keys = sizes.keys

    def rows(start: int, stop: int) -> Iterator[tuple[int, int]]:
        return ((i % keys, i) for i in range(start, stop))

    return _per_seed(spark, sizes, sizes.elements, rows, (("k", "long"), ("v", "long")))


def wordcount(spark: SparkSession, inputs: Inputs) -> Summary:
    """The file's lines split in Python (``str.split``), the words counted by ``groupBy``."""

    def words(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            split = [(w,) for line in batch.column("value").to_pylist() for w in line.split()]
            yield from record_batches(split, ["word"], ["string"])

    lines = spark.read.text(str(inputs.text_path))
    counts = lines.mapInArrow(words, "word string").groupBy("word").count()
    return frame_summary(counts, "count")


def groupbykey(spark: SparkSession, inputs: Inputs) -> Summary:
    """Grouped by ``groupBy().agg(collect_list)``, each key's values summed in Python
    (``mapInArrow`` over the lists; ``applyInArrow`` makes a Python call per key, slower)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    def totals(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            sums = [sum(values) for values in batch.column("vs").to_pylist()]
            yield pa.RecordBatch.from_arrays([pa.array(sums, pa.int64())], ["s"])

    grouped = key_values(spark, inputs.sizes).groupBy("k").agg(F.collect_list("v").alias("vs"))
    return frame_summary(grouped.mapInArrow(totals, "s long"), "s")


def combineperkey(spark: SparkSession, inputs: Inputs) -> Summary:
    """Summed per key by ``groupBy().agg(sum)``."""
    from pyspark.sql import functions as F

    sums = key_values(spark, inputs.sizes).groupBy("k").agg(F.sum("v").alias("s"))
    return frame_summary(sums, "s")


def sideinput(spark: SparkSession, inputs: Inputs) -> Summary:
    """Each element weighed in Python by a broadcast dict (``workloads._weighted``)."""
    from benchmarks.workloads import _weight, _weighted

    sizes = inputs.sizes
    broadcast = spark.sparkContext.broadcast({k: _weight(k) for k in range(sizes.keys)})
    keys = sizes.keys

    def rows(start: int, stop: int) -> Iterator[tuple[int]]:
        weights = broadcast.value
        return ((_weighted((i % keys, i), weights),) for i in range(start, stop))

    weighted = _per_seed(spark, sizes, sizes.elements, rows, (("w", "long"),))
    return frame_summary(weighted, "w")


def _stateless_fingerprints(query: int) -> Callable[[nexmark.Event], Iterable[int]]:
    """Nexmark q0-q2 on one event, as the RDD version runs it: its outputs' fingerprints."""
    fingerprint = nexmark.FINGERPRINTS[query]
    if query == 0:
        return lambda e: (fingerprint(nexmark._round_trip(e)),)
    if query == 1:
        return lambda e: (fingerprint(nexmark._to_euro(e)),) if nexmark._is_bid(e) else ()
    if query == 2:
        return lambda e: (fingerprint(nexmark._q2_project(e)),) if nexmark._q2_keep(e) else ()
    raise ValueError(f"Nexmark q{query} is not one of the stateless queries 0, 1 and 2")


def event_fields(item: nexmark.Event) -> dict[str, Any]:
    """An event's fields under the names ``nexmark.event_columns`` gives them."""
    ms = nexmark.millis(item)
    if isinstance(item, nexmark_model.Person):
        return {
            "kind": 0,
            "id": item.id,
            "name": item.name,
            "city": item.city,
            "state": item.state,
            "ms": ms,
        }
    if isinstance(item, nexmark_model.Auction):
        return {
            "kind": 1,
            "id": item.id,
            "seller": item.seller,
            "reserve": item.reserve,
            "expires": int(item.expires.micros) // 1000,
            "category": item.category,
            "ms": ms,
        }
    return {
        "kind": 2,
        "auction": item.auction,
        "bidder": item.bidder,
        "price": item.price,
        "ms": ms,
    }


def nexmark_query(query: int, spark: SparkSession, sizes: Sizes) -> Summary:
    """Nexmark ``query`` over the events made in Python (``mapInArrow``)."""
    if query in (0, 1, 2):
        outputs = _stateless_fingerprints(query)

        def fingerprints(start: int, stop: int) -> Iterator[tuple[int]]:
            return ((f,) for item in nexmark.events(start, stop) for f in outputs(item))

        frame = _per_seed(spark, sizes, sizes.events, fingerprints, (("f", "long"),))
        return frame_summary(frame, "f")
    if query not in QUERY_FIELDS:
        raise ValueError(f"no mapInArrow version of Nexmark query {query}")
    names = QUERY_FIELDS[query]

    def fields(start: int, stop: int) -> Iterator[tuple[Any, ...]]:
        for item in nexmark.events(start, stop):
            values = event_fields(item)
            yield tuple(values.get(name) for name in names)

    schema = [(name, EVENT_FIELDS[name]) for name in names]
    frame = _per_seed(spark, sizes, sizes.events, fields, schema)
    row = nexmark.sql_query(query, frame).collect()[0]
    from benchmarks.workloads import Summary

    return Summary(int(row["results"]), int(row["checksum"] or 0))
