"""Which transforms downstream of a TestStream can tell when its watermark advanced."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms import trigger, userstate, window

from beam_spark_runner.watermark_observers import WatermarkObserver, find_observers
from tests.test_batch_test_stream import BufferUntilTimer


class _Find(PipelineVisitor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.stream: AppliedPTransform | None = None

    def visit_transform(self, applied: AppliedPTransform) -> None:
        if isinstance(applied.transform, ScriptedStream):
            self.stream = applied


def _observers(p: beam.Pipeline) -> dict[str, WatermarkObserver]:
    finder = _Find()
    p.visit(finder)
    assert finder.stream is not None
    found = find_observers(p, dict(finder.stream.outputs))
    return {observer.label: observer for observer in found}


def _keyed_stream(p: beam.Pipeline) -> beam.PCollection:
    return p | "Stream" >> ScriptedStream().add_elements([("k", 1)])


def test_default_triggered_grouping_over_standard_windows_observes_nothing() -> None:
    p = beam.Pipeline()
    keyed = _keyed_stream(p)
    for name, windowing in [
        ("Fixed", beam.WindowInto(window.FixedWindows(10))),
        ("Sliding", beam.WindowInto(window.SlidingWindows(10, 5))),
        ("Sessions", beam.WindowInto(window.Sessions(5))),
        (
            "OnTime",
            beam.WindowInto(
                window.FixedWindows(10),
                trigger=trigger.AfterWatermark(),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
            ),
        ),
    ]:
        _ = keyed | f"{name}Window" >> windowing | f"{name}Group" >> beam.GroupByKey()
    _ = keyed | beam.Reshuffle() | beam.Map(lambda kv: kv)
    assert _observers(p) == {}


def test_early_firing_combine_observes_its_input_directly() -> None:
    p = beam.Pipeline()
    _ = (
        _keyed_stream(p)
        | beam.WindowInto(
            window.FixedWindows(5),
            trigger=trigger.AfterWatermark(early=trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        | "Sum" >> beam.CombinePerKey(sum)
    )
    (observer,) = _observers(p).values()
    assert observer.label.startswith("Sum/")
    assert observer.direct_tags == {None} and observer.emitted_tags == frozenset()
    assert "AfterCount" in observer.why and observer.domains == {"event"}


def test_timers_behind_a_grouping_observe_through_an_emitter() -> None:
    p = beam.Pipeline()
    grouped = _keyed_stream(p) | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
    _ = (
        grouped
        | "Flatten values" >> beam.FlatMap(lambda kv: [(kv[0], v) for v in kv[1]])
        | "Buffer" >> beam.ParDo(BufferUntilTimer())
    )
    observers = _observers(p)
    assert set(observers) == {"Buffer"}
    assert observers["Buffer"].direct_tags == frozenset()
    assert observers["Buffer"].emitted_tags == {None}
    assert observers["Buffer"].domains == {"event"}
    assert "event-time timers" in observers["Buffer"].why


def test_timers_behind_a_reshuffle_observe_directly_and_custom_windows_observe() -> None:
    p = beam.Pipeline()
    outputs = p | "Stream" >> ScriptedStream().add_elements([("k", 1)], tag="a").add_elements(
        [("k", 2)], tag="b"
    )
    _ = outputs["a"] | beam.Reshuffle() | "Buffer" >> beam.ParDo(BufferUntilTimer())

    class Unit(window.NonMergingWindowFn):  # type: ignore[misc]
        def assign(self, context: window.WindowFn.AssignContext) -> list[window.IntervalWindow]:
            return [window.IntervalWindow(0, 1)]

        def get_window_coder(self) -> beam.coders.Coder:
            return beam.coders.coders.IntervalWindowCoder()

    _ = outputs["b"] | beam.WindowInto(Unit()) | "Group" >> beam.GroupByKey()
    observers = _observers(p)
    assert set(observers) == {"Buffer", "Group"}
    assert observers["Buffer"].direct_tags == {"a"} and not observers["Buffer"].emitted_tags
    assert observers["Group"].tags == {"b"} and "Unit" in observers["Group"].why


def test_side_inputs_reach_an_observer() -> None:
    p = beam.Pipeline()
    outputs = p | "Stream" >> ScriptedStream().add_elements([("k", 1)], tag="main").add_elements(
        [3], tag="side"
    )
    _ = outputs["main"] | "Buffer" >> beam.ParDo(
        BufferUntilTimer(), beam.pvalue.AsList(outputs["side"])
    )
    assert _observers(p)["Buffer"].direct_tags == {"main", "side"}


class _ProcessingTimeFlush(beam.DoFn):  # type: ignore[misc]
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.REAL_TIME)

    def process(
        self, element: tuple[str, int], flush: userstate.RuntimeTimer = beam.DoFn.TimerParam(FLUSH)
    ) -> None:
        flush.set(0)

    @userstate.on_timer(FLUSH)
    def on_flush(self) -> list[str]:
        return ["flushed"]


def test_time_domains_of_timers_and_triggers() -> None:
    p = beam.Pipeline()
    keyed = _keyed_stream(p)
    _ = keyed | "Pt" >> beam.ParDo(_ProcessingTimeFlush())
    _ = (
        keyed
        | beam.WindowInto(
            window.FixedWindows(5),
            trigger=trigger.AfterWatermark(early=trigger.AfterProcessingTime(10)),
            accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
        )
        | "Group" >> beam.GroupByKey()
    )
    observers = _observers(p)
    assert observers["Pt"].domains == {"processing"}
    assert "processing-time timers" in observers["Pt"].why
    assert observers["Group"].domains == {"event", "processing"}
