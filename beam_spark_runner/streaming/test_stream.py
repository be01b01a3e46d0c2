"""A TestStream's events as the steps of the streaming query's source (driver side).

Each event is one micro-batch, as DirectRunner takes each event to quiescence before the
next: an element event's elements (encoded here with their output's data-channel coder, in
the global window at their timestamps), a watermark event's new watermark for its output,
a processing-time event's advance of the runner's clock. After the last event every
output's watermark is +inf, as Beam's TestStream ends. A TestStream whose events come from
a service (``TestStream(endpoint=...)``) has them read here, on the driver, before the
query starts (:func:`inline_service_events`): the service must end its event stream.
"""

from __future__ import annotations

import logging

from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import SparkRunnerError
from beam_spark_runner.planning import TEST_STREAM_BUFFER_KIND, TEST_STREAM_URN, Plan
from beam_spark_runner.streaming.source_plan import SourceStep
from beam_spark_runner.streaming.watermarks import MIN_MICROS

_LOGGER = logging.getLogger(__name__)

# How long the driver waits for a TestStream service to stream all its events.
SERVICE_READ_TIMEOUT_SECONDS = 120.0


class TestStreamServiceError(SparkRunnerError, RuntimeError):
    """A TestStream's event service could not be read to its end."""

    __test__ = False  # not a pytest test class


def inline_service_events(
    proto: bi.beam_runner_api_pb2.Pipeline, timeout: float = SERVICE_READ_TIMEOUT_SECONDS
) -> bi.beam_runner_api_pb2.Pipeline:
    """``proto`` with each service-backed TestStream's events read into its payload.

    The service streams events in microseconds; a payload holds milliseconds (as
    ``TestStream.to_runner_api`` writes them), so the values are converted, flooring any
    sub-millisecond part. A proto without such a TestStream is returned as it is.
    """
    served = [
        transform
        for transform in proto.components.transforms.values()
        if transform.spec.urn == TEST_STREAM_URN
        and bi.beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload).endpoint.url
    ]
    if not served:
        return proto
    proto = bi.beam_runner_api_pb2.Pipeline.FromString(proto.SerializeToString())
    for transform in proto.components.transforms.values():
        if transform.spec.urn != TEST_STREAM_URN:
            continue
        payload = bi.beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload)
        url = payload.endpoint.url
        if not url:
            continue
        try:
            events = bi.read_test_stream_service(url, sorted(transform.outputs), timeout)
        except Exception as error:  # grpc.RpcError: unreachable, failed or too slow
            raise TestStreamServiceError(
                f"TestStream '{transform.unique_name}' reads its events from the service at "
                f"{url}, and the runner could not read them all within {timeout:.0f} s "
                f"({type(error).__name__}: {error}). The runner reads a service's events "
                "before the streaming query starts: the service must be up and must end its "
                "event stream."
            ) from error
        del payload.events[:]
        payload.events.extend(_micros_to_millis(event) for event in events)
        payload.ClearField("endpoint")
        transform.spec.payload = payload.SerializeToString()
        _LOGGER.info(
            "TestStream '%s': read %d events from its service at %s",
            transform.unique_name,
            len(events),
            url,
        )
    return proto


def _micros_to_millis(
    event: bi.beam_runner_api_pb2.TestStreamPayload.Event,
) -> bi.beam_runner_api_pb2.TestStreamPayload.Event:
    converted = bi.beam_runner_api_pb2.TestStreamPayload.Event()
    converted.CopyFrom(event)
    if converted.HasField("element_event"):
        for element in converted.element_event.elements:
            element.timestamp //= 1000
    elif converted.HasField("watermark_event"):
        converted.watermark_event.new_watermark //= 1000
    elif converted.HasField("processing_time_event"):
        converted.processing_time_event.advance_duration //= 1000
    return converted


def test_stream_steps(plan: Plan) -> list[tuple[SourceStep, ...]]:
    """Per TestStream of the plan, its steps (one per event)."""
    context = bi.PipelineContext(plan.components)
    streams = []
    for transform in plan.components.transforms.values():
        if transform.spec.urn != TEST_STREAM_URN:
            continue
        payload = bi.beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload)
        element_coder = context.coders[payload.coder_id]
        producers = {
            tag: bi.create_buffer_id(pcoll, kind=TEST_STREAM_BUFFER_KIND).decode()
            for tag, pcoll in transform.outputs.items()
        }
        impls = {
            tag: context.coders[plan.data_channel_coders[pcoll]].get_impl()
            for tag, pcoll in transform.outputs.items()
        }
        watermarks = dict.fromkeys(producers.values(), MIN_MICROS)
        steps = []
        for event in payload.events:
            elements: tuple[tuple[str, tuple[bytes, ...]], ...] = ()
            advance = 0
            if event.HasField("element_event"):
                tag = event.element_event.tag
                encoded = tuple(
                    impls[tag].encode_nested(
                        GlobalWindows.windowed_value(
                            element_coder.decode(e.encoded_element),
                            Timestamp(micros=e.timestamp * 1000),
                        )
                    )
                    for e in event.element_event.elements
                )
                elements = ((producers[tag], encoded),)
            elif event.HasField("watermark_event"):
                producer = producers[event.watermark_event.tag]
                watermarks[producer] = max(
                    watermarks[producer], event.watermark_event.new_watermark * 1000
                )
            elif event.HasField("processing_time_event"):
                advance = event.processing_time_event.advance_duration * 1000
            steps.append(SourceStep(elements, tuple(sorted(watermarks.items())), advance))
        streams.append(tuple(steps))
    return streams
