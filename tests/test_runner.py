"""A streaming pipeline streams, runs in batch where that is proven, or is refused."""

from __future__ import annotations

import logging
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import TimestampedValue

from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning.capabilities import TEST_STREAM_URN
from beam_spark_runner.runner import SparkStructuredRunner
from beam_spark_runner.spark import compat

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]
STREAMING_REFUSAL = (
    "Stage 'Buffer' runs a stateful DoFn and reads a streamed side input (the test's refusal)."
)


class _RanInBatch(Exception):
    """Raised instead of a batch run."""


def _no_batch_run(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records the proto of a batch run and stops it before Spark starts."""
    protos: list[Any] = []

    def run_batch(self: Any, proto: Any, options: Any, settings: Any) -> None:
        protos.append(proto)
        raise _RanInBatch()

    monkeypatch.setattr(SparkStructuredRunner, "run_batch", run_batch)
    return protos


def _streaming_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The streaming path refuses every pipeline, as it does a feature it lacks."""

    def run_streaming(self: Any, proto: Any, options: Any, settings: Any = None) -> None:
        raise UnsupportedFeatureError(STREAMING_REFUSAL)

    monkeypatch.setattr(SparkStructuredRunner, "run_streaming", run_streaming)


def test_a_periodic_impulse_pipeline_that_cannot_stream_is_refused_not_run_in_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    protos = _no_batch_run(monkeypatch)
    _streaming_refuses(monkeypatch)
    # The streaming path refuses it as it refuses what it lacks (today, e.g., a stateful
    # DoFn reading a streamed side input): whatever the reason, no batch run instead.
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    _ = p | "Ticks" >> PeriodicImpulse(0, 5, 1) | beam.Map(str)
    with pytest.raises(UnsupportedFeatureError) as error:
        p.run()
    assert not protos
    message = str(error.value)
    assert message.startswith("The pipeline streams (transform 'Ticks/")
    assert STREAMING_REFUSAL in message  # why it cannot stream, and what to do there
    assert "Nor is a batch run proven to give its streaming result: Transform 'Ticks/" in message
    assert "is not a TestStream" in message
    assert "To run it, do what the first reason says" in message


def test_streaming_is_refused_on_a_pyspark_that_cannot_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PySpark 3.5 streams (on applyInPandasWithState); an older one is refused, naming 3.5."""
    protos = _no_batch_run(monkeypatch)
    streaming_needs = ".".join(str(part) for part in compat.OLDEST_STREAMING_SPARK)
    assert streaming_needs == "3.5"
    monkeypatch.setattr(compat, "pyspark_version", lambda: (3, 4))
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    _ = p | PeriodicImpulse(0, 5, 1) | beam.Map(str)
    with pytest.raises(UnsupportedFeatureError) as error:
        p.run()
    message = str(error.value)
    assert message.startswith("The pipeline streams (transform 'PeriodicImpulse/"), message
    assert f"needs Spark {streaming_needs} or newer" in message
    assert f"Install pyspark>={streaming_needs}" in message
    assert "Nor is a batch run proven" in message
    assert not protos


def test_a_test_stream_a_batch_run_reproduces_runs_in_batch_saying_what_was_checked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    protos = _no_batch_run(monkeypatch)
    _streaming_refuses(monkeypatch)
    caplog.set_level(logging.WARNING, logger="beam_spark_runner.runner")
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    stream = ScriptedStream().add_elements([TimestampedValue(("k", 1), 1)])
    _ = p | "Script" >> stream | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
    with pytest.raises(_RanInBatch):
        p.run()
    (proto,) = protos
    urns = {t.spec.urn for t in proto.components.transforms.values()}
    assert TEST_STREAM_URN not in urns
    assert f"It cannot stream here: {STREAMING_REFUSAL}" in caplog.text
    assert (
        "Checked that its batch run is one of its streaming runs: its 1 TestStream(s) have "
        "scripts a batch run reproduces" in caplog.text
    )


def test_a_bounded_pipeline_with_streaming_set_and_a_processing_time_trigger_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    protos = _no_batch_run(monkeypatch)
    _streaming_refuses(monkeypatch)
    p = beam.Pipeline(options=PipelineOptions([*SPARK_ARGS, "--streaming"]))
    _ = (
        p
        | beam.Create([("k", 1)])
        | beam.WindowInto(
            window.GlobalWindows(),
            trigger=beam.trigger.Repeatedly(beam.trigger.AfterProcessingTime(5)),
            accumulation_mode=beam.trigger.AccumulationMode.DISCARDING,
        )
        | "Panes" >> beam.GroupByKey()
    )
    with pytest.raises(UnsupportedFeatureError) as error:
        p.run()
    assert not protos
    message = str(error.value)
    assert message.startswith("The pipeline streams (--streaming is set)")
    assert "Transform 'Panes'" in message and "fires on processing time" in message


def test_a_proto_that_cannot_stream_is_refused_not_run_in_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    protos = _no_batch_run(monkeypatch)
    _streaming_refuses(monkeypatch)
    options = PipelineOptions([*SPARK_ARGS, "--streaming"])
    p = beam.Pipeline(options=options)
    _ = p | beam.Create([1]) | beam.Map(str)
    with pytest.raises(UnsupportedFeatureError, match="on the Python pipeline only"):
        SparkStructuredRunner().run_proto(p.to_runner_api(), options)
    assert not protos


@pytest.mark.spark
def test_a_proven_test_stream_pipeline_runs_in_batch_on_spark(
    monkeypatch: pytest.MonkeyPatch, beam_options: list[str]
) -> None:
    _streaming_refuses(monkeypatch)
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 1), TimestampedValue(("k", 3), 3)])
        .advance_watermark_to(10)
        .add_elements([TimestampedValue(("k", 12), 12)])
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(options=PipelineOptions(beam_options)) as p:
        grouped = (
            p
            | stream
            | beam.WindowInto(window.FixedWindows(10))
            | beam.GroupByKey()
            | beam.MapTuple(lambda key, values: (key, sorted(values)))
        )
        assert_that(grouped, equal_to([("k", [1, 3]), ("k", [12])]))
