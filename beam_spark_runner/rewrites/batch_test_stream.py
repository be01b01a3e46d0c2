"""TestStream in batch, for the TestStreams whose batch run is one of their streaming runs.

The runner executes pipelines in batch: every element is read, then the watermark jumps to
+inf. That is one of a TestStream's streaming runs when no element is late at the source
and no *observer* (``rewrites.watermark_observers``) could tell: time does not pass in a
domain it fires on between elements reaching it (nor at all behind an emitter), and a
non-default-triggered GroupByKey gets each key and window from one event only. Such a
TestStream is replaced, before translation, by an Impulse and a DoFn emitting its elements
with their timestamps. Any other TestStream is refused before Spark starts, naming the event
and transform that need streaming. Not checked: a DoFn that moves timestamps back behind a
watermark the script set before its first element.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, cast

import apache_beam as beam
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor, PTransformOverride
from apache_beam.pvalue import PBegin, PCollection, TaggedOutput
from apache_beam.testing.test_stream import (
    ElementEvent,
    ProcessingTimeEvent,
    TestStream,
    WatermarkEvent,
    WindowedValueHolder,
)
from apache_beam.transforms.window import TimestampedValue, WindowFn
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning.capabilities import TEST_STREAM_URN
from beam_spark_runner.rewrites.watermark_observers import (
    DEFAULT_GROUPING,
    TRIGGERED_GROUPING,
    Tag,
    WatermarkObserver,
    find_observers,
)

_LOGGER = logging.getLogger(__name__)

# One element of a TestStream: its output tag, its encoding with the TestStream's
# coder, and its timestamp.
_Element = tuple[str | None, bytes, Timestamp]


def _needs_time_checks(observer: WatermarkObserver) -> bool:
    # A default-triggered GroupByKey over a standard window function, reached only through
    # transforms that keep timestamps, sees no element late: time passing cannot matter.
    return not (observer.kind == DEFAULT_GROUPING and observer.transparent)


class _Panes:
    """Which event brought the elements of each (key, window) to a triggered GroupByKey."""

    def __init__(self, observer: WatermarkObserver) -> None:
        self._observer = observer
        self._first_event: int | None = None
        self._event_of: dict[tuple[Any, Any], int] = {}

    def _groups(self, values: Sequence[Any]) -> list[tuple[Any, Any]] | None:
        window_fn = self._observer.window_fn
        if not self._observer.transparent or window_fn is None or window_fn.is_merging():
            return None
        groups = []
        for value in values:
            element = value.value
            if not (isinstance(element, tuple) and len(element) == 2):
                return None
            context = WindowFn.AssignContext(Timestamp.of(value.timestamp), element=element)
            key = repr(element[0])
            groups += [(key, assigned) for assigned in window_fn.assign(context)]
        return groups

    def add(self, index: int, values: Sequence[Any]) -> str | None:
        """Records event ``index``'s elements; why a batch run would fire differently, or None."""
        if self._first_event is None:
            self._first_event = index
        groups = self._groups(values)
        if groups is None:
            if self._first_event == index:
                return None
            return (
                f"events {self._first_event} and {index} both add elements that reach "
                f"'{self._observer.label}' ({self._observer.why}), which a streaming run "
                "fires per event and a batch run once for both"
            )
        for group in groups:
            earlier = self._event_of.setdefault(group, index)
            if earlier != index:
                return (
                    f"events {earlier} and {index} both add elements of key {group[0]} in "
                    f"window {group[1]} that reach '{self._observer.label}' "
                    f"({self._observer.why}), which a streaming run fires per event and a "
                    "batch run once for both"
                )
        return None


def streaming_only_reason(
    events: Sequence[Any], observers: Sequence[WatermarkObserver]
) -> str | None:
    """Why a TestStream with these events needs streaming execution, or None.

    ``observers`` are the transforms downstream of it that could tell the difference
    (:func:`~beam_spark_runner.rewrites.watermark_observers.find_observers`).
    """
    watermarks: dict[Tag, Timestamp] = {}
    fed: set[WatermarkObserver] = set()  # observers some element has reached
    passed: dict[WatermarkObserver, str] = {}  # where time passed at an observer, once fed
    panes = {
        observer: _Panes(observer) for observer in observers if observer.kind == TRIGGERED_GROUPING
    }
    timed = [observer for observer in observers if _needs_time_checks(observer)]

    def input_watermark(observer: WatermarkObserver) -> Timestamp:
        return min(watermarks.get(tag, MIN_TIMESTAMP) for tag in observer.tags)

    def time_passes(observer: WatermarkObserver, what: str, domain: str) -> str | None:
        if observer not in fed or domain not in observer.domains:
            return None
        if domain == "processing" and "event" in observer.domains:
            # A batch run fires a key's event-time timers before its processing-time ones.
            return (
                f"{what} comes after elements reached '{observer.label}' ({observer.why}); "
                "a batch run fires event-time timers before processing-time ones"
            )
        if observer.emitted:
            return (
                f"{what} moves the time of '{observer.label}' ({observer.why}) after "
                "elements reached a GroupByKey or a DoFn with timers upstream of it, which "
                "can emit more of its input after time passed"
            )
        passed.setdefault(observer, what)
        return None

    for index, event in enumerate(events):
        if isinstance(event, ElementEvent):
            watermark = watermarks.get(event.tag, MIN_TIMESTAMP)
            for value in event.timestamped_values:
                if value.timestamp < watermark:
                    return (
                        f"event {index} adds an element at {value.timestamp}, behind its "
                        f"output's watermark {watermark} (late data)"
                    )
            if not event.timestamped_values:
                continue
            for observer in observers:
                if event.tag not in observer.tags:
                    continue
                if observer in passed:
                    return (
                        f"event {index} adds elements that reach '{observer.label}' "
                        f"({observer.why}) after {passed[observer]} passed earlier ones"
                    )
                if observer in panes:
                    reason = panes[observer].add(index, event.timestamped_values)
                    if reason is not None:
                        return reason
                fed.add(observer)
        elif isinstance(event, WatermarkEvent):
            before = {observer: input_watermark(observer) for observer in timed}
            watermarks[event.tag] = Timestamp.of(event.new_watermark)
            for observer in timed:
                after = input_watermark(observer)
                if before[observer] < after < MAX_TIMESTAMP:
                    reason = time_passes(observer, f"a watermark advance (event {index})", "event")
                    if reason is not None:
                        return reason
        elif isinstance(event, ProcessingTimeEvent):
            for observer in timed:
                reason = time_passes(
                    observer, f"a processing-time advance (event {index})", "processing"
                )
                if reason is not None:
                    return reason
        else:
            return f"event {index} is of an unknown kind ({type(event).__name__})"
    return None


def _elements(test_stream: TestStream) -> list[_Element]:
    coder = test_stream.coder
    return [
        (event.tag, coder.encode(value.value), Timestamp.of(value.timestamp))
        for event in bi.test_stream_events(test_stream)
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

    def __init__(self, pipeline: beam.Pipeline) -> None:
        self._pipeline = pipeline
        self.replaced = 0

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        transform = applied_ptransform.transform
        if not isinstance(transform, TestStream):
            return False
        endpoint = bi.test_stream_endpoint(transform)
        if endpoint:
            raise UnsupportedFeatureError(
                f"Transform '{applied_ptransform.full_label}' is a TestStream ({TEST_STREAM_URN}) "
                f"that reads its events from a service ({endpoint}); "
                "SparkStructuredRunner runs only TestStreams whose events are in the pipeline."
            )
        observers = find_observers(self._pipeline, dict(applied_ptransform.outputs))
        reason = streaming_only_reason(bi.test_stream_events(transform), observers)
        if reason is not None:
            raise UnsupportedFeatureError(
                f"Transform '{applied_ptransform.full_label}' is a TestStream ({TEST_STREAM_URN}) "
                f"whose batch run would differ from its streaming run: {reason}. "
                "SparkStructuredRunner runs a TestStream in batch only where no transform "
                "can tell when time passed between its elements. Add those elements before "
                "advancing the watermark or processing time, or run the test on DirectRunner."
            )
        return True

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> BatchTestStream:
        transform = applied_ptransform.transform
        assert isinstance(transform, TestStream)  # matches() accepted only TestStreams
        self.replaced += 1
        return BatchTestStream(transform)


class _MarkBounded(PipelineVisitor):  # type: ignore[misc]
    """Marks bounded what was unbounded only because a TestStream fed it."""

    def __init__(self) -> None:
        self.bounded: set[int] = set()  # ids of PCollections made bounded
        self.count = 0

    def enter_composite_transform(self, applied: AppliedPTransform) -> None:
        if isinstance(applied.transform, BatchTestStream):
            self._mark(applied)

    def visit_transform(self, applied: AppliedPTransform) -> None:
        transform = applied.transform
        inputs = list(applied.main_inputs.values()) + [s.pvalue for s in applied.side_inputs]
        fed = [pcoll for pcoll in inputs if isinstance(pcoll, PCollection)]
        if not any(id(pcoll) in self.bounded for pcoll in fed):
            return
        if not all(pcoll.is_bounded for pcoll in fed):
            return
        if isinstance(transform, beam.ParDo) and bi.is_unbounded_per_element(transform.fn):
            return  # unbounded of its own
        self._mark(applied)

    def _mark(self, applied: AppliedPTransform) -> None:
        for output in applied.outputs.values():
            if isinstance(output, PCollection):
                if not output.is_bounded:
                    self.count += 1
                output.is_bounded = True
                self.bounded.add(id(output))


def replace_test_streams(pipeline: beam.Pipeline) -> int:
    """Replaces the TestStreams a batch run reproduces; refuses the others (see above).

    The PCollections downstream of a replaced TestStream were built unbounded from it;
    those that nothing else makes unbounded are marked bounded again, so the run is not
    reported as reading an unbounded source. Returns how many TestStreams it replaced.
    """
    override = BatchTestStreamOverride(pipeline)
    pipeline.replace_all([override])
    marker = _MarkBounded()
    pipeline.visit(marker)
    if marker.count:
        _LOGGER.info(
            "Ran %d PCollection(s) fed by TestStreams as bounded: their TestStreams run in batch",
            marker.count,
        )
    return override.replaced
