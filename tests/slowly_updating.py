"""Beam's slowly-updating side input pattern, run in streaming with what each element saw.

The main input is a ``PeriodicImpulse`` (one element a second, its timestamp as value) in
fixed windows of ``WINDOW`` seconds; it reads a side input as a singleton. ``run`` builds
the pipeline with a reader from the caller, records each output (main value, side value)
with the wall-clock time it was written, and returns the records once the run is done.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from tests.conftest import SPARK_TEST_MASTER

WINDOW = 5
SECONDS = 30
# The source starts this long after the pipeline is built: a busy machine took up to 40 s
# to start the query and run its first micro-batch, which then caught up with the source.
START_DELAY = 20


class _Record(beam.DoFn):  # type: ignore[misc]
    """Appends each (main, side) pair and the time it came to a file of the worker's."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def process(self, pair: tuple[float, float]) -> Any:
        with open(os.path.join(self.directory, f"{os.getpid()}.jsonl"), "a") as out:
            out.write(json.dumps([float(pair[0]), float(pair[1]), time.time()]) + "\n")
        yield pair


def start_and_end() -> tuple[float, float]:
    """The source's first and end timestamps: ``SECONDS`` from a window boundary to come."""
    start = float(int(time.time() + START_DELAY) // WINDOW * WINDOW)
    return start, start + SECONDS


def run(
    directory: Path,
    side: Callable[[beam.Pipeline, float, float], Any],
    read: Callable[[Any, Any], Any],
) -> tuple[float, float, list[tuple[float, float, float]]]:
    """Runs the pattern in streaming; its start, end and records (main, side, wall time).

    ``side(pipeline, start, end)`` makes the side input; ``read(main, view)`` makes the
    (main, side) pairs from the windowed main input and the side input as a singleton.
    """
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    start, end = start_and_end()
    with beam.Pipeline(options=options) as pipeline:
        view = beam.pvalue.AsSingleton(side(pipeline, start, end))
        main = (
            pipeline
            | "Main" >> PeriodicImpulse(start, end, 1)
            | "MainWindows" >> beam.WindowInto(window.FixedWindows(WINDOW))
        )
        _ = read(main, view) | beam.ParDo(_Record(str(directory)))
    records = [
        tuple(json.loads(line))
        for path in directory.iterdir()
        for line in path.read_text().splitlines()
    ]
    return start, end, sorted(records)  # type: ignore[arg-type]


def windowed_side(pipeline: beam.Pipeline, start: float, end: float) -> Any:
    """Beam's Python form: a ``PeriodicImpulse`` side input, each element its own window."""
    return pipeline | "Side" >> PeriodicImpulse(start, end, WINDOW, apply_windowing=True)
