"""Prints the streaming plan of tests/cluster/streaming_driver.py's pipeline as JSON.

Run by tests/streaming/test_checkpoint.py in several processes (``python
plan_fingerprint_script.py [text|files]``, the driver's two sinks): a restart from a
checkpoint needs the same graph, numbering and side-input order in every process.
"""

from __future__ import annotations

import json
import sys

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import build_plan
from beam_spark_runner.streaming.bounded_side_inputs import plan_broadcasts
from beam_spark_runner.streaming.checkpoint import fingerprint
from beam_spark_runner.streaming.query import plan_topology, stage_identity


def main(sink: str) -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    if sink == "text":
        write = beam.io.WriteToText("/tmp/unused/counts", triggering_frequency=5, num_shards=1)
    else:
        write = fileio.WriteToFiles("/tmp/unused", shards=1)
    _ = (
        pipeline
        | PeriodicImpulse(start_timestamp=0, stop_timestamp=10, fire_interval=1)
        | beam.Map(lambda at: ("k", 1))
        | beam.WindowInto(window.FixedWindows(5))
        | beam.CombinePerKey(sum)
        | beam.MapTuple(lambda key, count: f"{key},{count}")
        | write
    )
    pipeline.visit(bi.group_by_key_input_visitor(True))
    proto = pipeline.to_runner_api(default_environment=bi.default_environment())
    plan = build_plan(bi.prepare_pipeline_proto(proto), streaming=True)
    topology = plan_topology(plan, 2, plan_broadcasts(plan))
    print(
        json.dumps(
            {
                "topology": fingerprint(topology),
                "stages": sorted(
                    [
                        stage_identity(stage),
                        [(s.transform_id, s.tag) for s in stage.side_inputs],
                        sorted(o.buffer_id.decode() for o in stage.outputs),
                    ]
                    for stage in plan.stages
                ),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "text")
