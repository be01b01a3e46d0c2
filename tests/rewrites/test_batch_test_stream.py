"""TestStream in batch: which scripts a batch run reproduces, and the pipelines they feed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

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
from apache_beam.transforms import deduplicate, userstate, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.rewrites.batch_test_stream import (
    BatchTestStream,
    replace_test_streams,
    streaming_only_reason,
)
from beam_spark_runner.rewrites.watermark_observers import (
    DEFAULT_GROUPING,
    EMITTED,
    STATEFUL,
    THROUGH_PARDO,
    TRANSPARENT,
    TRIGGERED_GROUPING,
    WatermarkObserver,
)
from beam_spark_runner.spark import session
from tests.unbounded_side_reader import UnboundedPrimitive

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _elements(*timestamps: int, tag: str | None = None) -> ElementEvent:
    return ElementEvent([TimestampedValue(t, t) for t in timestamps], tag)


EVENT, BOTH = frozenset({"event"}), frozenset({"event", "processing"})


def _observer(
    label: str,
    kind: str,
    paths: dict[str | None, int],
    domains: frozenset[str] = EVENT,
    window_fn: window.WindowFn | None = None,
) -> WatermarkObserver:
    return WatermarkObserver(label, "why", kind, domains, paths, window_fn)


# A DoFn with event-time timers after a ParDo on the main output; one with both kinds of
# timers; one behind a GroupByKey; one on output "a"; default-triggered GroupByKeys reached
# only through WindowInto (transparent) and through a ParDo; triggered ones.
TIMERS = _observer("Timers", STATEFUL, {None: THROUGH_PARDO})
BOTH_TIMERS = _observer("BothTimers", STATEFUL, {None: THROUGH_PARDO}, BOTH)
AFTER_GBK = _observer("AfterGbk", STATEFUL, {None: EMITTED})
ON_A = _observer("OnA", STATEFUL, {"a": THROUGH_PARDO})
GROUPED = _observer("Grouped", DEFAULT_GROUPING, {None: TRANSPARENT})
GROUPED_AFTER_PARDO = _observer("GroupedAfterPardo", DEFAULT_GROUPING, {None: THROUGH_PARDO})
FIXED = window.FixedWindows(10)
TRIGGERED = _observer("Triggered", TRIGGERED_GROUPING, {None: TRANSPARENT}, window_fn=FIXED)
TRIGGERED_AFTER_PARDO = _observer(
    "TriggeredAfterPardo", TRIGGERED_GROUPING, {None: THROUGH_PARDO}, window_fn=FIXED
)


def _pairs(*timestamps: int, key: str = "k") -> ElementEvent:
    return ElementEvent([TimestampedValue((key, t), t) for t in timestamps])


@pytest.mark.parametrize(
    ("events", "observers"),
    [
        ([], [TIMERS, AFTER_GBK]),
        ([_elements(1, 2), _elements(3), WatermarkEvent(MAX_TIMESTAMP)], [TIMERS, AFTER_GBK]),
        (
            [WatermarkEvent(5), ProcessingTimeEvent(10), _elements(5, 9), WatermarkEvent(20)],
            [TIMERS, BOTH_TIMERS],
        ),
        ([_elements(1), WatermarkEvent(10), WatermarkEvent(20)], [TIMERS]),
        ([WatermarkEvent(50, "a"), _elements(1, tag="b"), _elements(50, tag="a")], [ON_A]),
        ([WatermarkEvent(5), ElementEvent([]), WatermarkEvent(6), _elements(7)], [TIMERS]),
        # Time passes between elements, but nothing downstream can tell: the elements are
        # not late where they are grouped.
        ([_elements(1), WatermarkEvent(10), _elements(12)], [GROUPED]),
        # Processing time passes, but the observer fires on event time only.
        ([_elements(1), ProcessingTimeEvent(10), _elements(2)], [TIMERS, GROUPED_AFTER_PARDO]),
        # ... or time passes where the observer does not look.
        ([_elements(1, tag="b"), WatermarkEvent(9, "b"), _elements(12, tag="b")], [ON_A]),
        ([_elements(1, tag="a"), WatermarkEvent(9, "b"), _elements(12, tag="a")], [ON_A]),
        # Output "a" moves, but the observer's input watermark (the minimum with the
        # main output's) stays at -inf.
        (
            [_elements(1, tag="a"), WatermarkEvent(9, "a"), _elements(12, tag="a")],
            [_observer("Both", STATEFUL, {"a": THROUGH_PARDO, None: EMITTED})],
        ),
        # Everything arrives before the GroupByKey upstream of the observer can emit.
        ([WatermarkEvent(3), _elements(4, 5), WatermarkEvent(MAX_TIMESTAMP)], [AFTER_GBK]),
        # A triggered GroupByKey gets each key and window from one event only.
        ([_pairs(1, 2), _pairs(12), _pairs(3, key="j")], [TRIGGERED]),
        ([_pairs(1, 2), WatermarkEvent(MAX_TIMESTAMP)], [TRIGGERED_AFTER_PARDO, GROUPED]),
    ],
)
def test_scripts_no_observer_can_tell_from_a_batch_run_run_in_batch(
    events: list, observers: list[WatermarkObserver]
) -> None:
    assert streaming_only_reason(events, observers) is None


@pytest.mark.parametrize(
    ("events", "observers", "expected"),
    [
        (
            [_elements(1), WatermarkEvent(10), _elements(12)],
            [TIMERS],
            "event 2 adds elements that reach 'Timers' (why) after a "
            "watermark advance (event 1) passed earlier ones",
        ),
        # A ParDo before a GroupByKey may move timestamps back behind the watermark.
        (
            [_elements(1), WatermarkEvent(10), _elements(12)],
            [GROUPED_AFTER_PARDO],
            "reach 'GroupedAfterPardo' (why) after a watermark advance (event 1)",
        ),
        ([WatermarkEvent(10), _elements(12, 3)], [], "at Timestamp(3), behind its output's"),
        (
            [_elements(1, tag="a"), WatermarkEvent(9, "a"), _elements(12, tag="a")],
            [ON_A],
            "reach 'OnA'",
        ),
        # The GroupByKey upstream fires at the advance and again at +inf: the observer's
        # timers would fire between its two inputs.
        (
            [_elements(1), WatermarkEvent(10), WatermarkEvent(MAX_TIMESTAMP)],
            [AFTER_GBK],
            "a watermark advance (event 1) moves the time of 'AfterGbk'",
        ),
        # Event-time and processing-time timers would fire interleaved as scripted; a
        # batch run fires the event-time ones first.
        (
            [_elements(1), WatermarkEvent(10), ProcessingTimeEvent(10)],
            [BOTH_TIMERS],
            "a processing-time advance (event 2) comes after elements reached 'BothTimers'",
        ),
        # A data-driven trigger fires per event in streaming, once in batch.
        (
            [_pairs(1), _pairs(12), _pairs(2)],
            [TRIGGERED],
            "events 0 and 2 both add elements of key 'k' in window [0.0, 10.0) that reach "
            "'Triggered'",
        ),
        (
            [_pairs(1), _pairs(12)],
            [TRIGGERED_AFTER_PARDO],
            "events 0 and 1 both add elements that reach 'TriggeredAfterPardo'",
        ),
    ],
)
def test_scripts_where_an_observer_could_tell_need_streaming(
    events: list, observers: list[WatermarkObserver], expected: str
) -> None:
    reason = streaming_only_reason(events, observers)
    assert reason is not None and expected in reason


class BufferUntilTimer(beam.DoFn):  # type: ignore[misc]
    """Buffers a key's values; emits them sorted when an event-time timer 5 s later fires."""

    BUFFER = userstate.BagStateSpec("buffer", coders.VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        element: tuple[str, int],
        timestamp: Timestamp = beam.DoFn.TimestampParam,
        buffer: userstate.BagRuntimeState = beam.DoFn.StateParam(BUFFER),
        flush: userstate.RuntimeTimer = beam.DoFn.TimerParam(FLUSH),
    ) -> None:
        buffer.add(element[1])
        flush.set(timestamp + 5)

    @userstate.on_timer(FLUSH)
    def on_flush(
        self, buffer: userstate.BagRuntimeState = beam.DoFn.StateParam(BUFFER)
    ) -> Iterator[list[int]]:
        yield sorted(buffer.read())
        buffer.clear()


def _run_on(runner_args: list[str], build: Callable[[beam.Pipeline], None]) -> None:
    with beam.Pipeline(options=PipelineOptions(runner_args)) as p:
        build(p)


DIRECT_STREAMING = ["--runner=DirectRunner", "--streaming"]


def _windows_and_values(stream: ScriptedStream, windowing: beam.WindowInto):
    def build(p: beam.Pipeline) -> beam.PCollection:
        return (
            p
            | stream
            | windowing
            | beam.GroupByKey()
            | beam.Map(lambda kv, w=beam.DoFn.WindowParam: (kv[0], float(w.start), sorted(kv[1])))
        )

    return build


# Built anew for each pipeline: a transform applied once belongs to that pipeline.
ACCEPTED_SCRIPTS: dict[str, Callable[[], tuple[ScriptedStream, beam.WindowInto, list]]] = {
    "fixed windows, default trigger": lambda: (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 1), TimestampedValue(("k", 3), 3)])
        .advance_watermark_to(10)
        .add_elements([TimestampedValue(("k", 12), 12), TimestampedValue(("j", 14), 14)])
        .advance_watermark_to(25)
        .add_elements([TimestampedValue(("k", 27), 27), TimestampedValue(("k", 29), 29)])
        .advance_watermark_to_infinity(),
        beam.WindowInto(window.FixedWindows(10)),
        [("k", 0.0, [1, 3]), ("k", 10.0, [12]), ("j", 10.0, [14]), ("k", 20.0, [27, 29])],
    ),
    "sessions, default trigger": lambda: (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 1), TimestampedValue(("k", 4), 4)])
        .advance_watermark_to(12)
        .add_elements([TimestampedValue(("k", 12), 12), TimestampedValue(("k", 15), 15)])
        .advance_watermark_to_infinity(),
        beam.WindowInto(window.Sessions(5)),
        [("k", 1.0, [1, 4]), ("k", 12.0, [12, 15])],
    ),
}


@pytest.mark.spark
@pytest.mark.parametrize("name", sorted(ACCEPTED_SCRIPTS))
@pytest.mark.parametrize(
    "runner_args",
    [DIRECT_STREAMING, pytest.param(SPARK_ARGS, marks=pytest.mark.slow)],
    ids=["direct", "spark"],
)
def test_time_passing_between_elements_where_no_observer_sees_it(
    name: str, runner_args: list[str]
) -> None:
    # The same script, pipeline and expected panes on DirectRunner in streaming (the
    # reference for what a TestStream means) and on this runner in batch.
    stream, windowing, expected = ACCEPTED_SCRIPTS[name]()
    build = _windows_and_values(stream, windowing)
    _run_on(runner_args, lambda p: assert_that(build(p), equal_to(expected)))


def _timer_script() -> ScriptedStream:
    return (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 0)])
        .advance_watermark_to(10)
        .add_elements([TimestampedValue(("k", 2), 12)])
        .advance_watermark_to(100)
        .advance_watermark_to_infinity()
    )


def test_a_refused_script_really_differs_between_streaming_and_batch() -> None:
    # Why the runner refuses _timer_script: in streaming the timer set by the first element
    # fires at the advance, before the second arrives; a batch run (the replacement this
    # runner would use, here on FnApiRunner) buffers both first.
    _run_on(
        DIRECT_STREAMING,
        lambda p: assert_that(
            p | _timer_script() | beam.ParDo(BufferUntilTimer()), equal_to([[1], [2]])
        ),
    )
    _run_on(
        ["--runner=DirectRunner"],
        lambda p: assert_that(
            p | BatchTestStream(_timer_script()) | beam.ParDo(BufferUntilTimer()),
            equal_to([[1, 2]]),
        ),
    )


@pytest.mark.spark
@pytest.mark.slow
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


@pytest.mark.spark
@pytest.mark.slow
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


def test_a_streaming_only_pipeline_the_streaming_path_refuses_is_refused_before_spark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_session(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started for a pipeline that must be refused")

    monkeypatch.setattr(session, "obtain_session", no_session)
    monkeypatch.setattr("beam_spark_runner.run.lifecycle.obtain_session", no_session)
    stream = (
        ScriptedStream()
        .add_elements([("k", 1)])
        .advance_watermark_to(10)
        .add_elements([TimestampedValue(("k", 2), 12)])
    )
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    keyed = p | "Script" >> stream | beam.Map(lambda kv: kv).with_output_types(tuple[str, int])
    # An unbounded source of its own that is no splittable DoFn.
    _ = p | beam.Create([1]) | "Unbounded" >> UnboundedPrimitive()
    _ = keyed | "Buffer" >> beam.ParDo(BufferUntilTimer())
    with pytest.raises(UnsupportedFeatureError) as error:
        p.run()
    message = str(error.value)
    # Why streaming refuses it (an unbounded source it cannot read, or a PySpark older than
    # streaming needs), and why a batch run would differ (the source is unbounded of its
    # own, not through a TestStream).
    assert "Nor is a batch run proven to give its streaming result" in message
    assert "'Script'" in message and "beam:transform:teststream:v1" in message
    assert "Transform 'Unbounded' outputs an unbounded PCollection and is not a TestStream" in (
        message
    )


def test_what_a_replaced_test_stream_fed_is_bounded_again() -> None:
    p = beam.Pipeline()
    tagged = p | "Script" >> ScriptedStream().add_elements([1], tag="a").add_elements([2], tag="b")
    fed = (tagged["a"], tagged["b"]) | beam.Flatten() | "Fed" >> beam.Map(lambda x: x)
    ticks = p | PeriodicImpulse(0, 10, 1) | "Ticks" >> beam.Map(lambda x: x)
    assert not fed.is_bounded and not ticks.is_bounded
    replace_test_streams(p)
    assert fed.is_bounded
    # Unbounded of its own (a splittable DoFn), not because of a TestStream.
    assert not ticks.is_bounded
