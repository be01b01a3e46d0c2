"""Which mode a pipeline runs in, decided before Spark starts and said in the log."""

from __future__ import annotations

import logging
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.io import ReadFromSparkStream
from beam_spark_runner.runner import may_stream, wants_streaming


def _sources() -> dict[str, tuple[bool, object]]:
    return {
        "create": (False, beam.Create([1, 2])),
        "periodic impulse": (True, PeriodicImpulse(0, 5, 1)),
        "test stream": (True, ScriptedStream().add_elements([1])),
        "spark stream": (True, ReadFromSparkStream("rate")),
    }


@pytest.mark.parametrize("source", sorted(_sources()))
def test_the_python_graph_says_what_the_proto_says(
    source: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The batch path skips building a proto to decide (part of a small pipeline's fixed
    # cost), so the Python graph must give the proto's answer.
    unbounded, transform = _sources()[source]
    options = PipelineOptions([])
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | transform | beam.Map(str)
    assert may_stream(options, pipeline) is unbounded
    caplog.set_level(logging.INFO, logger="beam_spark_runner.runner")
    proto = pipeline.to_runner_api(default_environment=bi.default_environment())
    assert wants_streaming(options, proto) is unbounded
    assert ("Streaming mode: the pipeline has an unbounded source" in caplog.text) is unbounded


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("periodic impulse", "'Ticks/"),
        ("test stream", "'Ticks' (beam:transform:teststream:v1)"),
        ("spark stream", "'Ticks' (beam:runner:spark:read_spark_stream:v1)"),
    ],
)
def test_the_mode_line_names_the_unbounded_source_not_the_sink(
    source: str, named: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # Built for this runner: ReadFromSparkStream expands to a failing step for others.
    options = PipelineOptions(["--runner=SparkStructuredRunner"])
    pipeline = beam.Pipeline(options=options)
    _ = (
        pipeline
        | "Ticks" >> _sources()[source][1]
        | beam.Map(str)
        | beam.io.WriteToText(str(tmp_path / "out"), triggering_frequency=5)
    )
    caplog.set_level(logging.INFO, logger="beam_spark_runner.runner")
    assert wants_streaming(options, pipeline.to_runner_api())
    line = next(r.getMessage() for r in caplog.records if "Streaming mode" in r.getMessage())
    assert named in line and "WriteToText" not in line, line


def test_streaming_is_asked_for_with_the_option() -> None:
    options = PipelineOptions(["--streaming"])
    pipeline = beam.Pipeline(options=options)
    _ = pipeline | beam.Create([1])
    assert may_stream(options, pipeline)
