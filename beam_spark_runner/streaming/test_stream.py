"""A TestStream's events as the steps of the streaming query's source (driver side).

Each event is one micro-batch, as DirectRunner takes each event to quiescence before the
next: an element event's elements (encoded here with their output's data-channel coder, in
the global window at their timestamps), a watermark event's new watermark for its output,
a processing-time event's advance of the runner's clock. After the last event every
output's watermark is +inf, as Beam's TestStream ends. A TestStream whose events come from
a service (``TestStream(endpoint=...)``) has them read here, on the driver, before the
query starts (:func:`inline_service_events`): the service must end its event stream.

Elements that carry their own windows (``WindowedValueHolder``, as interactive Beam records
them) keep their timestamp, windows and pane, as DirectRunner emits them; their output and
the PCollections downstream in the same windowing carry the windows in a window coder that
can hold them (:func:`carry_held_windows`).
"""

from __future__ import annotations

import logging
from typing import Any, cast

from apache_beam.testing.test_stream import WindowedValueHolder
from apache_beam.transforms.window import GlobalWindow, GlobalWindows, IntervalWindow
from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import SparkRunnerError, UnsupportedFeatureError
from beam_spark_runner.planning import TEST_STREAM_BUFFER_KIND, TEST_STREAM_URN, Plan
from beam_spark_runner.streaming.source_plan import SourceStep
from beam_spark_runner.streaming.watermarks import MIN_MICROS

_LOGGER = logging.getLogger(__name__)

_INTERVAL_WINDOW_CODER_URN: str = bi.common_urns.coders.INTERVAL_WINDOW.urn
_WINDOW_INTO_URN: str = bi.common_urns.primitives.ASSIGN_WINDOWS.urn
_FLATTEN_URN: str = bi.common_urns.primitives.FLATTEN.urn

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


def carry_held_windows(
    proto: bi.beam_runner_api_pb2.Pipeline,
) -> bi.beam_runner_api_pb2.Pipeline:
    """``proto`` with a window coder for the windows TestStream elements hold.

    A TestStream's output is in the global windowing, whose coder writes no window, so
    elements held in ``IntervalWindow`` s travel in a copy of that windowing with Beam's
    interval-window coder: the TestStream's outputs, and every PCollection reached from
    them through transforms that keep their windowing (up to a ``WindowInto``). Elements
    held in the global window need nothing; other window types are refused. A proto with
    no such element is returned as it is.
    """
    components = proto.components
    held = {
        pcoll: transform.unique_name
        for transform in components.transforms.values()
        if transform.spec.urn == TEST_STREAM_URN
        for tag, pcoll in transform.outputs.items()
        if _holds_interval_windows(transform, tag, components)
    }
    if not held:
        return proto
    proto = bi.beam_runner_api_pb2.Pipeline.FromString(proto.SerializeToString())
    components = proto.components
    coder_id = bi.unique_name(components.coders, "interval_window")
    components.coders[coder_id].spec.urn = _INTERVAL_WINDOW_CODER_URN
    carried: dict[str, str] = {}  # original windowing strategy id -> its carrying copy
    reached = list(held)
    seen = set(reached)
    while reached:
        pcoll = components.pcollections[reached.pop()]
        original = pcoll.windowing_strategy_id
        if original not in carried:
            carried[original] = bi.unique_name(
                components.windowing_strategies, f"{original}_held_windows"
            )
            strategy = components.windowing_strategies[carried[original]]
            strategy.CopyFrom(components.windowing_strategies[original])
            strategy.window_coder_id = coder_id
        pcoll.windowing_strategy_id = carried[original]
        for transform in components.transforms.values():
            if transform.subtransforms or transform.spec.urn == _WINDOW_INTO_URN:
                continue
            if not any(pcoll_id in seen for pcoll_id in transform.inputs.values()):
                continue
            for output in transform.outputs.values():
                if (
                    output not in seen
                    and components.pcollections[output].windowing_strategy_id == original
                ):
                    seen.add(output)
                    reached.append(output)
    for transform in components.transforms.values():
        if transform.spec.urn == _FLATTEN_URN and not set(transform.outputs.values()) - seen:
            others = sorted(set(transform.inputs.values()) - seen)
            if others:
                raise UnsupportedFeatureError(
                    f"Flatten '{transform.unique_name}' merges the output of TestStream "
                    f"{', '.join(sorted(set(held.values())))}, whose elements carry their own "
                    f"IntervalWindows (WindowedValueHolder), with PCollections {others} in the "
                    "global window; SparkStructuredRunner's streaming runs cannot carry both "
                    "kinds of window in one PCollection. Window the TestStream's output with "
                    "beam.WindowInto before the Flatten, or hold those elements too."
                )
    _LOGGER.info(
        "TestStream %s: elements carry their own interval windows, kept by %d PCollections",
        ", ".join(sorted(set(held.values()))),
        len(seen),
    )
    return proto


def _holds_interval_windows(
    transform: bi.beam_runner_api_pb2.PTransform,
    tag: str,
    components: bi.beam_runner_api_pb2.Components,
) -> bool:
    """Whether output ``tag`` gets elements held in interval windows; refuses other kinds."""
    payload = bi.beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload)
    coder = bi.PipelineContext(components).coders[payload.coder_id]
    kinds = {
        type(window)
        for event in payload.events
        if event.HasField("element_event") and event.element_event.tag == tag
        for element in event.element_event.elements
        for window in _windowed_value(coder.decode(element.encoded_element), 0).windows
    }
    if kinds - {IntervalWindow, GlobalWindow} or kinds == {IntervalWindow, GlobalWindow}:
        names = ", ".join(sorted(kind.__name__ for kind in kinds))
        raise UnsupportedFeatureError(
            f"Transform '{transform.unique_name}' is a TestStream ({TEST_STREAM_URN}) whose "
            f"elements on output '{tag}' carry their own windows (WindowedValueHolder) of "
            f"types {names}; SparkStructuredRunner's streaming runs carry held windows that "
            "are all IntervalWindows or all the GlobalWindow. Hold elements in one of those, "
            "or give them timestamps and window them with beam.WindowInto downstream."
        )
    return kinds == {IntervalWindow}


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
                        _windowed_value(element_coder.decode(e.encoded_element), e.timestamp)
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


def _windowed_value(value: object, timestamp_millis: int) -> bi.WindowedValue:
    """An element as DirectRunner emits it: in its own windows, else the global window."""
    if isinstance(value, WindowedValueHolder):
        return cast(bi.WindowedValue, cast(Any, value).windowed_value)
    return GlobalWindows.windowed_value(value, Timestamp(micros=timestamp_millis * 1000))
