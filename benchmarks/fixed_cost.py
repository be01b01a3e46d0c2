"""The fixed cost of a pipeline: issue 14's 8-element pipeline on a warm session.

``Create`` of 8 → ``FlatMap`` → ``Map`` → ``Count.Globally``, run ``--runs`` times after
``--warmup`` runs, on SparkStructuredRunner (``local[2]``) and, interleaved run by run, on
FnApiRunner (what DirectRunner runs batch pipelines on). Each run is timed from building
the pipeline to ``wait_until_finish()``; construction alone is reported too, since Beam
pays it whatever the runner. FnApiRunner runs in ours' process: after ours' warm-up, the
memo of Beam's signature inspection that ours installs
(``beam_internals.cache_function_signatures``) serves FnApiRunner's construction and
``to_runner_api`` too, so its figure here is below its time in a process of its own.

Also interleaved: ``pyspark``, the same shape hand-written in PySpark, Spark's own floor
for it: 8 rows, a Python stage (``mapInArrow``: each row and its successor, doubled), a
shuffle to one partition, a Python stage counting, and the count collected. No Beam, so no
construction. It runs in a process of its own, on a session with every setting of the
runner's (``benchmarks.peers``), and is timed there.

    .venv/bin/python -m benchmarks.fixed_cost --runs 20
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

_LOGGER = logging.getLogger(__name__)


def _build(p: beam.Pipeline) -> None:
    (
        p
        | beam.Create(list(range(8)))
        | beam.FlatMap(lambda x: [x, x + 1])
        | beam.Map(lambda x: x * 2)
        | beam.combiners.Count.Globally()
    )


def _timed(make: Callable[[], beam.Pipeline]) -> tuple[float, float]:
    """(total, construction) seconds of one run of the pipeline ``make`` starts."""
    started = time.perf_counter()
    p = make()
    _build(p)
    built = time.perf_counter() - started
    p.run().wait_until_finish()
    return time.perf_counter() - started, built


def _ours(master: str) -> Callable[[], beam.Pipeline]:
    args = ["--runner=SparkStructuredRunner", f"--spark_master={master}"]
    return lambda: beam.Pipeline(options=PipelineOptions(args))


def _fn_api() -> beam.Pipeline:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions([]))


def _expand(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        values = batch.column(0).to_pylist()
        doubled = [y * 2 for x in values for y in (x, x + 1)]
        yield pa.RecordBatch.from_pydict({"v": pa.array(doubled, pa.int64())})


def _count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    count = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"n": pa.array([count], pa.int64())})


def _pyspark_run(spark: Any) -> tuple[float, float]:
    """(total, 0) seconds of the same shape hand-written in PySpark on ``spark``."""
    # By their importable module's name: in the spawned process this module is __mp_main__,
    # which Python workers cannot resolve.
    from benchmarks import fixed_cost

    started = time.perf_counter()
    rows = spark.createDataFrame([(i,) for i in range(8)], "v long")
    counted = (
        rows.mapInArrow(fixed_cost._expand, "v long")
        .repartition(1)
        .mapInArrow(fixed_cost._count, "n long")
    )
    (result,) = counted.collect()
    if result.n != 16:
        raise RuntimeError(f"the PySpark line counted {result.n} rows, expected 16")
    return time.perf_counter() - started, 0.0


def serve_pyspark(connection: Connection, master: str) -> None:
    """The PySpark line's process: a session with the runner's settings, then a timed run
    per ``True`` received, its seconds sent back, until ``False``."""
    from benchmarks import peers

    # The Python workers import this package, as benchmarks.run gives them it.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    spark = peers.start_session(master, "fixed-cost-pyspark", peers.runner_conf(master))
    try:
        while connection.recv():
            connection.send(_pyspark_run(spark))
    finally:
        spark.stop()


class PySparkLine:
    """The hand-written PySpark line in a process of its own (a fresh interpreter), so that
    its session is its own and not the one ours started in this process."""

    def __init__(
        self, master: str, serve: Callable[[Connection, str], None] = serve_pyspark
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=serve, args=(child, master), name="pyspark-line")
        self._process.start()
        child.close()

    def __call__(self) -> tuple[float, float]:
        """One timed run in the line's process: (total, construction) seconds."""
        self._connection.send(True)
        try:
            total, built = self._connection.recv()
        except EOFError:
            raise RuntimeError(
                f"the PySpark line's process ended (exit code {self._process.exitcode}): "
                "see its log above"
            ) from None
        return float(total), float(built)

    def close(self) -> None:
        """Stops the line's session and process."""
        try:
            self._connection.send(False)
        except (BrokenPipeError, OSError):
            pass
        self._connection.close()
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def main(argv: list[str] | None = None) -> int:
    """Runs both runners interleaved and logs medians."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    # Beam configures the root logger on import; report through this module's own handler.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    ours, fn_api = _ours(args.master), _fn_api
    pyspark = PySparkLine(args.master)
    runners: dict[str, Callable[[], tuple[float, float]]] = {
        "ours": lambda: _timed(ours),
        "fnapi": lambda: _timed(fn_api),
        "pyspark": pyspark,
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    try:
        for run in runners.values():
            for _ in range(args.warmup):
                run()
        for index in range(args.runs):
            order = list(runners) if index % 2 == 0 else list(runners)[::-1]
            for name in order:
                results[name].append(runners[name]())
    finally:
        pyspark.close()
    for name, runs in results.items():
        totals = [total for total, _ in runs]
        _LOGGER.info(
            "%-7s median %.3f s (min %.3f), construction median %.3f s, over %d runs",
            name,
            statistics.median(totals),
            min(totals),
            statistics.median([built for _, built in runs]),
            len(runs),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
