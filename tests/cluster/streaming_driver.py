"""A driver process for the streaming cluster test: an unbounded pipeline writing files.

``python streaming_driver.py --output-dir=D --start=S [--seconds=N] --runner=... [options]``
runs PeriodicImpulse -> FixedWindows -> CombinePerKey -> WriteToText(triggering_frequency)
with ``--streaming`` and writes the files under D.
"""

from __future__ import annotations

import argparse
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--seconds", type=float, default=10, help="the sequence's length")
    args, pipeline_args = parser.parse_known_args(argv)
    options = PipelineOptions([*pipeline_args, "--streaming"])
    with beam.Pipeline(options=options) as pipeline:
        _ = (
            pipeline
            | PeriodicImpulse(
                start_timestamp=args.start,
                stop_timestamp=args.start + args.seconds,
                fire_interval=1,
            )
            | beam.Map(lambda at: (f"k{int(at) % 3}", 1))
            | beam.WindowInto(window.FixedWindows(5))
            | beam.CombinePerKey(sum)
            | beam.MapTuple(lambda key, count: f"{key},{count}")
            | beam.io.WriteToText(f"{args.output_dir}/counts", triggering_frequency=5, num_shards=1)
        )


if __name__ == "__main__":
    main(sys.argv[1:])
