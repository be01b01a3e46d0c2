"""Which transforms downstream of a TestStream could tell a batch run from a streaming one."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms import trigger, userstate, window

from beam_spark_runner.rewrites.watermark_observers import (
    DEFAULT_GROUPING,
    EMITTED,
    STATEFUL,
    THROUGH_PARDO,
    TRANSPARENT,
    TRIGGERED_GROUPING,
    WatermarkObserver,
    find_observers,
)
from tests.rewrites.test_batch_test_stream import BufferUntilTimer


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


def test_groupings_by_trigger_window_and_path() -> None:
    p = beam.Pipeline()
    keyed = _keyed_stream(p)
    for name, windowing in [
        ("Fixed", beam.WindowInto(window.FixedWindows(10))),
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
    sliding = keyed | beam.WindowInto(window.SlidingWindows(10, 5))
    _ = sliding | beam.Map(lambda kv: kv) | "AfterMap" >> beam.GroupByKey()
    _ = (
        keyed
        | "Early"
        >> beam.WindowInto(
            window.FixedWindows(5),
            trigger=trigger.AfterWatermark(early=trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        | "Sum" >> beam.CombinePerKey(sum)
    )
    # Nothing is ever late in the global window, and Beam's Reshuffle keeps timestamps.
    _ = keyed | "Global" >> beam.WindowInto(window.GlobalWindows()) | beam.Reshuffle()
    observers = _observers(p)
    assert set(observers) == {
        "FixedGroup",
        "SessionsGroup",
        "OnTimeGroup",
        "AfterMap",
        "Sum/GroupByKey",
    }
    for label in ("FixedGroup", "SessionsGroup", "OnTimeGroup"):
        assert observers[label].kind == DEFAULT_GROUPING
        assert observers[label].paths == {None: TRANSPARENT} and observers[label].transparent
    assert observers["AfterMap"].kind == DEFAULT_GROUPING
    assert observers["AfterMap"].paths == {None: THROUGH_PARDO}
    summed = observers["Sum/GroupByKey"]
    assert summed.kind == TRIGGERED_GROUPING and summed.transparent
    assert isinstance(summed.window_fn, window.FixedWindows)
    assert "AfterCount" in summed.why and summed.domains == {"event"}


def test_timers_behind_a_grouping_are_reached_through_an_emitter() -> None:
    p = beam.Pipeline()
    grouped = _keyed_stream(p) | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
    _ = (
        grouped
        | "Flatten values" >> beam.FlatMap(lambda kv: [(kv[0], v) for v in kv[1]])
        | "Buffer" >> beam.ParDo(BufferUntilTimer())
    )
    observers = _observers(p)
    assert set(observers) == {"Buffer", "GroupByKey"}
    assert observers["Buffer"].kind == STATEFUL
    assert observers["Buffer"].paths == {None: EMITTED} and observers["Buffer"].emitted
    assert observers["Buffer"].domains == {"event"}
    assert "event-time timers" in observers["Buffer"].why


def test_reshuffle_is_transparent_and_custom_windows_are_triggered_groupings() -> None:
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
    assert observers["Buffer"].paths == {"a": TRANSPARENT}
    assert observers["Group"].kind == TRIGGERED_GROUPING
    assert observers["Group"].tags == {"b"} and "Unit" in observers["Group"].why


def test_side_inputs_reach_an_observer() -> None:
    p = beam.Pipeline()
    outputs = p | "Stream" >> ScriptedStream().add_elements([("k", 1)], tag="main").add_elements(
        [3], tag="side"
    )
    _ = outputs["main"] | "Buffer" >> beam.ParDo(
        BufferUntilTimer(), beam.pvalue.AsList(outputs["side"])
    )
    assert _observers(p)["Buffer"].tags == {"main", "side"}


class _ProcessingTimeFlush(beam.DoFn):  # type: ignore[misc]
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.REAL_TIME)

    def process(
        self, element: tuple[str, int], flush: userstate.RuntimeTimer = beam.DoFn.TimerParam(FLUSH)
    ) -> None:
        flush.set(0)

    @userstate.on_timer(FLUSH)
    def on_flush(self) -> list[str]:
        return ["flushed"]


class _CountPerKey(beam.DoFn):  # type: ignore[misc]
    COUNT = userstate.CombiningValueStateSpec("count", sum)

    def process(
        self,
        element: tuple[str, int],
        count: userstate.AccumulatingRuntimeState = beam.DoFn.StateParam(COUNT),
    ) -> None:
        count.add(1)


def test_stateful_dofns_and_time_domains() -> None:
    p = beam.Pipeline()
    keyed = _keyed_stream(p)
    _ = keyed | "Pt" >> beam.ParDo(_ProcessingTimeFlush())
    _ = keyed | "Count" >> beam.ParDo(_CountPerKey())
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
    # Every stateful DoFn watches event time: its state expires with its windows.
    assert observers["Pt"].domains == {"event", "processing"}
    assert "processing-time timers" in observers["Pt"].why
    assert observers["Count"].kind == STATEFUL and observers["Count"].domains == {"event"}
    assert not observers["Count"].emitted
    assert observers["Group"].domains == {"event", "processing"}
