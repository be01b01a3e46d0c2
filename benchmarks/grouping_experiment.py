"""How much Spark's per-group Python call costs, against grouping whole Arrow batches.

``python -m benchmarks.grouping_experiment [--rows 200000] [--keys 1000,10000,50000]``

SparkStructuredRunner runs a GroupByKey as ``groupBy(key).applyInArrow(f)``: Spark sends
each key's rows to Python as its own Arrow stream and calls ``f`` once per key. This
experiment times three ways of producing one output row per key from the same
(key binary, element binary) rows on local[2], with a trivial Python function, so that only
the plumbing differs:

* ``applyInArrow``: ``groupBy(key).applyInArrow``, one call (and Arrow stream) per key;
* ``sorted mapInArrow``: ``repartition(key).sortWithinPartitions(key).mapInArrow``: Python
  sees whole Arrow batches sorted by key and cuts them into key runs itself (carrying the
  last, possibly incomplete, run to the next batch);
* ``RDD groupByKey``: PySpark's RDD API on (key, element) pairs, for reference.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_LOGGER = logging.getLogger("benchmarks.grouping_experiment")
OUT_SCHEMA = pa.schema([pa.field("key", pa.binary()), pa.field("n", pa.int64())])
OUT_DDL = "key binary, n long"


def per_group(table: pa.Table) -> pa.Table:
    """One key's rows -> (key, count)."""
    return pa.table({"key": [table.column("key")[0].as_py()], "n": [table.num_rows]}, OUT_SCHEMA)


def sorted_runs(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Batches sorted by key -> (key, count) per key run, across batch boundaries."""
    carry_key: bytes | None = None
    carry_count = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        keys = batch.column("key")
        # Run boundaries: positions where the key differs from the previous row.
        changed = pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))
        starts = [0] + [i + 1 for i in pc.indices_nonzero(changed).to_pylist()]
        ends = starts[1:] + [len(keys)]
        out_keys: list[bytes] = []
        out_counts: list[int] = []
        for start, end in zip(starts, ends, strict=True):
            key = keys[start].as_py()
            if key == carry_key:
                carry_count += end - start
                continue
            if carry_key is not None:
                out_keys.append(carry_key)
                out_counts.append(carry_count)
            carry_key, carry_count = key, end - start
        if out_keys:
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_keys, pa.binary()), pa.array(out_counts, pa.int64())],
                schema=OUT_SCHEMA,
            )
    if carry_key is not None:
        yield pa.RecordBatch.from_arrays(
            [pa.array([carry_key], pa.binary()), pa.array([carry_count], pa.int64())],
            schema=OUT_SCHEMA,
        )


def _timed(label: str, action: Any) -> tuple[str, float, Any]:
    start = time.perf_counter()
    value = action()
    return label, time.perf_counter() - start, value


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--keys", default="1000,10000,50000")
    parser.add_argument("--repeat", type=int, default=2, help="runs per variant (best kept)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("grouping-experiment")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    # Start the Python workers (and their imports) before timing anything.
    warm = spark.range(0, 1000, 1, 2).select(
        F.col("id").cast("string").cast("binary").alias("element"),
        (F.col("id") % 10).cast("string").cast("binary").alias("key"),
    )
    warm.groupBy("key").applyInArrow(per_group, OUT_DDL).collect()
    warm.repartition(2, "key").sortWithinPartitions("key").mapInArrow(
        sorted_runs, OUT_DDL
    ).collect()
    lines = [
        f"{args.rows:,} rows on local[2], best of {args.repeat}; seconds",
        "| keys | applyInArrow | sorted mapInArrow | RDD groupByKey |",
        "|---:|---:|---:|---:|",
    ]
    for keys in [int(k) for k in args.keys.split(",")]:
        frame = (
            spark.range(0, args.rows, 1, 2)
            .select(
                F.col("id").cast("string").cast("binary").alias("element"),
                (F.col("id") % keys).cast("string").cast("binary").alias("key"),
            )
            .cache()
        )
        frame.count()
        variants = {
            "applyInArrow": lambda f=frame: f.groupBy("key").applyInArrow(per_group, OUT_DDL),
            "sorted mapInArrow": lambda f=frame: (
                f.repartition(2, "key").sortWithinPartitions("key").mapInArrow(sorted_runs, OUT_DDL)
            ),
        }
        best: dict[str, float] = {}
        for label, build in variants.items():
            for _ in range(args.repeat):
                _, seconds, rows = _timed(label, lambda b=build: b().agg(F.sum("n")).collect())
                assert rows[0][0] == args.rows, rows
                best[label] = min(best.get(label, float("inf")), seconds)
        rdd = frame.rdd.map(lambda row: (bytes(row.key), bytes(row.element)))
        for _ in range(args.repeat):
            _, seconds, _ = _timed(
                "rdd", lambda r=rdd: r.groupByKey(2).map(lambda kv: len(list(kv[1]))).sum()
            )
            best["rdd"] = min(best.get("rdd", float("inf")), seconds)
        frame.unpersist()
        _LOGGER.info("%d keys: %s", keys, best)
        lines.append(
            f"| {keys:,} | {best['applyInArrow']:.1f} | {best['sorted mapInArrow']:.1f} "
            f"| {best['rdd']:.1f} |"
        )
    spark.stop()
    print("\n".join(lines))  # noqa: T201 - the report is this command's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
