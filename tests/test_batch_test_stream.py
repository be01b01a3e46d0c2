"""TestStream in batch: which scripts a batch run reproduces, and the pipelines they feed."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import (
    ElementEvent,
    ProcessingTimeEvent,
    WatermarkEvent,
)
from apache_beam.testing.test_stream import (
    TestStream as ScriptedStream,
)
from apache_beam.testing.util import assert_that, equal_to, equal_to_per_window
from apache_beam.transforms import deduplicate, window
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner import session
from beam_spark_runner.batch_test_stream import streaming_only_reason
from beam_spark_runner.errors import UnsupportedFeatureError

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _elements(*timestamps: int, tag: str | None = None) -> ElementEvent:
    return ElementEvent([TimestampedValue(t, t) for t in timestamps], tag)


@pytest.mark.parametrize(
    "events",
    [
        [],
        [_elements(1, 2), _elements(3), WatermarkEvent(MAX_TIMESTAMP)],
        [WatermarkEvent(5), ProcessingTimeEvent(10), _elements(5, 9), WatermarkEvent(20)],
        [_elements(1), WatermarkEvent(10), ProcessingTimeEvent(3), WatermarkEvent(20)],
        [WatermarkEvent(50, "a"), _elements(1, tag="b"), _elements(50, tag="a")],
        [WatermarkEvent(5), ElementEvent([]), WatermarkEvent(6), _elements(7)],
    ],
)
def test_scripts_where_no_time_passes_between_elements_run_in_batch(events: list) -> None:
    assert streaming_only_reason(events) is None


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([_elements(1), WatermarkEvent(10), _elements(12)], "after a watermark advance (event 1)"),
        ([_elements(1), ProcessingTimeEvent(10), _elements(2)], "processing-time advance"),
        ([WatermarkEvent(10), _elements(12, 3)], "at Timestamp(3), behind its output's"),
        ([_elements(1, tag="a"), WatermarkEvent(9, "a"), _elements(12, tag="b")], "event 2"),
    ],
)
def test_scripts_where_time_passes_between_elements_need_streaming(
    events: list, expected: str
) -> None:
    reason = streaming_only_reason(events)
    assert reason is not None and expected in reason


def test_deduplicate_per_window_from_a_test_stream() -> None:
    # Beam's DeduplicateTest.test_deduplication_in_different_windows, on this runner.
    stream = (
        ScriptedStream(coder=coders.StrUtf8Coder())
        .advance_watermark_to(0)
        .add_elements([TimestampedValue(f"k{i % 3 + 1}", 10 * i) for i in range(6)])
        .add_elements([TimestampedValue(f"k{i}", 10 * i + 20) for i in (4, 5, 6)])
        .advance_watermark_to_infinity()
    )
    with beam.Pipeline(options=PipelineOptions(SPARK_ARGS)) as p:
        deduplicated = (
            p
            | stream
            | beam.WindowInto(window.FixedWindows(30))
            | deduplicate.Deduplicate(processing_time_duration=10 * 60)
            | beam.Map(lambda e, ts=beam.DoFn.TimestampParam: (e, ts))
        )
        assert_that(
            deduplicated,
            equal_to_per_window(
                {
                    window.IntervalWindow(0, 30): [
                        ("k1", Timestamp(0)),
                        ("k2", Timestamp(10)),
                        ("k3", Timestamp(20)),
                    ],
                    window.IntervalWindow(30, 60): [
                        ("k1", Timestamp(30)),
                        ("k2", Timestamp(40)),
                        ("k3", Timestamp(50)),
                    ],
                    window.IntervalWindow(60, 90): [
                        ("k4", Timestamp(60)),
                        ("k5", Timestamp(70)),
                        ("k6", Timestamp(80)),
                    ],
                }
            ),
            use_global_window=False,
        )


def test_tagged_outputs_timestamps_and_timestamp_combiner() -> None:
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 100), 2)], tag="main")
        .add_elements([TimestampedValue(("k", 400), 7)], tag="main")
        .add_elements(["untimed"], tag="side")
        .advance_watermark_to_infinity(tag="main")
        .advance_watermark_to_infinity(tag="side")
    )
    with beam.Pipeline(options=PipelineOptions(SPARK_ARGS)) as p:
        outputs = p | stream
        combined = (
            outputs["main"]
            | beam.WindowInto(
                window.FixedWindows(10),
                timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST,
            )
            | beam.CombinePerKey(sum)
            | beam.Map(lambda e, ts=beam.DoFn.TimestampParam: (e, ts))
        )
        assert_that(combined, equal_to([(("k", 500), Timestamp(2))]), label="main")
        side = outputs["side"] | beam.Map(lambda e, ts=beam.DoFn.TimestampParam: (e, ts))
        # Elements added without a timestamp get the output's watermark: -inf here.
        assert_that(side, equal_to([("untimed", window.MIN_TIMESTAMP)]), label="side")


def test_streaming_only_test_stream_is_refused_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_session(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started for a pipeline that must be refused")

    monkeypatch.setattr(session, "obtain_session", no_session)
    monkeypatch.setattr("beam_spark_runner.runner.obtain_session", no_session)
    stream = ScriptedStream().add_elements([1]).advance_watermark_to(10).add_elements([2])
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    _ = p | "Script" >> stream | beam.Map(print)
    with pytest.raises(UnsupportedFeatureError) as error:
        p.run()
    message = str(error.value)
    assert "'Script'" in message and "beam:transform:teststream:v1" in message
    assert "event 2 adds elements after a watermark advance (event 1)" in message
