"""CPU time per event of a Nexmark query's first stage, ours against the floor's, without Spark.

``python -m benchmarks.first_stage_cpu --queries 0,7 [--rows 100000] [--repeats 5]``

``benchmarks.streaming_cpu`` reads a whole query's CPU time across Spark's processes; on a
loaded machine its figures move by a few microseconds an event from trial to trial. This
runs, in this one process, the part of ours that does the per-event work: the router that
reads the ``rate`` source's rows (``ReadFromSparkStream``'s ``mapInArrow`` body, then the
router's stages and routing, as a task runs them), over Arrow batches of the ``rate``
source's columns, beside the floor's Python for the same events (``streaming_floor``'s
first ``mapInArrow``: the generator and the query's user code up to its grouping; q7 and
q8 their elements encoded and packed per window). Each is timed by this process's CPU
time, batch after batch in turn; the least of ``--repeats`` batches is reported. It leaves
out what happens in the JVM and the stateful levels' work (on q7 and q8 buffering the
elements, then handing them to the user code; on q5 and q11 the counts).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

# The rate source's rows in a batch share a millisecond 100 at a time (200 000 rows/s).
_ROWS_PER_MILLI = 100
_START_MICROS = 1_700_000_000_000_000


def rate_batch(first: int, rows: int) -> Any:
    """``rows`` rows of the ``rate`` source's columns, ``value`` from ``first`` on."""
    import numpy as np
    import pyarrow as pa

    values = np.arange(first, first + rows, dtype=np.int64)
    micros = _START_MICROS + (values // _ROWS_PER_MILLI) * 1000
    return pa.RecordBatch.from_arrays(
        [pa.array(micros, pa.timestamp("us")), pa.array(values)], ["timestamp", "value"]
    )


def ours_first_stage(query: int, runs: bool = True) -> Callable[[Any], list[Any]]:
    """Ours' first router for ``query`` (as ``streaming.run_ours`` builds the pipeline):
    a function of a ``rate`` batch that runs it and gives the batches of rows it routes.
    ``runs=False``: a stage with side inputs gets its main elements one by one, not in
    pickled runs."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, TypeOptions
    from apache_beam.testing.benchmarks.nexmark import nexmark_util

    from beam_spark_runner import beam_internals as bi
    from beam_spark_runner.execution.beam_globals import TaskEnvironment
    from beam_spark_runner.execution.stage_worker import NO_SINKS, OutputSpec, StageSpec
    from beam_spark_runner.io import ReadFromSparkStream
    from beam_spark_runner.planning import build_plan
    from beam_spark_runner.streaming.query import pickled_outputs, plan_topology
    from beam_spark_runner.streaming.router import RouterSpec, run_router
    from beam_spark_runner.streaming.spark_sources import (
        RowsToElements,
        spark_stream_roots,
        stream_columns,
    )
    from benchmarks import nexmark, streaming

    nexmark_util.setup_coder()
    options = PipelineOptions(["--runner=SparkStructuredRunner"])
    options.view_as(TypeOptions).allow_unsafe_triggers = True  # q11's trigger, as streaming's
    pipeline = beam.Pipeline(options=options)
    windowed = query in streaming.WINDOWED
    events = (
        pipeline
        | ReadFromSparkStream("rate", options={"rowsPerSecond": 1, "numPartitions": 2})
        | "Event"
        >> (
            beam.ParDo(streaming._Events(tempfile.mkdtemp()))
            if windowed
            else beam.Map(streaming.event_of_row)
        )
    )
    module = importlib.import_module(f"apache_beam.testing.benchmarks.nexmark.queries.query{query}")
    output = module.load(events, dict(nexmark.QUERY_ARGS), pipeline.options)
    sink = streaming._Panes(tempfile.mkdtemp()) if windowed else streaming._Drop()
    _ = output | "Sink" >> beam.ParDo(sink)
    proto = bi.prepare_pipeline_proto(
        pipeline.to_runner_api(default_environment=bi.default_environment())
    )
    plan = build_plan(proto, streaming=True)
    topology = plan_topology(plan, 2)
    (root,) = spark_stream_roots(plan)
    coder = bi.PipelineContext(plan.components).coders[root.coder_id]
    read = RowsToElements(root.name, root.producer, topology, root.spec, coder)

    def spec(node: Any) -> StageSpec:
        stage = plan.stage(node.name)
        keyed = {o.transform_id for o in stage.outputs if plan.is_keyed(o.buffer_id)}
        return StageSpec(
            environment=TaskEnvironment(f"first-stage-cpu-{query}"),
            name=stage.name,
            display_name=stage.display_name,
            descriptor=stage.descriptor.SerializeToString(),
            input_transform_id=stage.input_transform_id,
            outputs=tuple(
                OutputSpec(
                    o.transform_id,
                    plan.safe_coders.get(o.coder_id, o.coder_id)
                    if o.transform_id in keyed
                    else None,
                )
                for o in stage.outputs
            ),
        )

    stages = {node.index: spec(node) for node in topology.stateless_in(0)}
    router = RouterSpec(
        0,
        topology,
        stages,
        stream_columns(plan, topology),
        pickled_outputs(plan, topology, stages) if runs else {},
    )

    def run(batch: Any) -> list[Any]:
        return list(run_router(router, list(read.convert([batch])), NO_SINKS))

    return run


def floor_first_stage(query: int) -> Callable[[Any], Any]:
    """The floor's Python for a ``rate`` batch (``streaming_floor.batch_step``)."""
    from benchmarks import streaming_floor

    return streaming_floor.batch_step(query)


def measure(query: int, rows: int, repeats: int) -> dict[str, Any]:
    """CPU µs per event of ours' first stage and the floor's, the least of ``repeats``."""
    from benchmarks import streaming_floor

    runners: dict[str, Callable[[Any], Any]] = {"ours": ours_first_stage(query)}
    if query in streaming_floor.PYTHON_FLOOR_QUERIES:
        runners["floor"] = floor_first_stage(query)
    for run in runners.values():  # set up: DoFns, coders, caches
        run(rate_batch(0, min(rows, 1000)))
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for repeat in range(repeats):
        batch = rate_batch((repeat + 1) * rows, rows)
        for name, run in runners.items():
            began = time.process_time()
            run(batch)
            seconds[name].append(time.process_time() - began)
    ours = min(seconds["ours"]) / rows * 1e6
    result: dict[str, Any] = {
        "query": query,
        "rows": rows,
        "repeats": repeats,
        "ours_us_per_event": round(ours, 2),
    }
    if "floor" in seconds:
        floor = min(seconds["floor"]) / rows * 1e6
        result["floor_us_per_event"] = round(floor, 2)
        result["ours_over_floor"] = round(ours / floor, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", default="0,1,2,7")
    parser.add_argument("--rows", type=int, default=100_000, help="events per batch")
    parser.add_argument("--repeats", type=int, default=5, help="batches timed per runner")
    args = parser.parse_args(argv)
    for query in (int(q) for q in args.queries.split(",")):
        print(json.dumps(measure(query, args.rows, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
