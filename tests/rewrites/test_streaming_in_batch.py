"""Which streaming pipelines may run in batch: where a batch run is one of their streaming runs."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import TimestampedValue

from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.rewrites.batch_test_stream import BatchTestStream
from beam_spark_runner.rewrites.streaming_in_batch import prepare_batch_run


class _Transforms(beam.pipeline.PipelineVisitor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.found: list[Any] = []

    def enter_composite_transform(self, applied: Any) -> None:
        self.found.append(applied.transform)

    def visit_transform(self, applied: Any) -> None:
        self.found.append(applied.transform)


def _transforms(pipeline: beam.Pipeline) -> list[Any]:
    visitor = _Transforms()
    pipeline.visit(visitor)
    return visitor.found


class _FlushOnProcessingTime(beam.DoFn):  # type: ignore[misc]
    BUFFER = userstate.BagStateSpec("buffer", beam.coders.VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.REAL_TIME)

    def process(
        self,
        element: tuple[str, int],
        buffer: Any = beam.DoFn.StateParam(BUFFER),
        flush: Any = beam.DoFn.TimerParam(FLUSH),
    ) -> None:
        buffer.add(element[1])
        flush.set(0)

    @userstate.on_timer(FLUSH)
    def flushed(self, buffer: Any = beam.DoFn.StateParam(BUFFER)) -> Any:
        yield sorted(buffer.read())
        buffer.clear()


def test_an_unbounded_source_other_than_a_test_stream_is_not_run_in_batch() -> None:
    p = beam.Pipeline()
    _ = p | "Ticks" >> PeriodicImpulse(0, 10, 1) | beam.Map(str)
    with pytest.raises(UnsupportedFeatureError) as error:
        prepare_batch_run(p)
    message = str(error.value)
    assert "Transform 'Ticks/" in message and "is not a TestStream" in message


def test_a_test_stream_a_batch_run_reproduces_is_replaced_and_said() -> None:
    p = beam.Pipeline()
    stream = ScriptedStream().add_elements([TimestampedValue(("k", 1), 1)])
    _ = (
        p
        | "Script" >> stream.advance_watermark_to_infinity()
        | beam.WindowInto(window.FixedWindows(10))
        | beam.GroupByKey()
    )
    checked = prepare_batch_run(p)
    assert "its 1 TestStream(s) have scripts a batch run reproduces" in checked
    transforms = _transforms(p)
    assert any(isinstance(t, BatchTestStream) for t in transforms)
    assert not any(isinstance(t, ScriptedStream) for t in transforms)


def test_a_test_stream_a_batch_run_does_not_reproduce_is_refused() -> None:
    p = beam.Pipeline()
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 1)])
        .advance_watermark_to(20)
        .add_elements([TimestampedValue(("k", 2), 2)])  # late
    )
    _ = p | "Script" >> stream | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
    with pytest.raises(UnsupportedFeatureError, match=r"'Script'.*late data"):
        prepare_batch_run(p)


def test_bounded_inputs_reaching_no_processing_time_trigger_run_in_batch() -> None:
    p = beam.Pipeline()
    _ = (
        p
        | beam.Create([("k", 1), ("k", 2)])
        | beam.WindowInto(window.FixedWindows(10))
        | beam.GroupByKey()
    )
    assert prepare_batch_run(p) == (
        "every other input is bounded and reaches no transform that fires on processing time"
    )


@pytest.mark.parametrize("kind", ["trigger", "timer"])
def test_bounded_inputs_reaching_processing_time_are_not_run_in_batch(kind: str) -> None:
    # With --streaming, processing time passes while the streaming run reads its bounded
    # inputs; a batch run lets it pass only after all of them.
    p = beam.Pipeline()
    keyed = p | beam.Create([("k", 1), ("k", 2)])
    if kind == "trigger":
        windowing = beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterProcessingTime(5)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        _ = keyed | windowing | "Panes" >> beam.GroupByKey()
    else:
        _ = keyed | "Panes" >> beam.ParDo(_FlushOnProcessingTime())
    with pytest.raises(UnsupportedFeatureError) as error:
        prepare_batch_run(p)
    message = str(error.value)
    assert "Transform 'Panes'" in message and "fires on processing time" in message
