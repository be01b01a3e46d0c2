"""End-to-end batch pipelines on local[2]: what a Beam user relies on.

Each test runs a real pipeline on Spark (one session reused for the whole test process)
and checks its output with Beam's ``assert_that`` or its metrics.
"""

import glob
import os
import typing

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampedValue

from beam_spark_runner.errors import PipelineExecutionError

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def pipeline(*extra: str) -> beam.Pipeline:
    return beam.Pipeline(options=PipelineOptions([*SPARK_ARGS, *extra]))


def counter_value(result: beam.runners.runner.PipelineResult, name: str) -> int:
    counters = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    assert counters, f"no counter named {name}"
    return sum(c.committed for c in counters)


@pytest.mark.spark
def test_map_flatmap_filter() -> None:
    with pipeline() as p:
        out = (
            p
            | beam.Create(["a b", "c d e", ""])
            | beam.FlatMap(str.split)
            | beam.Map(str.upper)
            | beam.Filter(lambda w: w != "C")
        )
        assert_that(out, equal_to(["A", "B", "D", "E"]))


@pytest.mark.spark
def test_identical_creates_in_one_pipeline_and_across_runs() -> None:
    # The session makes small literal rows once per content (TranslationContext.literal_rows):
    # the same rows read twice in a plan, and again by a later run, still count twice.
    for _ in range(2):
        with pipeline() as p:
            first = p | "First" >> beam.Create(["a", "b"])
            second = p | "Second" >> beam.Create(["a", "b"])
            both = (first, second) | beam.Flatten() | beam.Map(str.upper)
            assert_that(both, equal_to(["A", "A", "B", "B"]))


@pytest.mark.spark
def test_partition_and_tagged_outputs() -> None:
    class SplitParity(beam.DoFn):
        def process(self, x: int) -> typing.Iterator[typing.Any]:
            yield beam.pvalue.TaggedOutput("odd" if x % 2 else "even", x)
            yield x * 10

    with pipeline() as p:
        numbers = p | beam.Create(range(10))
        low, high = numbers | beam.Partition(lambda x, n: 0 if x < 5 else 1, 2)
        assert_that(low, equal_to(list(range(5))), label="low")
        assert_that(high, equal_to(list(range(5, 10))), label="high")
        tagged = numbers | beam.ParDo(SplitParity()).with_outputs("odd", "even", main="main")
        assert_that(tagged.odd, equal_to([1, 3, 5, 7, 9]), label="odd")
        assert_that(tagged.even, equal_to([0, 2, 4, 6, 8]), label="even")
        assert_that(tagged.main, equal_to([x * 10 for x in range(10)]), label="main")


@pytest.mark.spark
def test_batched_dofn() -> None:
    class Double(beam.DoFn):
        def process_batch(self, batch: np.ndarray) -> typing.Iterator[np.ndarray]:
            yield batch * 2

        def infer_output_type(self, input_element_type: typing.Any) -> typing.Any:
            return input_element_type

    with pipeline() as p:
        out = (
            p
            | beam.Create(np.arange(20, dtype=np.int64)).with_output_types(np.int64)
            | beam.ParDo(Double())
            | beam.Map(int)
        )
        assert_that(out, equal_to([2 * i for i in range(20)]))


@pytest.mark.spark
def test_group_by_key_fixed_sliding_and_session_windows() -> None:
    events = [("k", 1, 1), ("k", 2, 2), ("k", 3, 12), ("j", 4, 3), ("j", 5, 40)]

    def timestamped(p: beam.Pipeline, label: str) -> beam.PCollection:
        return (
            p
            | f"Create{label}" >> beam.Create(events)
            | f"Stamp{label}" >> beam.Map(lambda e: TimestampedValue((e[0], e[1]), e[2]))
        )

    def summarize(label: str) -> beam.PTransform:
        return f"Sum{label}" >> beam.MapTuple(lambda k, vs: (k, sorted(vs)))

    with pipeline() as p:
        fixed = (
            timestamped(p, "F")
            | "WinF" >> beam.WindowInto(window.FixedWindows(10))
            | "GbkF" >> beam.GroupByKey()
            | summarize("F")
        )
        assert_that(fixed, equal_to([("k", [1, 2]), ("k", [3]), ("j", [4]), ("j", [5])]), "fixed")
        sliding = (
            timestamped(p, "S")
            | "WinS" >> beam.WindowInto(window.SlidingWindows(10, 5))
            | "GbkS" >> beam.GroupByKey()
            | summarize("S")
        )
        assert_that(
            sliding,
            equal_to(
                [("k", [1, 2]), ("k", [1, 2]), ("k", [3]), ("k", [3]), ("j", [4]), ("j", [4])]
                + [("j", [5]), ("j", [5])]
            ),
            "sliding",
        )
        sessions = (
            timestamped(p, "W")
            | "WinW" >> beam.WindowInto(window.Sessions(5))
            | "GbkW" >> beam.GroupByKey()
            | summarize("W")
        )
        assert_that(sessions, equal_to([("k", [1, 2]), ("k", [3]), ("j", [4]), ("j", [5])]), "ses")


class _EvenOddMerging(window.WindowFn):
    """A custom merging window fn: merges all windows of each key into one big window."""

    def assign(self, context: window.WindowFn.AssignContext) -> list[window.IntervalWindow]:
        return [window.IntervalWindow(context.timestamp, context.timestamp + 1)]

    def merge(self, merge_context: window.WindowFn.MergeContext) -> None:
        windows = list(merge_context.windows)
        if len(windows) > 1:
            merged = window.IntervalWindow(
                min(w.start for w in windows), max(w.end for w in windows)
            )
            merge_context.merge(windows, merged)

    def get_window_coder(self) -> beam.coders.Coder:
        return beam.coders.coders.IntervalWindowCoder()


@pytest.mark.spark
def test_custom_merging_window_fn() -> None:
    with pipeline() as p:
        out = (
            p
            | beam.Create([("a", 1, 10), ("a", 2, 500), ("b", 3, 7)])
            | beam.Map(lambda e: TimestampedValue((e[0], e[1]), e[2]))
            | beam.WindowInto(_EvenOddMerging())
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
        )
        assert_that(out, equal_to([("a", [1, 2]), ("b", [3])]))


@pytest.mark.spark
def test_triggered_accumulating_panes() -> None:
    with pipeline() as p:
        out = (
            p
            | beam.Create([("k", i) for i in range(6)])
            | beam.WindowInto(
                window.GlobalWindows(),
                trigger=trigger.Repeatedly(trigger.AfterCount(2)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
            )
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: len(list(vs)))
        )
        # In batch, Beam's trigger driver sees the whole key at once: one pane of 6,
        # exactly as FnApiRunner (DirectRunner) produces.
        assert_that(out, equal_to([6]))


@pytest.mark.spark
def test_flatten_same_pcollection_twice_and_empty_inputs() -> None:
    with pipeline() as p:
        a = p | "A" >> beam.Create([1, 2])
        empty = p | "Empty" >> beam.Create([])
        assert_that((a, a, empty) | "F1" >> beam.Flatten(), equal_to([1, 1, 2, 2]), "twice")
        assert_that(() | "F2" >> beam.Flatten(pipeline=p), equal_to([]), "none")


@pytest.mark.spark
def test_reshuffle_keeps_timestamps_and_windows() -> None:
    with pipeline() as p:
        out = (
            p
            | beam.Create([1, 2, 3, 15])
            | beam.Map(lambda x: TimestampedValue(x, x))
            | beam.WindowInto(window.FixedWindows(10))
            | beam.Reshuffle()
            | beam.Map(lambda x, w=beam.DoFn.WindowParam: (x, w.start.micros // 1_000_000))
        )
        assert_that(out, equal_to([(1, 0), (2, 0), (3, 0), (15, 10)]))


@pytest.mark.spark
def test_combiners_lifted_packed_and_empty() -> None:
    with pipeline() as p:
        nums = p | "Nums" >> beam.Create([1, 2, 3, 4])
        assert_that(nums | "Sum" >> beam.CombineGlobally(sum), equal_to([10]), "sum")
        assert_that(nums | "Mean" >> beam.combiners.Mean.Globally(), equal_to([2.5]), "mean")
        assert_that(nums | "Count" >> beam.combiners.Count.Globally(), equal_to([4]), "count")
        per_key = (
            nums
            | beam.Map(lambda x: (x % 2, x))
            | beam.CombinePerKey(beam.combiners.TopCombineFn(1))
        )
        assert_that(per_key, equal_to([(0, [4]), (1, [3])]), "top")
        empty = p | "NoNums" >> beam.Create([]).with_output_types(int)
        assert_that(empty | "EmptySum" >> beam.CombineGlobally(sum), equal_to([0]), "empty")


@pytest.mark.spark
def test_side_inputs_all_access_patterns() -> None:
    with pipeline() as p:
        main = p | "Main" >> beam.Create([1, 2])
        side = p | "Side" >> beam.Create([("a", 1), ("b", 2), ("a", 3)])
        single = p | "Single" >> beam.Create([100])
        out = main | beam.Map(
            lambda x, s, it, lst, mm, d: (
                x + s,
                sorted(it),
                len(lst),
                sorted(mm["a"]),
                d["b"],
            ),
            s=beam.pvalue.AsSingleton(single),
            it=beam.pvalue.AsIter(single),
            lst=beam.pvalue.AsList(side),
            mm=beam.pvalue.AsMultiMap(side),
            d=beam.pvalue.AsDict(side | beam.Filter(lambda kv: kv[0] == "b")),
        )
        assert_that(out, equal_to([(101, [100], 3, [1, 3], 2), (102, [100], 3, [1, 3], 2)]))


@pytest.mark.spark
def test_windowed_side_input() -> None:
    with pipeline() as p:
        side = (
            p
            | "Side" >> beam.Create([(0, "early"), (15, "late")])
            | "StampSide" >> beam.Map(lambda e: TimestampedValue(e[1], e[0]))
            | "WinSide" >> beam.WindowInto(window.FixedWindows(10))
        )
        out = (
            p
            | "Main" >> beam.Create([1, 12])
            | "StampMain" >> beam.Map(lambda x: TimestampedValue(x, x))
            | "WinMain" >> beam.WindowInto(window.FixedWindows(10))
            | beam.Map(lambda x, tags: (x, list(tags)), tags=beam.pvalue.AsList(side))
        )
        assert_that(out, equal_to([(1, ["early"]), (12, ["late"])]))


@pytest.mark.spark
def test_text_read_in_parallel_and_write(tmp_path: typing.Any) -> None:
    source = tmp_path / "input.txt"
    lines = [f"line {i} " + "x" * 80 for i in range(50_000)]  # ~4.5 MB: several splits
    source.write_text("\n".join(lines) + "\n")
    partitions = Metrics.string_set("test", "read_partitions")

    def note_partition(line: str) -> str:
        from pyspark import TaskContext

        context = TaskContext.get()
        partitions.add(str(context.partitionId() if context else -1))
        return line

    prefix = str(tmp_path / "out" / "lines")
    p = pipeline()
    _ = (
        p
        | beam.io.ReadFromText(str(source))
        | beam.Map(note_partition)
        | beam.Map(lambda line: line.split(" ")[1])
        | beam.io.WriteToText(prefix)
    )
    result = p.run()
    result.wait_until_finish()
    written = []
    for shard in glob.glob(prefix + "*"):
        with open(shard) as handle:
            written.extend(handle.read().split())
    assert sorted(written, key=int) == [str(i) for i in range(50_000)]
    sets = result.metrics().query(MetricsFilter().with_name("read_partitions"))["string_sets"]
    assert len(sets[0].committed) >= 2, f"file read by one task only: {sets[0].committed}"


@pytest.mark.spark
def test_small_shuffle_still_spreads_over_every_core() -> None:
    # A lifted combine shuffles one accumulator per key and bundle: a few kilobytes here,
    # which Spark's adaptive execution would merge into one task. Its merge is Python
    # work per key, so the stage after the shuffle must keep one task per core.
    partitions = Metrics.string_set("test", "merge_partitions")

    def note_partition(kv: tuple[int, int]) -> tuple[int, int]:
        from pyspark import TaskContext

        context = TaskContext.get()
        partitions.add(str(context.partitionId() if context else -1))
        return kv

    p = pipeline()
    sums = (
        p
        | beam.Create(range(4))
        | beam.FlatMap(lambda seed: ((i % 200, 1) for i in range(seed, 20_000, 4)))
        | beam.CombinePerKey(sum)
        | beam.Map(note_partition)
    )
    assert_that(sums, equal_to([(k, 100) for k in range(200)]))
    result = p.run()
    result.wait_until_finish()
    sets = result.metrics().query(MetricsFilter().with_name("merge_partitions"))["string_sets"]
    # Partition ids, not task counts: the stage may also read a union (assert_that's
    # Flatten), which numbers the shuffle's two partitions after the union's others.
    assert len(sets[0].committed) == 2, f"merged in partitions {sets[0].committed} only"


@pytest.mark.spark
def test_user_metrics_of_all_kinds() -> None:
    class Measure(beam.DoFn):
        def __init__(self) -> None:
            self.count = Metrics.counter("test", "elements")
            self.sizes = Metrics.distribution("test", "sizes")
            self.last = Metrics.gauge("test", "last")
            self.words = Metrics.string_set("test", "words")

        def process(self, x: str) -> typing.Iterator[str]:
            self.count.inc()
            self.sizes.update(len(x))
            self.last.set(len(x))
            self.words.add(x)
            yield x

    p = pipeline()
    _ = p | beam.Create(["a", "bb", "ccc", "bb"]) | beam.ParDo(Measure())
    result = p.run()
    metrics = result.metrics().query()
    assert counter_value(result, "elements") == 4
    (dist,) = metrics["distributions"]
    assert (dist.committed.count, dist.committed.sum, dist.committed.min, dist.committed.max) == (
        4,
        8,
        1,
        3,
    )
    (gauge,) = metrics["gauges"]
    assert gauge.committed.value in (1, 2, 3)
    (words,) = metrics["string_sets"]
    assert words.committed == {"a", "bb", "ccc"}


@pytest.mark.spark
def test_user_code_runs_once_per_element_with_shared_outputs() -> None:
    """A stage whose output feeds several consumers is computed once (persisted)."""
    calls = Metrics.counter("test", "calls")

    class CountCalls(beam.DoFn):
        def process(self, x: int) -> typing.Iterator[typing.Any]:
            calls.inc()
            yield x
            yield beam.pvalue.TaggedOutput("tagged", x)

    p = pipeline()
    outs = p | beam.Create(range(100)) | beam.ParDo(CountCalls()).with_outputs("tagged", main="m")
    assert_that(outs.m | "Sum1" >> beam.CombineGlobally(sum), equal_to([4950]), "a")
    assert_that(outs.m | "Count1" >> beam.combiners.Count.Globally(), equal_to([100]), "b")
    assert_that(outs.tagged | "Sum2" >> beam.CombineGlobally(sum), equal_to([4950]), "c")
    side = beam.pvalue.AsList(outs.tagged)
    assert_that(
        outs.m
        | "UseSide" >> beam.Map(lambda x, s: x + len(s), s=side)
        | "Min" >> beam.CombineGlobally(min),
        equal_to([100]),
        "d",
    )
    result = p.run()
    assert counter_value(result, "calls") == 100


@pytest.mark.spark
def test_failing_dofn_names_stage_and_carries_traceback() -> None:
    def explode(x: int) -> int:
        if x == 3:
            raise ValueError("bad element 3")
        return x

    with pytest.raises(PipelineExecutionError) as caught:
        with pipeline() as p:
            _ = p | beam.Create([1, 2, 3]) | "Explode" >> beam.Map(explode)
    message = str(caught.value)
    assert "Explode" in message
    assert "ValueError: bad element 3" in message
    assert "test_pipelines.py" in message  # the user's own frame
    assert caught.value.stage_name and "Explode" in caught.value.stage_name


def test_unknown_option_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="Allowed values: ALL, DEBUG"):
        with pipeline("--spark_log_level=LOUD") as p:
            _ = p | beam.Create([1])


@pytest.mark.spark
def test_pipeline_is_not_collected_to_driver_results_land_in_files(tmp_path: typing.Any) -> None:
    """Writes happen in executors: the output files exist, named by shard."""
    prefix = str(tmp_path / "nums")
    with pipeline() as p:
        _ = p | beam.Create(range(1000)) | beam.Map(str) | beam.io.WriteToText(prefix, num_shards=3)
    shards = sorted(glob.glob(prefix + "*"))
    assert len(shards) == 3
    values = []
    for shard in shards:
        assert os.path.getsize(shard) > 0
        with open(shard) as handle:
            values.extend(int(v) for v in handle.read().split())
    assert sorted(values) == list(range(1000))


@pytest.mark.spark
def test_warnings_from_workers_reach_the_driver() -> None:
    class Warns(beam.DoFn):
        def process(self, x: int) -> typing.Iterator[int]:
            import warnings

            warnings.warn(f"careful with element {x}", RuntimeWarning, stacklevel=1)
            yield x

    with pytest.warns(RuntimeWarning, match="careful with element 7"):
        with pipeline() as p:
            _ = p | beam.Create([7]) | beam.ParDo(Warns())


@pytest.mark.spark
def test_reshuffle_then_group_by_key_with_pickled_keys() -> None:
    from apache_beam.coders import coders_test_common

    key = coders_test_common.MyTypedNamedTuple(1, "a")
    with pipeline() as p:
        grouped = (
            p
            | beam.Create(range(10))
            | beam.Map(lambda _: (coders_test_common.MyTypedNamedTuple(1, "a"), 1))
            | beam.Reshuffle()
            | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: (k, sum(vs)))
        )
        assert_that(grouped, equal_to([(key, 10)]))


class LiveValue:
    """A value that counts its live instances, to see how many a DoFn holds at once."""

    live = 0

    def __init__(self, n: int) -> None:
        self.n = n
        LiveValue.live += 1

    def __del__(self) -> None:
        LiveValue.live -= 1

    def __reduce__(self) -> tuple[typing.Any, ...]:
        return (LiveValue, (self.n,))


def sum_and_peak_live(kv: typing.Any) -> tuple[int, bool]:
    """The sum of a group's values, and whether fewer than all were ever live at once."""
    total, peak = 0, 0
    for value in kv[1]:
        total += value.n
        peak = max(peak, LiveValue.live)
    return total, peak < 300


@pytest.mark.spark
@pytest.mark.parametrize("state_backed", [False, True])
def test_state_backed_iterables_decode_group_values_one_at_a_time(state_backed: bool) -> None:
    extra = ["--spark_state_backed_iterables"] if state_backed else []
    with pipeline(*extra) as p:
        out = (
            p
            | beam.Create([None])
            | beam.FlatMap(lambda _: [("k", LiveValue(i)) for i in range(300)])
            | beam.GroupByKey()
            | beam.Map(sum_and_peak_live)
        )
        # Without the option the group arrives as a list of 300 decoded values.
        assert_that(out, equal_to([(sum(range(300)), state_backed)]))
