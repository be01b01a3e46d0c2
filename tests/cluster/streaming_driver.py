"""A driver process for the streaming cluster test: an unbounded pipeline writing files.

``python streaming_driver.py --output-dir=D --start=S [--seconds=N] [--sink=files] --runner=...``
runs PeriodicImpulse -> FixedWindows -> CombinePerKey -> WriteToText(triggering_frequency)
(or, with ``--sink=files``, ``fileio.WriteToFiles`` with one shard) with ``--streaming`` and
writes ``counts-*`` files under D.
"""

from __future__ import annotations

import argparse
import sys

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse


def _key(at: float, fail_at: float | None) -> tuple[str, int]:
    if fail_at is not None and int(at) == int(fail_at):
        raise ValueError(f"the driver was told to fail on the element at {at}")
    return (f"k{int(at) % 3}", 1)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--seconds", type=float, default=10, help="the sequence's length")
    parser.add_argument(
        "--fail-at", type=float, default=None, help="a Map fails on the element this long in"
    )
    parser.add_argument("--sink", choices=("text", "files"), default="text")
    args, pipeline_args = parser.parse_known_args(argv)
    if args.sink == "text":
        sink = beam.io.WriteToText(
            f"{args.output_dir}/counts", triggering_frequency=5, num_shards=1
        )
    else:
        sink = fileio.WriteToFiles(
            args.output_dir, file_naming=fileio.default_file_naming("counts", ".txt"), shards=1
        )
    options = PipelineOptions([*pipeline_args, "--streaming"])
    with beam.Pipeline(options=options) as pipeline:
        _ = (
            pipeline
            | PeriodicImpulse(
                start_timestamp=args.start,
                stop_timestamp=args.start + args.seconds,
                fire_interval=1,
            )
            | "Key" >> beam.Map(_key, None if args.fail_at is None else args.start + args.fail_at)
            | beam.WindowInto(window.FixedWindows(5))
            | beam.CombinePerKey(sum)
            | beam.MapTuple(lambda key, count: f"{key},{count}")
            | sink
        )


if __name__ == "__main__":
    main(sys.argv[1:])
