"""The batched path for stateless steps (issue 14, item 1), on and off, A/B.

Two measurements, each interleaved run by run between the path on and off, medians:

* ``--mode stage`` (no Spark, one core): the fused stage ``Create/Map(decode) → FlatMap →
  Map → Filter → Map → GroupByKey/Write``, planned by the runner and run by its
  ``StageWorker`` over 4 seeds that expand to ``--elements`` elements (half pass the
  Filter); CPU seconds of this process per run (``time.process_time``).
* ``--mode pipeline``: the same chain as a whole pipeline on a warm ``local[2]`` session,
  ending in a ``Count.Globally`` (``--sink count``: its precombine runs in the bundle
  processor, after the hand-off) or with the chain's last Map (``--sink none``: the stage
  runs batched throughout), wall seconds from building the pipeline to
  ``wait_until_finish()``.

    .venv/bin/python -m benchmarks.batched_steps --mode stage --runs 9
    .venv/bin/python -m benchmarks.batched_steps --mode pipeline --elements 2000000 --runs 5
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import time
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.beam_globals import TaskEnvironment
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    StageSpec,
    run_stage,
    tear_down_stage_workers,
)
from beam_spark_runner.planning import build_plan
from tests.stage_specs import stage_spec

_LOGGER = logging.getLogger(__name__)
SEEDS = 4


def _chain(seeds: Any, per_seed: int) -> Any:
    return (
        seeds
        | beam.FlatMap(lambda s: range(s * per_seed, (s + 1) * per_seed))
        | beam.Map(lambda x: x * 3)
        | beam.Filter(lambda x: x % 2 == 0)
        | beam.Map(lambda x: (x % 1000, x))
    )


def _specs(elements: int) -> tuple[StageSpec, StageSpec]:
    """The Create's stage (whose output is the chain's input) and the chain's stage."""
    p = beam.Pipeline()
    _ = _chain(p | beam.Create(list(range(SEEDS))), elements // SEEDS) | beam.GroupByKey()
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    create, chain = (stage_spec(plan, stage, "bench") for stage in plan.stages[:2])
    return create, chain


def _stage_input(create: StageSpec) -> pa.RecordBatch:
    impulse = pa.RecordBatch.from_arrays(
        [pa.array([bi.ENCODED_IMPULSE_VALUE], type=pa.binary())], names=[ELEMENT]
    )
    elements = [
        cell for batch in run_stage(create, [impulse]) for cell in batch.column(ELEMENT).to_pylist()
    ]
    return pa.RecordBatch.from_arrays([pa.array(elements, type=pa.binary())], names=[ELEMENT])


def _cpu_seconds(spec: StageSpec, batch: pa.RecordBatch) -> tuple[float, int]:
    started = time.process_time()
    rows = sum(b.num_rows for b in run_stage(spec, [batch]))
    return time.process_time() - started, rows


def stage_mode(elements: int, runs: int) -> dict[str, list[float]]:
    """CPU seconds per run of the chain's stage, path on and off, interleaved."""
    create, chain = _specs(elements)
    batch = _stage_input(create)
    variants = {
        "on": dataclasses.replace(
            chain, batched_steps=True, environment=TaskEnvironment("bench-on")
        ),
        "off": dataclasses.replace(
            chain, batched_steps=False, environment=TaskEnvironment("bench-off")
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for spec in variants.values():  # warm-up: builds the workers, sets DoFns up
        _cpu_seconds(spec, batch)
    for _ in range(runs):
        for name, spec in variants.items():
            seconds, rows = _cpu_seconds(spec, batch)
            times[name].append(seconds)
            _LOGGER.info("%s: %.3f s CPU, %d output rows", name, seconds, rows)
    tear_down_stage_workers()
    return times


def _pipeline_seconds(elements: int, batched: str, sink: str) -> float:
    started = time.perf_counter()
    options = PipelineOptions(
        [
            "--runner=SparkStructuredRunner",
            "--spark_master=local[2]",
            f"--spark_batched_steps={batched}",
        ]
    )
    p = beam.Pipeline(options=options)
    chain = _chain(p | beam.Create(list(range(SEEDS))), elements // SEEDS)
    if sink == "count":
        _ = chain | beam.combiners.Count.Globally()
    p.run().wait_until_finish()
    return time.perf_counter() - started


def pipeline_mode(elements: int, runs: int, sink: str) -> dict[str, list[float]]:
    """Wall seconds per pipeline run, path on and off, interleaved on one warm session."""
    times: dict[str, list[float]] = {"on": [], "off": []}
    for name in times:
        _pipeline_seconds(elements, name, sink)
    for _ in range(runs):
        for name in times:
            seconds = _pipeline_seconds(elements, name, sink)
            times[name].append(seconds)
            _LOGGER.info("%s: %.3f s", name, seconds)
    return times


def main(argv: list[str] | None = None) -> None:
    """Runs the A/B and prints medians (and minimums)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("stage", "pipeline"), default="stage")
    parser.add_argument("--elements", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument(
        "--sink",
        choices=("count", "none"),
        default="count",
        help="pipeline mode: end in Count.Globally, or with the chain's last Map",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in ("py4j", "apache_beam", "beam_spark_runner"):
        logging.getLogger(name).setLevel(logging.WARNING)
    load = os.getloadavg()
    if args.mode == "stage":
        times = stage_mode(args.elements, args.runs)
    else:
        times = pipeline_mode(args.elements, args.runs, args.sink)
    unit = "CPU s" if args.mode == "stage" else "s"
    sink = f", sink {args.sink}" if args.mode == "pipeline" else ""
    print(f"{args.mode}{sink}, {args.elements} elements, {args.runs} runs each, load {load[0]:.1f}")
    for name, values in times.items():
        print(
            f"  batched {name:>3}: median {statistics.median(values):.3f} {unit} "
            f"(min {min(values):.3f})"
        )
    ratio = statistics.median(times["off"]) / statistics.median(times["on"])
    print(f"  off/on: {ratio:.2f}x")


if __name__ == "__main__":
    main()
