"""TestStreams in streaming: a service's events read before the query, elements' held windows."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.testing.test_stream import WindowedValueHolder
from apache_beam.testing.test_stream_service import TestStreamServiceController as Service
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.window import GlobalWindows, IntervalWindow, TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning import TEST_STREAM_URN
from beam_spark_runner.streaming.check import check_streaming_pipeline
from beam_spark_runner.streaming.test_stream import (
    TestStreamServiceError,
    carry_held_windows,
    inline_service_events,
)
from tests.conftest import SPARK_TEST_MASTER

CODER = beam.coders.StrUtf8Coder()


def _scripted() -> ScriptedStream:
    return (
        ScriptedStream(coder=CODER)
        .advance_watermark_to(10)
        .add_elements(["a", "b"])
        .advance_processing_time(7)
        .add_elements([TimestampedValue("late", 4.0015)])
        .advance_watermark_to_infinity()
    )


def _payload(proto: bi.beam_runner_api_pb2.Pipeline) -> bi.beam_runner_api_pb2.TestStreamPayload:
    (transform,) = [
        t for t in proto.components.transforms.values() if t.spec.urn == TEST_STREAM_URN
    ]
    return bi.beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload)


def _pipeline_proto(stream: ScriptedStream) -> bi.beam_runner_api_pb2.Pipeline:
    pipeline = beam.Pipeline()
    _ = pipeline | stream | beam.Map(str.upper)
    return pipeline.to_runner_api()


@pytest.fixture
def service() -> Iterator[Service]:
    # The service streams events as Beam's interactive cache writes them: in microseconds.
    events = [event.to_runner_api(CODER) for event in _scripted()._events]
    for event in events:
        if event.HasField("element_event"):
            for element in event.element_event.elements:
                element.timestamp *= 1000
        elif event.HasField("watermark_event"):
            event.watermark_event.new_watermark *= 1000
        elif event.HasField("processing_time_event"):
            event.processing_time_event.advance_duration *= 1000

    class Reader:
        def read_multiple(self, unused_keys: object) -> Iterator[object]:
            yield from events

    controller = Service(reader=Reader())
    controller.start()
    yield controller
    controller.stop()


def test_service_events_become_the_payloads_events_in_milliseconds(
    service: Service,
) -> None:
    served = _pipeline_proto(ScriptedStream(coder=CODER, endpoint=service.endpoint))
    assert _payload(served).endpoint.url == service.endpoint
    inlined = _payload(inline_service_events(served))
    expected = _payload(_pipeline_proto(_scripted()))
    assert not inlined.endpoint.url
    assert list(inlined.events) == list(expected.events)
    # The pipeline the runner was given is left as it was.
    assert _payload(served).endpoint.url == service.endpoint


def test_a_pipeline_without_a_service_is_returned_as_it_is() -> None:
    proto = _pipeline_proto(_scripted())
    assert inline_service_events(proto) is proto


def test_an_unreachable_service_says_what_the_runner_needs() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    proto = _pipeline_proto(ScriptedStream(coder=CODER, endpoint=f"localhost:{port}"))
    with pytest.raises(TestStreamServiceError, match="must be up and must end its event stream"):
        inline_service_events(proto, timeout=2)


_INTERVAL_WINDOW_CODER_URN = bi.common_urns.coders.INTERVAL_WINDOW.urn
GLOBAL_WINDOW_CODER_URN = bi.common_urns.coders.GLOBAL_WINDOW.urn
_RECORDED: list[Any] = []


def _held(value: Any, at: int, start: int, end: int, index: int) -> WindowedValueHolder:
    timing = PaneInfoTiming.EARLY if index == 0 else PaneInfoTiming.LATE
    pane = PaneInfo(index == 0, False, timing, index, -1 if index == 0 else index)
    return WindowedValueHolder(
        WindowedValue(value, Timestamp(at), [IntervalWindow(start, end)], pane)
    )


def _held_stream() -> ScriptedStream:
    return (
        ScriptedStream()
        .advance_watermark_to(10)
        .add_elements([_held(("k", "a"), 5, 5, 10, 0), _held(("k", "b"), 7, 0, 20, 0)])
        .advance_watermark_to(30)
        .add_elements([_held(("k", "c"), 8, 5, 10, 1), "plain"])
        .advance_watermark_to_infinity()
    )


def _interval_stream() -> ScriptedStream:
    # Watermarks short of the windows' ends: a stateful DoFn drops elements of an expired
    # window, as Beam's runners do, where DirectRunner (which never clears state) keeps them.
    return (
        ScriptedStream()
        .advance_watermark_to(4)
        .add_elements([_held(("k", "a"), 5, 5, 10, 0), _held(("k", "b"), 7, 0, 20, 0)])
        .advance_watermark_to(9)
        .add_elements([_held(("k", "c"), 8, 5, 10, 1)])
        .advance_watermark_to_infinity()
    )


class _Record(beam.DoFn):  # type: ignore[misc]
    """An element with its timestamp, window and pane, as plain data."""

    def process(
        self,
        element: Any,
        t: Any = beam.DoFn.TimestampParam,
        w: Any = beam.DoFn.WindowParam,
        pane: Any = beam.DoFn.PaneInfoParam,
    ) -> Iterator[Any]:
        yield (element, t.micros, (float(w.start), float(w.end)), pane.timing, pane.index)


class _CountPerWindow(beam.DoFn):  # type: ignore[misc]
    """A stateful DoFn: its state is per key and window, so windows must arrive intact."""

    SEEN = userstate.CombiningValueStateSpec("seen", sum)

    def process(
        self, kv: Any, w: Any = beam.DoFn.WindowParam, seen: Any = beam.DoFn.StateParam(SEEN)
    ) -> Iterator[Any]:
        seen.add(1)
        yield (kv[1], (float(w.start), float(w.end)), seen.read())


def _held_windows_pipeline(pipeline: beam.Pipeline) -> Any:
    held = pipeline | _interval_stream()
    return (
        held | "Record" >> beam.ParDo(_Record()),
        held | "Count" >> beam.ParDo(_CountPerWindow()) | "RecordCount" >> beam.ParDo(_Record()),
    )


def test_held_interval_windows_travel_in_an_interval_window_coder() -> None:
    proto = _pipeline_proto(_interval_stream())
    carried = carry_held_windows(proto)
    components = carried.components
    upper = next(t for t in components.transforms.values() if t.unique_name == "Map(upper)")
    for pcoll in (*upper.inputs.values(), *upper.outputs.values()):
        strategy = components.windowing_strategies[
            components.pcollections[pcoll].windowing_strategy_id
        ]
        assert components.coders[strategy.window_coder_id].spec.urn == _INTERVAL_WINDOW_CODER_URN
    # Nothing to carry: the proto as it was; a streaming run no longer refuses the holders.
    plain = _pipeline_proto(_scripted())
    assert carry_held_windows(plain) is plain
    check_streaming_pipeline(carried)


def test_a_windowing_after_the_stream_keeps_its_own_window_coder() -> None:
    pipeline = beam.Pipeline()
    _ = pipeline | _interval_stream() | beam.WindowInto(GlobalWindows()) | beam.Map(str)
    components = carry_held_windows(pipeline.to_runner_api()).components
    mapped = next(t for t in components.transforms.values() if t.unique_name == "Map(str)")
    (pcoll,) = mapped.outputs.values()
    strategy = components.windowing_strategies[components.pcollections[pcoll].windowing_strategy_id]
    assert components.coders[strategy.window_coder_id].spec.urn == GLOBAL_WINDOW_CODER_URN


def test_held_windows_mixed_with_the_global_window_are_refused_naming_them() -> None:
    with pytest.raises(UnsupportedFeatureError, match="GlobalWindow, IntervalWindow"):
        carry_held_windows(_pipeline_proto(_held_stream()))


def test_held_windows_flattened_with_the_global_window_are_refused_naming_the_flatten() -> None:
    pipeline = beam.Pipeline()
    held = pipeline | _interval_stream()
    plain = pipeline | "Plain" >> ScriptedStream().add_elements([("k", "x")])
    _ = (held, plain) | "Both" >> beam.Flatten()
    with pytest.raises(UnsupportedFeatureError, match="Flatten 'Both'"):
        carry_held_windows(pipeline.to_runner_api())


def _record(element: Any) -> None:
    _RECORDED.append(element)


@pytest.mark.spark
def test_held_windows_stream_as_direct_runner_emits_them() -> None:
    direct = PipelineOptions(["--runner=DirectRunner", "--streaming"])
    _RECORDED.clear()
    with beam.Pipeline(options=direct) as pipeline:
        recorded, counted = _held_windows_pipeline(pipeline)
        _ = (recorded, counted) | beam.Flatten() | beam.Map(_record)
    expected = sorted(_RECORDED, key=repr)
    assert len(expected) == 6
    assert {window for _, _, window, _, _ in expected} == {(5.0, 10.0), (0.0, 20.0)}
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    recorded, counted = _held_windows_pipeline(pipeline)
    assert_that((recorded, counted) | beam.Flatten(), equal_to(expected))
    result = pipeline.run()
    assert result.wait_until_finish() == PipelineState.DONE
    # It streamed: one micro-batch per event at least, not a batch run.
    assert result.micro_batches >= 5
