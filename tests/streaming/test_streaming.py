"""Streaming runs on Spark against DirectRunner's streaming runs of the same pipelines.

Each pipeline reads a TestStream; DirectRunner runs it first (in this process, collecting
its output), then this runner must give the same panes: values, windows, timestamps (at
the millisecond precision of Beam's coders) and pane infos. A micro-batch costs about a
second, so these are few and small.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import combiners, trigger, userstate, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.windowed_value import PaneInfoTiming

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from tests import slowly_updating
from tests.conftest import SPARK_TEST_MASTER

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip(
        "streaming runs need PySpark 3.5+; this is older",
        allow_module_level=True,
    )


_COLLECTED: list[Any] = []
_LOCK = threading.Lock()


class _Describe(beam.DoFn):  # type: ignore[misc]
    """A pane as comparable plain data."""

    def process(
        self,
        kv: Any,
        w: Any = beam.DoFn.WindowParam,
        t: Any = beam.DoFn.TimestampParam,
        pane: Any = beam.DoFn.PaneInfoParam,
    ) -> Any:
        key, values = kv
        bounds = (float(w.start), float(w.end)) if hasattr(w, "start") else "global"
        yield (
            key,
            sorted(values) if isinstance(values, list | tuple) else values,
            bounds,
            t.micros // 1000,
            (pane.is_first, pane.is_last, pane.timing, pane.index),
        )


def _collect(element: Any) -> None:
    with _LOCK:
        _COLLECTED.append(element)


def _direct_output(build: Callable[[beam.Pipeline], Any]) -> list[Any]:
    options = PipelineOptions(["--runner=DirectRunner"])
    options.view_as(StandardOptions).streaming = True
    _COLLECTED.clear()
    with beam.Pipeline(options=options) as pipeline:
        _ = build(pipeline) | beam.ParDo(_Describe()) | beam.Map(_collect)
    return list(_COLLECTED)


def _spark_run(build: Callable[[beam.Pipeline], Any], expected: list[Any]) -> Any:
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    assert_that(build(pipeline) | beam.ParDo(_Describe()), equal_to(expected))
    result = pipeline.run()
    assert result.wait_until_finish() == PipelineState.DONE
    return result


def _late_data(pipeline: beam.Pipeline) -> Any:
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 1), TimestampedValue(("k", 2), 2)])
        .advance_watermark_to(12)
        # Behind the watermark but within the allowed lateness: a late pane.
        .add_elements([TimestampedValue(("k", 3), 3)])
        .advance_watermark_to(20)
        # Past the window's end plus the allowed lateness: dropped.
        .add_elements([TimestampedValue(("k", 4), 4), TimestampedValue(("k", 5), 25)])
        .advance_watermark_to_infinity()
    )
    return (
        pipeline
        | stream
        | beam.WindowInto(window.FixedWindows(10), allowed_lateness=5)
        | beam.GroupByKey()
    )


def _sessions(pipeline: beam.Pipeline) -> Any:
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 1)])
        .advance_watermark_to(3)
        # Merges with the first session, which the watermark has not closed.
        .add_elements([TimestampedValue(("k", 2), 4)])
        .advance_watermark_to_infinity()
    )
    return pipeline | stream | beam.WindowInto(window.Sessions(5)) | beam.GroupByKey()


def _processing_time(pipeline: beam.Pipeline) -> Any:
    stream = (
        ScriptedStream()
        .add_elements([("k", 1), ("k", 2)])
        # No element in this micro-batch: the trigger fires on processing time alone.
        .advance_processing_time(6)
        .add_elements([("k", 3)])
        .advance_processing_time(6)
        .advance_watermark_to_infinity()
    )
    return _grouped_in_global_window(pipeline, stream, trigger.AfterProcessingTime(5))


def _after_count(pipeline: beam.Pipeline) -> Any:
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(kv, 1) for kv in [("a", 1), ("b", 2), ("a", 3)]])
        .advance_watermark_to(2)
        .add_elements([TimestampedValue(kv, 3) for kv in [("b", 4), ("a", 5)]])
        .advance_watermark_to(4)
        .add_elements([TimestampedValue(kv, 5) for kv in [("a", 6), ("a", 7), ("b", 8)]])
        .advance_watermark_to_infinity()
    )
    grouped = _grouped_in_global_window(pipeline, stream, trigger.AfterCount(2))
    return grouped | beam.MapTuple(lambda key, values: (key, sorted(values)))


def _grouped_in_global_window(pipeline: beam.Pipeline, stream: Any, fires: Any) -> Any:
    """``stream`` grouped by key in the global window under ``Repeatedly(fires)``, discarding."""
    return (
        pipeline
        | stream
        | beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(fires),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        | beam.GroupByKey()
    )


class _FlushOnProcessingTime(beam.DoFn):  # type: ignore[misc]
    """Buffers a key's values until a processing-time timer at 5 s (timers in processing
    time are set on absolute times; a TestStream's clock starts at 0)."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.REAL_TIME)

    def process(
        self,
        kv: Any,
        buffer: Any = beam.DoFn.StateParam(BUFFER),
        flush: Any = beam.DoFn.TimerParam(FLUSH),
    ) -> None:
        if not list(buffer.read()):
            flush.set(5)
        buffer.add(kv[1])

    @userstate.on_timer(FLUSH)
    def on_flush(
        self,
        buffer: Any = beam.DoFn.StateParam(BUFFER),
        key: Any = beam.DoFn.KeyParam,
    ) -> Any:
        yield key, sorted(buffer.read())
        buffer.clear()


def _processing_time_timer(pipeline: beam.Pipeline) -> Any:
    # The runner's clock is the TestStream's (from 0, as DirectRunner's test clock): the
    # timer at 5 s must fire in the second micro-batch, which has no input, so 1 and 2 leave
    # before 3 arrives. Fired any later, they would leave together with 3.
    stream = (
        ScriptedStream()
        .add_elements([("k", 1), ("k", 2)])
        .advance_processing_time(6)
        .add_elements([("k", 3)])
        .advance_watermark_to_infinity()
    )
    return pipeline | stream | beam.ParDo(_FlushOnProcessingTime())


def _cogroup(pipeline: beam.Pipeline) -> Any:
    """A CoGroupByKey with on-time panes and a late one: the stage of its Flatten's read
    and GroupByKey's write hands the elements' bytes through (``execution.batched_steps``).

    The late element reaches one branch only: late data in both would fire one pane here
    and one per branch on DirectRunner, which gives each its own bundle.
    """
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("k", 1), 1), TimestampedValue(("j", 2), 12)])
        .advance_watermark_to(12)
        .add_elements([TimestampedValue(("k", 3), 3)])
        .advance_watermark_to_infinity()
    )
    windowed = pipeline | stream | beam.WindowInto(window.FixedWindows(10), allowed_lateness=5)
    doubled = (
        windowed
        | "OnTime" >> beam.Filter(lambda kv: kv[1] != 3)
        | "Double" >> beam.MapTuple(lambda key, value: (key, value * 2))
    )
    return (
        {"once": windowed, "twice": doubled}
        | beam.CoGroupByKey()
        | beam.MapTuple(
            lambda key, groups: (key, sorted((t, sorted(v)) for t, v in groups.items()))
        )
    )


def _sliding_counts(pipeline: beam.Pipeline) -> Any:
    """A lifted count in sliding windows, accumulating, with late panes: the first stage
    groups each key's elements per windows (``execution.batched_dofns``)."""
    stream = (
        ScriptedStream()
        .add_elements(
            [TimestampedValue(k, t) for k, t in [("a", 1), ("b", 2), ("a", 3), ("a", 3), ("c", 7)]]
        )
        .advance_watermark_to(9)
        # Late for the windows ending by 9, within the allowed lateness: late panes that
        # accumulate the on-time ones.
        .add_elements([TimestampedValue("a", 2), TimestampedValue("b", 8)])
        .advance_watermark_to(30)
        # Past every window's end plus the allowed lateness: dropped.
        .add_elements([TimestampedValue("a", 4)])
        .advance_watermark_to_infinity()
    )
    return (
        pipeline
        | stream
        | beam.WindowInto(
            window.SlidingWindows(6, 2),
            # The default trigger: Beam lifts the count (an AfterWatermark it lifts only
            # with both its early and late firings set to triggers it allows).
            accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
            allowed_lateness=10,
        )
        | beam.combiners.Count.PerElement()
    )


@pytest.mark.spark
@pytest.mark.parametrize(
    "build",
    [
        _late_data,
        _sliding_counts,
        pytest.param(_sessions, marks=pytest.mark.slow),
        pytest.param(_processing_time, marks=pytest.mark.slow),
        pytest.param(_processing_time_timer, marks=pytest.mark.slow),
        _cogroup,
    ],
    ids=[
        "late_data",
        "sliding_counts",
        "sessions",
        "processing_time",
        "processing_time_timer",
        "cogroup",
    ],
)
def test_the_same_panes_as_direct_runner(build: Callable[[beam.Pipeline], Any]) -> None:
    expected = _direct_output(build)
    assert expected, "DirectRunner gave no output: the pipeline tests nothing"
    _spark_run(build, expected)


@pytest.mark.spark
def test_a_count_trigger_fires_a_key_once_its_count_is_reached_in_a_batch() -> None:
    """The runner's ``CountDriver`` (DirectRunner fails on this pipeline): a pane holds the
    batch's values once a key's count is reached, the count and the pane index carry over
    between batches, and what waits when the input ends is dropped, as under Beam's driver
    (``Repeatedly(AfterCount)`` has no on-time pane)."""
    g = window.GlobalWindow()
    bounds, end = (float(g.start), float(g.end)), g.max_timestamp().micros // 1000
    early = PaneInfoTiming.EARLY
    _spark_run(
        _after_count,
        [
            ("a", [1, 3], bounds, end, (True, False, early, 0)),
            ("b", [2, 4], bounds, end, (True, False, early, 0)),
            ("a", [5, 6, 7], bounds, end, (False, False, early, 1)),
        ],
    )


def _two_groupings(pipeline: beam.Pipeline) -> Any:
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("a", 1), 1), TimestampedValue(("b", 2), 2)])
        .add_elements([TimestampedValue(("a", 3), 11)])
        .advance_watermark_to_infinity()
    )
    return (
        pipeline
        | stream
        | "Window" >> beam.WindowInto(window.FixedWindows(10))
        | "PerKey" >> beam.GroupByKey()
        | beam.MapTuple(lambda key, values: ("all", sum(values)))
        | "All" >> beam.GroupByKey()
    )


@pytest.mark.spark
@pytest.mark.slow
def test_a_second_grouping_fires_in_the_micro_batch_of_the_first() -> None:
    expected = _direct_output(_two_groupings)
    result = _spark_run(_two_groupings, expected)
    # Three events, three micro-batches: the +inf of the last passes both groupings (and
    # the assertion's own) in the batch that brings it. A level firing one batch late
    # would need more.
    assert result.micro_batches == 3


class _BufferUntilTimer(beam.DoFn):  # type: ignore[misc]
    """Buffers a key's values until an event-time timer 5 s after its latest element."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        kv: Any,
        buffer: Any = beam.DoFn.StateParam(BUFFER),
        flush: Any = beam.DoFn.TimerParam(FLUSH),
        timestamp: Any = beam.DoFn.TimestampParam,
    ) -> None:
        buffer.add(kv[1])
        flush.set(timestamp + 5)

    @userstate.on_timer(FLUSH)
    def on_flush(
        self,
        buffer: Any = beam.DoFn.StateParam(BUFFER),
        key: Any = beam.DoFn.KeyParam,
    ) -> Any:
        yield key, sorted(buffer.read())
        buffer.clear()


class _SeenWithSide(beam.DoFn):  # type: ignore[misc]
    """A stateful DoFn (it keeps each key's elements) that reads a side input."""

    SEEN = userstate.BagStateSpec("seen", VarIntCoder())

    def process(self, kv: Any, side: list[str], seen: Any = beam.DoFn.StateParam(SEEN)) -> Any:
        seen.add(len(side))
        yield f"{kv[1]}{len(side)}"


@pytest.mark.spark
@pytest.mark.slow
def test_a_timers_output_timestamp_holds_the_downstream_watermark() -> None:
    stream = (
        ScriptedStream()
        .add_elements([TimestampedValue(("a", 1), 1), TimestampedValue(("b", 2), 2)])
        .advance_watermark_to(4)
        .add_elements([TimestampedValue(("a", 3), 3)])
        .advance_watermark_to(10)
        .add_elements([TimestampedValue(("a", 4), 12)])
        # The timer of 'a' at 17 s fires only at +inf: until then it holds the stateful
        # DoFn's output watermark at 17 s, so the window [0, 100) downstream waits for it.
        # (DirectRunner fires the window first and drops the late [4].)
        .advance_watermark_to_infinity()
    )
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    with beam.Pipeline(options=options) as pipeline:
        flushed = pipeline | stream | beam.ParDo(_BufferUntilTimer())
        assert_that(flushed, equal_to([("a", [1, 3]), ("b", [2]), ("a", [4])]), label="Flushed")
        windowed = (
            flushed
            | beam.WindowInto(window.FixedWindows(100))
            | beam.Map(lambda kv: ("all", kv[1]))
            | beam.GroupByKey()
            | beam.MapTuple(lambda _, groups: sorted(groups))
        )
        assert_that(windowed, equal_to([[[1, 3], [2], [4]]]), label="OneWindow")


def _periodic_counts(pipeline: beam.Pipeline, output: str, start: float) -> None:
    _ = (
        pipeline
        | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 10, fire_interval=1)
        | beam.Map(lambda at: (f"k{int(at) % 3}", 1))
        | beam.WindowInto(window.FixedWindows(5))
        | beam.CombinePerKey(sum)
        | beam.MapTuple(lambda key, count: f"{key},{count}")
        | beam.io.WriteToText(output, triggering_frequency=5, num_shards=1)
    )


def _written(directory: Path) -> dict[str, list[str]]:
    return {
        path.name: sorted(path.read_text().splitlines()) for path in sorted(directory.iterdir())
    }


@pytest.mark.spark
@pytest.mark.slow
def test_an_unbounded_pipeline_writes_direct_runners_files(tmp_path: Path) -> None:
    # Started 6 s ago, so part of the sequence is due at once and the rest is deferred:
    # the splittable DoFn's residuals wait in state for their time. Windows are aligned
    # to 5 s, so the files do not depend on when the run starts.
    start = float(int(time.time()) // 5 * 5 - 5)
    outputs = {}
    for runner in ("DirectRunner", "SparkStructuredRunner"):
        directory = tmp_path / runner
        directory.mkdir()
        options = PipelineOptions(
            [f"--runner={runner}", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
        )
        with beam.Pipeline(options=options) as pipeline:
            _periodic_counts(pipeline, str(directory / "counts"), start)
        outputs[runner] = _written(directory)
    assert len(outputs["DirectRunner"]) == 2
    assert outputs["SparkStructuredRunner"] == outputs["DirectRunner"]


@pytest.mark.spark
@pytest.mark.slow
def test_main_elements_wait_for_their_side_input_window() -> None:
    main = (
        ScriptedStream()
        .add_elements([TimestampedValue("a", 1), TimestampedValue("b", 12)])
        .advance_watermark_to(30)
        .advance_watermark_to_infinity()
    )
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    with beam.Pipeline(options=options) as pipeline:
        windowed = (
            pipeline | "Main" >> main | "MainWindows" >> beam.WindowInto(window.FixedWindows(10))
        )
        # A side input per window, counted from the main input itself: each window's count
        # is final only once the watermark passes its end.
        counts = windowed | beam.combiners.Count.Globally().without_defaults()
        joined = windowed | beam.Map(
            lambda element, count: (element, count), count=beam.pvalue.AsSingleton(counts)
        )
        assert_that(joined, equal_to([("a", 1), ("b", 1)]))
        # A bounded side input: ready in the first micro-batch.
        bounded = pipeline | "Bounded" >> beam.Create(["x", "y"])
        tagged = windowed | "Tag" >> beam.Map(
            lambda element, side: f"{element}{len(side)}", side=beam.pvalue.AsList(bounded)
        )
        assert_that(tagged, equal_to(["a2", "b2"]), label="CheckBounded")
        # A stateful DoFn reading a bounded side input: computed before the query and
        # shipped with the stage (transformWithState workers load no broadcasts). Key-value
        # side elements: Beam's stateful-DoFn key check may pick the side input (hash order).
        pairs = pipeline | "Pairs" >> beam.Create([("x", 1), ("y", 2)])
        stateful = (
            windowed
            | "Key" >> beam.Map(lambda element: ("k", element))
            | "Stateful" >> beam.ParDo(_SeenWithSide(), beam.pvalue.AsList(pairs))
        )
        assert_that(stateful, equal_to(["a2", "b2"]), label="CheckStateful")


@pytest.mark.spark
def test_a_running_query_reports_metrics_and_can_be_cancelled() -> None:
    counted = Metrics.counter("test_streaming", "ticks")

    def tick(at: Any) -> Any:
        counted.inc()
        return at

    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    now = time.time()
    _ = (
        pipeline
        | PeriodicImpulse(start_timestamp=now - 3, stop_timestamp=now + 3600, fire_interval=1)
        | beam.Map(tick)
    )
    result = pipeline.run()
    assert result.state == PipelineState.RUNNING
    # A bounded wait returns while the query runs.
    assert result.wait_until_finish(duration=1000) == PipelineState.RUNNING

    def committed_ticks() -> int:
        counters = result.metrics().query(MetricsFilter().with_name("ticks"))["counters"]
        return sum(c.committed for c in counters)

    deadline = time.monotonic() + 180
    while committed_ticks() < 3 and time.monotonic() < deadline:
        time.sleep(1)
    assert committed_ticks() >= 3, "no micro-batch committed its metrics"
    assert result.cancel() == PipelineState.CANCELLED
    assert result.state == PipelineState.CANCELLED


def _note_first(path: str, marker: str) -> str:
    Path(marker).touch()
    return path


@pytest.mark.spark
@pytest.mark.slow
def test_continuous_file_matching_reads_files_that_arrive_while_it_runs(tmp_path: Path) -> None:
    """``MatchContinuously`` reads a file there at the start and one dropped while it runs.

    In the suite's long-lived process: its ``MatchContinuously`` has no start time, which
    Beam's default makes the time ``fileio`` was imported (at collection, by
    ``apache_beam.dataframe`` in ``test_dataframe_api.py``); the runner starts it when the
    pipeline runs instead (``beam_spark_runner.match_continuously``), else it polled
    minutes past its stop timestamp here.
    """
    from apache_beam.io import fileio

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.txt").write_text("x\ny\n")
    seen = tmp_path / "seen-a"

    def drop_b_once_a_is_read() -> None:
        deadline = time.monotonic() + 120
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        (inbox / "b.txt").write_text("z\n")

    threading.Thread(target=drop_b_once_a_is_read, daemon=True).start()
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    lines = (
        pipeline
        | fileio.MatchContinuously(
            str(inbox / "*.txt"), interval=2, stop_timestamp=time.time() + 45
        )
        | beam.Map(lambda metadata: metadata.path)
        | beam.Map(_note_first, str(seen))
        | fileio.ReadMatches()
        | beam.FlatMap(
            lambda f: [(Path(f.metadata.path).name, line) for line in f.read_utf8().split()]
        )
    )
    assert_that(lines, equal_to([("a.txt", "x"), ("a.txt", "y"), ("b.txt", "z")]))
    result = pipeline.run()
    # The match stops 45 s after it starts; a query still running long after has hung.
    state = result.wait_until_finish(duration=300_000)
    if state != PipelineState.DONE:
        result.cancel()
        pytest.fail(f"Expected the query to end DONE after its stop timestamp, found {state}")


@pytest.mark.spark
@pytest.mark.slow
def test_the_slowly_updating_side_input_pattern_streams_with_a_periodic_main_input(
    tmp_path: Path,
) -> None:
    # Beam's Python form: the main input in fixed windows reads a PeriodicImpulse side input
    # whose elements each have a window of their own. The reader does not fuse into the
    # main input's splittable DoFn (its stage keeps residuals; the reader keeps waiting
    # elements): each element waits until its side window is ready, then runs.
    start, end, records = slowly_updating.run(
        tmp_path,
        slowly_updating.windowed_side,
        lambda main, view: main | beam.Map(lambda at, side: (at, side), side=view),
    )
    window_of = slowly_updating.WINDOW
    # Beam's window mapping: the side window holding the main window's end; its one element
    # is that window's start.
    assert [(m, s) for m, s, _ in records] == [
        (float(t), float(t // window_of * window_of)) for t in range(int(start), int(end))
    ]
    first_window = [at for m, _, at in records if m < start + window_of]
    assert max(first_window) < end, "the first window was written only after the source ended"


def _latest_side(pipeline: beam.Pipeline, start: float, end: float) -> Any:
    """The Java form: the global window under a repeated processing-time trigger."""
    return (
        pipeline
        | "Side" >> PeriodicImpulse(start, end, 1)
        | "SideWindows"
        >> beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterProcessingTime(2)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        | "Stamp" >> beam.Map(lambda value, at=beam.DoFn.TimestampParam: (value, at))
        | "Latest" >> beam.CombineGlobally(combiners.LatestCombineFn()).without_defaults()
    )


@pytest.mark.spark
@pytest.mark.slow
def test_a_side_input_under_a_repeated_trigger_serves_its_latest_firing(tmp_path: Path) -> None:
    # Each firing (discarding) is the latest tick since the one before; an element sees the
    # latest firing when it runs (Beam's programming guide), not every firing so far (a
    # singleton of several values), and waits only for the first.
    start, end, records = slowly_updating.run(
        tmp_path,
        _latest_side,
        lambda main, view: main | beam.Map(lambda at, side: (at, side), side=view),
    )
    assert [m for m, _, _ in records] == [float(t) for t in range(int(start), int(end))]
    sides = [s for _, s, _ in records]
    assert set(sides) <= {float(t) for t in range(int(start), int(end))}
    # Later elements never see an earlier firing, and the side input did update.
    assert sides == sorted(sides)
    assert len(set(sides)) >= 3, sides
    assert min(at for _, _, at in records) < end, "nothing was written before the source ended"
