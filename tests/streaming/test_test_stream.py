"""A service-backed TestStream's events, read on the driver before the query starts."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.testing.test_stream_service import TestStreamServiceController as Service
from apache_beam.transforms.window import TimestampedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import TEST_STREAM_URN
from beam_spark_runner.streaming.test_stream import TestStreamServiceError, inline_service_events

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
