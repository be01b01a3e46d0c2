"""TestStream in batch, for the TestStreams whose batch run is one of their streaming runs.

A TestStream scripts a stream: elements arrive, the watermark advances, processing time
advances. The runner executes pipelines in batch: every element is read, then the
watermark jumps to +inf. That is one of the runs a streaming runner may make of a
TestStream exactly when no time passes between its elements:

* every element arrives before any watermark or processing-time advance that follows an
  element (so no timer, trigger or window can fire between two elements, and nothing is
  late), and
* no element is behind its output's watermark when it arrives (a watermark advance before
  the first element only moves the point elements may not fall behind).

How a streaming runner bundles elements that arrive together is up to the runner, so
reading them all at once is legal. Such a TestStream is replaced, before translation, by
an Impulse and a DoFn that emits its elements with their timestamps on their outputs.
Any other TestStream needs streaming execution and is refused before Spark starts,
naming the event that needs it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import apache_beam as beam
from apache_beam.pipeline import AppliedPTransform, PTransformOverride
from apache_beam.pvalue import PBegin, PCollection, TaggedOutput
from apache_beam.testing.test_stream import (
    ElementEvent,
    ProcessingTimeEvent,
    TestStream,
    WatermarkEvent,
    WindowedValueHolder,
)
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

from beam_spark_runner.capabilities import TEST_STREAM_URN
from beam_spark_runner.errors import UnsupportedFeatureError

# One element of a TestStream: its output tag, its encoding with the TestStream's
# coder, and its timestamp.
_Element = tuple[str | None, bytes, Timestamp]


def streaming_only_reason(events: Sequence[Any]) -> str | None:
    """Why a TestStream with these events needs streaming execution, or None."""
    watermarks: dict[str | None, Timestamp] = {}
    time_passed_after_elements: str | None = None
    seen_elements = False
    for index, event in enumerate(events):
        if isinstance(event, ElementEvent):
            if time_passed_after_elements is not None:
                return (
                    f"event {index} adds elements after {time_passed_after_elements} had "
                    "passed earlier elements, so triggers, timers and windows could fire "
                    "between them"
                )
            watermark = watermarks.get(event.tag, MIN_TIMESTAMP)
            for value in event.timestamped_values:
                if value.timestamp < watermark:
                    return (
                        f"event {index} adds an element at {value.timestamp}, behind its "
                        f"output's watermark {watermark} (late data)"
                    )
            seen_elements = seen_elements or bool(event.timestamped_values)
        elif isinstance(event, WatermarkEvent):
            watermarks[event.tag] = Timestamp.of(event.new_watermark)
            if seen_elements and time_passed_after_elements is None:
                time_passed_after_elements = f"a watermark advance (event {index})"
        elif isinstance(event, ProcessingTimeEvent):
            if seen_elements and time_passed_after_elements is None:
                time_passed_after_elements = f"a processing-time advance (event {index})"
        else:
            return f"event {index} is of an unknown kind ({type(event).__name__})"
    return None


def _elements(test_stream: TestStream) -> list[_Element]:
    coder = test_stream.coder
    return [
        (event.tag, coder.encode(value.value), Timestamp.of(value.timestamp))
        for event in test_stream._events  # noqa: SLF001 - TestStream keeps its script here
        if isinstance(event, ElementEvent)
        for value in event.timestamped_values
    ]


class _EmitElements(beam.DoFn):  # type: ignore[misc]
    """Emits a TestStream's elements, with their timestamps, on their outputs."""

    def __init__(self, coder: beam.coders.Coder, elements: list[_Element]) -> None:
        self._coder = coder
        self._elements = elements

    def process(self, unused_impulse: bytes) -> Iterator[Any]:
        for tag, encoded, timestamp in self._elements:
            value = self._coder.decode(encoded)
            if isinstance(value, WindowedValueHolder):
                # TestStreams recorded by interactive Beam carry whole windowed values.
                output: Any = cast(Any, value).windowed_value
            else:
                output = TimestampedValue(value, timestamp)
            yield output if tag is None else TaggedOutput(tag, output)


class BatchTestStream(beam.PTransform):  # type: ignore[misc]
    """What a batch-runnable TestStream becomes: Impulse, then a DoFn emitting its elements."""

    def __init__(self, test_stream: TestStream) -> None:
        super().__init__(label=test_stream.label)
        self._test_stream = test_stream

    def expand(self, pbegin: PBegin) -> PCollection | dict[str | None, PCollection]:
        stream = self._test_stream
        tags = set(stream.output_tags) or {None}
        emitted = (
            pbegin
            | "Impulse" >> beam.Impulse()
            | "Emit"
            >> beam.ParDo(_EmitElements(stream.coder, _elements(stream))).with_outputs(
                *sorted(tag for tag in tags if tag is not None), main=None
            )
        )
        if tags == {None}:
            return emitted[None]
        return {tag: emitted[tag] for tag in tags}


class BatchTestStreamOverride(PTransformOverride):  # type: ignore[misc]
    """Replaces each TestStream by :class:`BatchTestStream`, or refuses it with the reason."""

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        transform = applied_ptransform.transform
        if not isinstance(transform, TestStream):
            return False
        if transform._endpoint:  # noqa: SLF001
            raise UnsupportedFeatureError(
                f"Transform '{applied_ptransform.full_label}' is a TestStream ({TEST_STREAM_URN}) "
                f"that reads its events from a service ({transform._endpoint}); "  # noqa: SLF001
                "SparkStructuredRunner runs only TestStreams whose events are in the pipeline."
            )
        reason = streaming_only_reason(transform._events)  # noqa: SLF001
        if reason is not None:
            raise UnsupportedFeatureError(
                f"Transform '{applied_ptransform.full_label}' is a TestStream ({TEST_STREAM_URN}) "
                f"that needs streaming execution: {reason}. SparkStructuredRunner runs a "
                "TestStream in batch only when all its elements arrive before time passes "
                "them; streaming execution is not supported yet. Add all elements before "
                "advancing the watermark or processing time, or run the test on DirectRunner."
            )
        return True

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> BatchTestStream:
        transform = applied_ptransform.transform
        assert isinstance(transform, TestStream)  # matches() accepted only TestStreams
        return BatchTestStream(transform)
