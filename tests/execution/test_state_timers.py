"""Stateful DoFns in batch on local[2]: state per key and window, timers in timestamp order.

Each pipeline runs on Spark and its output is compared with what Beam's batch semantics
define (the same pipelines give the same output on DirectRunner). Inputs are generated
inside the pipeline, with keys spread over both partitions and, where it matters, one key's
elements spanning several Arrow batches.
"""

import typing

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import combiners, userstate, window
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from tests.test_pipelines import counter_value, pipeline

Any = typing.Any
WATERMARK = userstate.TimeDomain.WATERMARK
REAL_TIME = userstate.TimeDomain.REAL_TIME


class CountAndSumAtEnd(beam.DoFn):
    """Value and bag state per key, emitted by an event-time timer at the window's end."""

    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())
    VALUES = userstate.BagStateSpec("values", VarIntCoder())
    END = userstate.TimerSpec("end", WATERMARK)

    def process(
        self,
        kv: Any,
        w: Any = beam.DoFn.WindowParam,
        count: Any = beam.DoFn.StateParam(COUNT),
        values: Any = beam.DoFn.StateParam(VALUES),
        end: Any = beam.DoFn.TimerParam(END),
    ) -> None:
        count.write((count.read() or 0) + 1)
        values.add(kv[1])
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def flush(
        self,
        key: Any = beam.DoFn.KeyParam,
        count: Any = beam.DoFn.StateParam(COUNT),
        values: Any = beam.DoFn.StateParam(VALUES),
    ) -> typing.Iterator[tuple[Any, int, int]]:
        yield key, count.read(), sum(values.read())
        count.clear()
        values.clear()


@pytest.mark.spark
def test_value_and_bag_state_with_keys_spanning_batches_and_partitions() -> None:
    keys, per_key = 7, 12_000  # one key's run is longer than an Arrow batch (10 000 rows)
    with pipeline() as p:
        out = (
            p
            | beam.Create(range(keys))
            | beam.FlatMap(lambda k: [(k, i) for i in range(per_key)])
            | beam.Reshuffle()
            | beam.ParDo(CountAndSumAtEnd())
        )
        expected = [(k, per_key, per_key * (per_key - 1) // 2) for k in range(keys)]
        assert_that(out, equal_to(expected))


class OrderedTimers(beam.DoFn):
    """Sets one dynamic timer per element; the callback records the order they fire in."""

    TIMERS = userstate.TimerSpec("timers", WATERMARK)
    LAST = userstate.ReadModifyWriteStateSpec("last", VarIntCoder())
    FOLLOW_UP = userstate.TimerSpec("follow_up", WATERMARK)

    def process(self, kv: Any, timers: Any = beam.DoFn.TimerParam(TIMERS)) -> None:
        timers.set(Timestamp(kv[1]), dynamic_timer_tag=str(kv[1]))

    @userstate.on_timer(TIMERS)
    def fired(
        self,
        key: Any = beam.DoFn.KeyParam,
        ts: Any = beam.DoFn.TimestampParam,
        last: Any = beam.DoFn.StateParam(LAST),
        follow_up: Any = beam.DoFn.TimerParam(FOLLOW_UP),
    ) -> typing.Iterator[tuple[str, int, int]]:
        seconds = int(ts.micros // 1_000_000)
        yield key, seconds, last.read() if last.read() is not None else -1
        last.write(seconds)
        if seconds == 10:
            # Set by a callback, earlier than timers still pending: fires before them.
            follow_up.set(Timestamp(15))

    @userstate.on_timer(FOLLOW_UP)
    def followed_up(
        self,
        key: Any = beam.DoFn.KeyParam,
        ts: Any = beam.DoFn.TimestampParam,
        last: Any = beam.DoFn.StateParam(LAST),
    ) -> typing.Iterator[tuple[str, int, int]]:
        seconds = int(ts.micros // 1_000_000)
        yield key, seconds, last.read()
        last.write(seconds)


@pytest.mark.spark
def test_timers_fire_in_timestamp_order_per_key_including_ones_set_by_callbacks() -> None:
    stamps = [30, 10, 50, 20, 40]
    with pipeline() as p:
        out = (
            p
            | beam.Create([(key, s) for key in ("a", "b", "c") for s in stamps])
            | beam.ParDo(OrderedTimers())
        )
        # (key, fired at, previously fired at): each key's timers in timestamp order.
        order = [10, 15, 20, 30, 40, 50]
        expected = [
            (key, fired, previous)
            for key in ("a", "b", "c")
            for previous, fired in zip([-1, *order], order, strict=False)
        ]
        assert_that(out, equal_to(expected))


class ResetAndClear(beam.DoFn):
    """Element 'reset' moves the timer earlier; element 'clear' cancels it."""

    TIMER = userstate.TimerSpec("timer", WATERMARK)

    def process(self, kv: Any, timer: Any = beam.DoFn.TimerParam(TIMER)) -> None:
        key, action = kv
        if action == "set":
            timer.set(Timestamp(100))
        elif action == "reset":
            timer.set(Timestamp(50))
        elif action == "clear":
            timer.clear()

    @userstate.on_timer(TIMER)
    def fired(
        self, key: Any = beam.DoFn.KeyParam, ts: Any = beam.DoFn.TimestampParam
    ) -> typing.Iterator[tuple[str, int]]:
        yield key, int(ts.micros // 1_000_000)


@pytest.mark.spark
def test_timer_reset_replaces_and_clear_cancels() -> None:
    # Element order within a key is not defined, so each key sees one kind of change.
    with pipeline() as p:
        out = (
            p
            | beam.Create([("kept", "set"), ("moved", "reset"), ("cancelled", "clear")])
            | beam.ParDo(ResetAndClear())
        )
        assert_that(out, equal_to([("kept", 100), ("moved", 50)]))


class ResetInProcess(beam.DoFn):
    """Sets the same timer twice and clears another in one call: the last setting wins."""

    TIMER = userstate.TimerSpec("timer", WATERMARK)
    OTHER = userstate.TimerSpec("other", WATERMARK)

    def process(
        self,
        kv: Any,
        timer: Any = beam.DoFn.TimerParam(TIMER),
        other: Any = beam.DoFn.TimerParam(OTHER),
    ) -> None:
        timer.set(Timestamp(100))
        timer.set(Timestamp(kv[1]))
        other.set(Timestamp(1))
        other.clear()

    @userstate.on_timer(TIMER)
    def fired(
        self, key: Any = beam.DoFn.KeyParam, ts: Any = beam.DoFn.TimestampParam
    ) -> typing.Iterator[tuple[str, int]]:
        yield key, int(ts.micros // 1_000_000)

    @userstate.on_timer(OTHER)
    def other_fired(self, key: Any = beam.DoFn.KeyParam) -> typing.Iterator[tuple[str, str]]:
        yield key, "cleared timer fired"


@pytest.mark.spark
def test_last_setting_of_a_timer_wins_within_a_bundle() -> None:
    with pipeline() as p:
        out = p | beam.Create([("x", 7), ("y", 9)]) | beam.ParDo(ResetInProcess())
        assert_that(out, equal_to([("x", 7), ("y", 9)]))


class ProcessingTimeFlush(beam.DoFn):
    """Buffers in a bag and flushes on a processing-time timer."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", REAL_TIME)

    def process(
        self,
        kv: Any,
        buffer: Any = beam.DoFn.StateParam(BUFFER),
        flush: Any = beam.DoFn.TimerParam(FLUSH),
    ) -> None:
        buffer.add(kv[1])
        flush.set(Timestamp.now() + 3600)  # an hour away: a batch run does not wait

    @userstate.on_timer(FLUSH)
    def flushed(
        self, key: Any = beam.DoFn.KeyParam, buffer: Any = beam.DoFn.StateParam(BUFFER)
    ) -> typing.Iterator[tuple[str, list[int]]]:
        yield key, sorted(buffer.read())
        buffer.clear()


@pytest.mark.spark
def test_processing_time_timers_fire_at_the_end_of_a_batch_run() -> None:
    with pipeline() as p:
        out = p | beam.Create([("a", 3), ("a", 1), ("b", 2)]) | beam.ParDo(ProcessingTimeFlush())
        assert_that(out, equal_to([("a", [1, 3]), ("b", [2])]))


class SumInts(beam.CombineFn):
    """An integer sum whose accumulator is an int (VarIntCoder encodes it)."""

    def create_accumulator(self) -> int:
        return 0

    def add_input(self, total: int, value: int) -> int:
        return total + value

    def merge_accumulators(self, totals: typing.Iterable[int]) -> int:
        return sum(totals)

    def extract_output(self, total: int) -> int:
        return total


class DistinctAndTotal(beam.DoFn):
    """Set and combining state, read back by an end-of-window timer."""

    SEEN = userstate.SetStateSpec("seen", VarIntCoder())
    TOTAL = userstate.CombiningValueStateSpec("total", VarIntCoder(), SumInts())
    END = userstate.TimerSpec("end", WATERMARK)

    def process(
        self,
        kv: Any,
        w: Any = beam.DoFn.WindowParam,
        seen: Any = beam.DoFn.StateParam(SEEN),
        total: Any = beam.DoFn.StateParam(TOTAL),
        end: Any = beam.DoFn.TimerParam(END),
    ) -> None:
        seen.add(kv[1])
        total.add(kv[1])
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def done(
        self,
        key: Any = beam.DoFn.KeyParam,
        w: Any = beam.DoFn.WindowParam,
        seen: Any = beam.DoFn.StateParam(SEEN),
        total: Any = beam.DoFn.StateParam(TOTAL),
    ) -> typing.Iterator[tuple[str, float, list[int], int]]:
        yield key, float(w.start), sorted(seen.read()), total.read()


@pytest.mark.spark
def test_set_and_combining_state_are_per_key_and_window() -> None:
    events = [("a", 1, 0), ("a", 1, 5), ("a", 2, 12), ("b", 3, 1), ("b", 3, 2), ("b", 4, 19)]
    with pipeline() as p:
        out = (
            p
            | beam.Create(events)
            | beam.Map(lambda e: TimestampedValue((e[0], e[1]), e[2]))
            | beam.WindowInto(window.FixedWindows(10))
            | beam.ParDo(DistinctAndTotal())
        )
        assert_that(
            out,
            equal_to(
                [
                    ("a", 0.0, [1], 2),
                    ("a", 10.0, [2], 2),
                    ("b", 0.0, [3], 6),
                    ("b", 10.0, [4], 4),
                ]
            ),
        )


class OrderedListState(beam.DoFn):
    """Ordered-list state read back in timestamp order."""

    LIST = userstate.OrderedListStateSpec("list", VarIntCoder())
    END = userstate.TimerSpec("end", WATERMARK)

    def process(
        self,
        kv: Any,
        values: Any = beam.DoFn.StateParam(LIST),
        end: Any = beam.DoFn.TimerParam(END),
    ) -> None:
        values.add((Timestamp(kv[1]), kv[1] * 10))
        end.set(Timestamp(1000))

    @userstate.on_timer(END)
    def done(
        self, key: Any = beam.DoFn.KeyParam, values: Any = beam.DoFn.StateParam(LIST)
    ) -> typing.Iterator[tuple[str, list[int]]]:
        yield key, [v for _, v in values.read()]


@pytest.mark.spark
def test_ordered_list_state_reads_in_sort_order() -> None:
    with pipeline() as p:
        out = (
            p
            | beam.Create([("k", 3), ("k", 1), ("k", 2), ("j", 9)])
            | beam.ParDo(OrderedListState())
        )
        assert_that(out, equal_to([("k", [10, 20, 30]), ("j", [90])]))


class CountGroups(beam.DoFn):
    """Counts, in value state, the groups a GroupByKey produced for each key."""

    GROUPS = userstate.ReadModifyWriteStateSpec("groups", VarIntCoder())
    END = userstate.TimerSpec("end", WATERMARK)

    def process(
        self,
        kv: tuple[str, Any],
        groups: Any = beam.DoFn.StateParam(GROUPS),
        end: Any = beam.DoFn.TimerParam(END),
        w: Any = beam.DoFn.WindowParam,
    ) -> None:
        groups.write((groups.read() or 0) + 1)
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def done(
        self, key: Any = beam.DoFn.KeyParam, groups: Any = beam.DoFn.StateParam(GROUPS)
    ) -> typing.Iterator[tuple[str, int]]:
        yield key, groups.read()


@pytest.mark.spark
def test_stateful_dofn_reading_a_group_by_key() -> None:
    with pipeline() as p:
        out = (
            p
            | beam.Create([("a", 1), ("a", 2), ("b", 3)] * 3)
            | beam.GroupByKey()
            | beam.ParDo(CountGroups())
        )
        assert_that(out, equal_to([("a", 1), ("b", 1)]))


class Enrich(beam.DoFn):
    """State plus a side input: the first element of each key per window, labelled."""

    FIRST = userstate.ReadModifyWriteStateSpec("first", VarIntCoder())

    def process(
        self,
        kv: Any,
        labels: dict[str, str],
        first: Any = beam.DoFn.StateParam(FIRST),
    ) -> typing.Iterator[tuple[str, str]]:
        if first.read() is None:
            first.write(kv[1])
            yield kv[0], labels[kv[0]]


@pytest.mark.spark
def test_stateful_dofn_with_a_side_input() -> None:
    with pipeline() as p:
        labels = p | "Labels" >> beam.Create([("a", "A"), ("b", "B")])
        out = (
            p
            | beam.Create([("a", 1), ("a", 2), ("b", 3), ("b", 4), ("b", 5)])
            | beam.ParDo(Enrich(), beam.pvalue.AsDict(labels))
        )
        assert_that(out, equal_to([("a", "A"), ("b", "B")]))


class CountingStateful(beam.DoFn):
    """A stateful DoFn that counts elements and timer firings in user metrics."""

    SEEN = userstate.BagStateSpec("seen", VarIntCoder())
    END = userstate.TimerSpec("end", WATERMARK)

    def __init__(self) -> None:
        self.elements = beam.metrics.Metrics.counter("stateful", "elements")
        self.firings = beam.metrics.Metrics.counter("stateful", "firings")

    def process(
        self,
        kv: Any,
        seen: Any = beam.DoFn.StateParam(SEEN),
        end: Any = beam.DoFn.TimerParam(END),
    ) -> None:
        self.elements.inc()
        seen.add(kv[1])
        end.set(Timestamp(0))

    @userstate.on_timer(END)
    def done(self, seen: Any = beam.DoFn.StateParam(SEEN)) -> typing.Iterator[int]:
        self.firings.inc()
        yield len(list(seen.read()))


@pytest.mark.spark
def test_stateful_metrics_and_state_released_between_keys() -> None:
    # Keys share one worker: if a key saw another key's state, counts would exceed 5.
    p = pipeline()
    out = (
        p
        | beam.Create(range(400))
        | beam.FlatMap(lambda k: [(k, i) for i in range(5)])
        | beam.ParDo(CountingStateful())
    )
    sizes = out | combiners.Count.PerElement()
    assert_that(sizes, equal_to([(5, 400)]))
    result = p.run()
    result.wait_until_finish()
    assert counter_value(result, "elements") == 2000
    assert counter_value(result, "firings") == 400
