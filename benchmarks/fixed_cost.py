"""The fixed cost of a pipeline: issue 14's 8-element pipeline on a warm session.

``Create`` of 8 → ``FlatMap`` → ``Map`` → ``Count.Globally``, run ``--runs`` times after
``--warmup`` runs, on SparkStructuredRunner (``local[2]``) and, interleaved run by run, on
FnApiRunner (what DirectRunner runs batch pipelines on). Each run is timed from building
the pipeline to ``wait_until_finish()``; construction alone is reported too, since Beam
pays it whatever the runner.

    .venv/bin/python -m benchmarks.fixed_cost --runs 20
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import apache_beam as beam
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
    """(total, construction) seconds of one run."""
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
    runners = {"ours": _ours(args.master), "fnapi": _fn_api}
    for make in runners.values():
        for _ in range(args.warmup):
            _timed(make)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    for index in range(args.runs):
        order = list(runners) if index % 2 == 0 else list(runners)[::-1]
        for name in order:
            results[name].append(_timed(runners[name]))
    for name, runs in results.items():
        totals = [total for total, _ in runs]
        _LOGGER.info(
            "%-6s median %.3f s (min %.3f), construction median %.3f s, over %d runs",
            name,
            statistics.median(totals),
            min(totals),
            statistics.median([built for _, built in runs]),
            len(runs),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
