"""GroupByKey shards in a streaming run: one micro-batch at a time, without Spark.

Each test plans a real pipeline, takes its GroupByKey's spec, and feeds one shard the rows
a micro-batch brings (elements, then the producers' markers), as the level processor does.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import IntervalWindow, TimestampCombiner
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming, WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.beam_globals import TaskEnvironment
from beam_spark_runner.planning import GROUP_BY_KEY_URN, build_plan
from beam_spark_runner.streaming import group_panes, grouping
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.chunk_lists import ChunkStore
from beam_spark_runner.streaming.rows import ELEMENT, KEY, PORT, PRODUCER, PTIME, WATERMARK
from beam_spark_runner.streaming.topology import SINK, Node, Topology
from beam_spark_runner.translators.group_by_key import group_spec

SECOND = 1_000_000


class _Shard:
    """One shard of the pipeline's only GroupByKey, fed micro-batch by micro-batch."""

    def __init__(
        self,
        windowing: beam.WindowInto,
        store: bool = False,
        chunks: ChunkStore | None = None,
    ) -> None:
        from beam_spark_runner.streaming.query import plan_topology

        # Unsafe triggers too (AfterWatermark without a late trigger finishes).
        options = PipelineOptions(["--streaming", "--allow_unsafe_triggers"])
        pipeline = beam.Pipeline(options=options)
        _ = (
            pipeline
            | ScriptedStream().add_elements([("k", 1)])
            | beam.Map(lambda kv: kv).with_output_types(tuple[str, int])
            | windowing
            | beam.GroupByKey()
            | beam.Map(print)
        )
        pipeline.visit(bi.group_by_key_input_visitor(True))
        plan = build_plan(
            pipeline.to_runner_api(default_environment=bi.default_environment()), streaming=True
        )
        self.topology: Topology = plan_topology(plan, shards=1)
        self.node: Node = next(n for n in self.topology.nodes if n.stateful)
        buffer = next(b for b in plan.buffers.values() if b.urn == GROUP_BY_KEY_URN)
        context = types.SimpleNamespace(plan=plan, environment=TaskEnvironment("test"))
        self.spec = group_spec(buffer, context)  # type: ignore[arg-type]
        self.grouper = group_panes.streaming_grouper(self.spec)
        self.state: grouping.ShardState | None = None
        # Whether the state goes through the state store's encoding between batches.
        self.store = store
        # The shard's chunk store (the level's list state), if it has one.
        self.chunks = chunks
        (self.source,) = self.node.expected

    def batch(
        self, elements: list[tuple[Any, ...]], watermark: float, now: float = 0
    ) -> tuple[list[WindowedValue], int]:
        """One micro-batch: the panes that fired and the shard's output watermark (µs).

        Elements are (value, event time, window) of key ``"k"``, or (key, value, event
        time, window).
        """
        keyed = [e if len(e) == 4 else ("k", *e) for e in elements]
        # As a router sends them: packed in a keyed run.
        element_rows = [
            routed.element_row(
                self.topology,
                self.node.index,
                key.encode(),
                self.grouper.pre_impl.encode_nested(
                    WindowedValue((key, value), Timestamp(at), [w])
                ),
            )
            for key, value, at, w in keyed
        ]
        rows: list[dict[str, Any]] = [
            dict(zip(routed.ROUTED_SCHEMA.names, row, strict=True))
            for row in routed.packed(element_rows, self.topology)
        ]
        assert len(rows) <= 1
        rows.append(
            {
                KEY: None,
                ELEMENT: None,
                PRODUCER: self.source,
                WATERMARK: int(watermark * SECOND),
                PTIME: int(now * SECOND),
                PORT: 0,
            }
        )
        out = self.run(rows)
        panes = [
            pane
            for row in out
            if row[3] is not None
            for pane in self.grouper.post_impl.decode_all(row[3])
        ]
        markers = [row for row in out if row[3] is None]
        # One to the reader, one to the driver (progress reports), with the same watermark.
        assert sorted(m[0] for m in markers) == sorted([self.node.all_targets[0], SINK])
        assert len({m[5] for m in markers}) == 1
        return panes, markers[0][5]

    def run(self, rows: list[dict[str, Any]]) -> list[Any]:
        """The shard's micro-batch over ``rows``: its rows out."""
        if self.store and self.state is not None:
            # As ``streaming.levels`` did: encoded, its decoded keys released, then decoded.
            encoded = grouping.encode_shard_state(self.state)
            grouping.release_shard_state(self.state)
            self.state = grouping.decode_shard_state(encoded)
        run = group_panes.GroupShard(group_panes.streaming_grouper(self.spec), self.chunks)
        self.state, out = run.run(self.topology, self.node, 0, self.state, rows)
        return out


def _values(panes: list[WindowedValue]) -> list[tuple[Any, list[Any], Any]]:
    return [(p.value[0], sorted(p.value[1]), p.windows[0]) for p in panes]


@pytest.fixture
def fixed() -> Iterator[_Shard]:
    yield _Shard(beam.WindowInto(window.FixedWindows(10)))


def test_a_window_fires_when_the_watermark_passes_its_end(fixed: _Shard) -> None:
    w = IntervalWindow(0, 10)
    panes, out = fixed.batch([(1, 1, w), (2, 2, w)], watermark=5)
    assert panes == []
    # The unfired pane holds the output at its end-of-window output time.
    assert out == 5 * SECOND
    panes, out = fixed.batch([], watermark=12)
    assert _values(panes) == [("k", [1, 2], w)]
    # At the end of the window, in the millisecond precision of Beam's windowed-value coder.
    assert panes[0].timestamp == Timestamp(9.999)
    assert panes[0].pane_info.timing == PaneInfoTiming.ON_TIME
    assert out == 12 * SECOND


def test_late_data_is_dropped_behind_the_window_end(fixed: _Shard) -> None:
    w = IntervalWindow(0, 10)
    fixed.batch([(1, 1, w)], watermark=12)
    # Elements of a micro-batch meet the watermark the shard had before it: 12 > 10.
    panes, _ = fixed.batch([(2, 3, w), (3, 15, IntervalWindow(10, 20))], watermark=25)
    assert _values(panes) == [("k", [3], IntervalWindow(10, 20))]


def test_elements_are_judged_against_the_previous_watermark(fixed: _Shard) -> None:
    w = IntervalWindow(0, 10)
    # Same batch as the marker that passes the window: not late, fires at once.
    panes, _ = fixed.batch([(1, 1, w)], watermark=12)
    assert _values(panes) == [("k", [1], w)]


def test_allowed_lateness_gives_a_late_pane() -> None:
    shard = _Shard(beam.WindowInto(window.FixedWindows(10), allowed_lateness=30))
    w = IntervalWindow(0, 10)
    assert _values(shard.batch([(1, 1, w)], watermark=12)[0]) == [("k", [1], w)]
    panes, _ = shard.batch([(2, 3, w)], watermark=13)
    assert _values(panes) == [("k", [2], w)]
    assert panes[0].pane_info.timing == PaneInfoTiming.LATE


def test_a_session_merges_across_micro_batches() -> None:
    shard = _Shard(beam.WindowInto(window.Sessions(10)))
    assert shard.batch([(1, 1, IntervalWindow(1, 11))], watermark=2)[0] == []
    assert shard.batch([(2, 5, IntervalWindow(5, 15))], watermark=4)[0] == []
    panes, _ = shard.batch([], watermark=30)
    assert _values(panes) == [("k", [1, 2], IntervalWindow(1, 15))]


def test_a_processing_time_trigger_fires_in_a_batch_without_input() -> None:
    shard = _Shard(
        beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterProcessingTime(5)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        ),
        store=True,  # a key with a processing-time timer is visited every batch
    )
    g = window.GlobalWindow()
    assert shard.batch([(1, 1, g)], watermark=0, now=100)[0] == []
    assert shard.batch([], watermark=0, now=103)[0] == []
    panes, _ = shard.batch([], watermark=0, now=106)
    assert _values(panes) == [("k", [1], g)]


def test_an_unfired_pane_holds_the_output_watermark() -> None:
    shard = _Shard(
        beam.WindowInto(
            window.FixedWindows(10), timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST
        )
    )
    w = IntervalWindow(0, 10)
    _, out = shard.batch([(1, 3, w)], watermark=5)
    # Held just before the pane's output time, 3 s, while the input is at 5 s.
    assert out == 3 * SECOND - 1
    panes, out = shard.batch([], watermark=11)
    assert panes[0].timestamp == Timestamp(3)
    assert out == 11 * SECOND


def test_state_survives_the_state_store_round_trip(fixed: _Shard) -> None:
    w = IntervalWindow(0, 10)
    fixed.batch([(1, 1, w)], watermark=5)
    assert fixed.state is not None
    fixed.state = grouping.decode_shard_state(grouping.encode_shard_state(fixed.state))
    panes, _ = fixed.batch([(2, 2, w)], watermark=12)
    assert _values(panes) == [("k", [1, 2], w)]
    # Fired and past its garbage-collection time: the key is forgotten.
    assert fixed.state.keys == {}


def test_a_key_with_nothing_due_is_not_decoded_and_still_holds_the_watermark() -> None:
    shard = _Shard(
        beam.WindowInto(
            window.FixedWindows(10), timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST
        ),
        store=True,
    )
    a, b = IntervalWindow(0, 10), IntervalWindow(20, 30)
    shard.batch([("a", 1, 1, a), ("b", 2, 21, b)], watermark=0)
    panes, out = shard.batch([("a", 3, 2, a)], watermark=25)
    assert _values(panes) == [("a", [1, 3], a)]
    assert shard.state is not None
    # "a" fired and was forgotten; "b" had no element and nothing due, so it stayed encoded,
    # and its pane's hold (21 s) still holds the output watermark.
    assert shard.state.keys == {}
    assert list(shard.state.blobs) == [b"b"]
    assert out == 21 * SECOND - 1
    panes, out = shard.batch([], watermark=31)
    assert _values(panes) == [("b", [2], b)]
    assert out == 31 * SECOND
    assert shard.state.blobs == {}


def test_a_key_under_beams_driver_is_decoded_only_when_its_timer_or_window_is_due() -> None:
    """Keys under Beam's driver (sessions with a late trigger, which the runner's drivers
    do not take) are visited when their timers are due.

    The same batches through a shard that keeps every key decoded (no state store) give
    the same panes and output watermarks.
    """
    windowing = beam.WindowInto(
        window.Sessions(10),
        trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
        allowed_lateness=5,
    )
    lazy, eager = _Shard(windowing, store=True), _Shard(windowing)
    assert lazy.grouper.default is None  # Beam's driver
    batches: list[tuple[list[tuple[Any, ...]], float]] = [
        ([("a", 1, 1, IntervalWindow(1, 11)), ("b", 2, 20, IntervalWindow(20, 30))], 0),
        ([("a", 3, 2, IntervalWindow(2, 12))], 5),
        ([], 13),  # a's session [1, 12) fires
        ([], 17),  # a is not yet past its garbage-collection time (12 + 5)
        ([], 31),  # b's session fires
        ([], 40),  # both are past it: forgotten
    ]
    decoded = []
    for elements, watermark in batches:
        panes, out = lazy.batch(elements, watermark)
        assert (_values(panes), out) == tuple(
            f(x) for f, x in zip((_values, int), eager.batch(elements, watermark), strict=True)
        )
        assert lazy.state is not None
        decoded.append(sorted(lazy.state.keys))
    # "b" has no element after the first batch and nothing due before 30 s: not decoded.
    assert decoded == [[b"a", b"b"], [b"a"], [b"a"], [], [b"b"], []]
    assert lazy.state.blobs == {}


def test_beams_driver_gets_one_combiner_per_tag_across_merges() -> None:
    """``without_extraction`` defined a class per call; the runner makes it return one tag."""
    from apache_beam.transforms import combiners

    bi.create_trigger_driver(beam.WindowInto(window.Sessions(10)).windowing, clock=None)
    tag = trigger._CombiningValueStateTag("count", combiners.CountCombineFn())  # noqa: SLF001
    first, second = tag.without_extraction(), tag.with_prefix("").without_extraction()
    assert first is second
    # It still adds up and merges as the tag's combiner, and extracts nothing.
    assert first.combine_fn.apply([1, 1, 1]) == 3
    assert first.combine_fn.merge_accumulators([2, 3]) == 5


def test_a_shard_written_in_the_layout_before_is_read() -> None:
    from pyspark import cloudpickle

    shard = _Shard(beam.WindowInto(window.FixedWindows(10)))
    w = IntervalWindow(0, 10)
    shard.batch([(1, 1, w)], watermark=5)
    assert shard.state is not None
    # As the runner wrote it before per-key blobs: one pickle of every key, holds as
    # timestamps.
    (state,) = (v.state for v in shard.state.keys.values())
    for panes in state.values():
        panes.holds = [Timestamp(micros=h) for h in panes.holds]
    old = cloudpickle.dumps(
        (
            shard.state.watermarks,
            {k: (v.key, v.state) for k, v in shard.state.keys.items()},
        )
    )
    shard.state = grouping.decode_shard_state(old)
    shard.store = True
    assert _values(shard.batch([(2, 2, w)], watermark=8)[0]) == []
    panes, _ = shard.batch([], watermark=12)
    assert _values(panes) == [("k", [1, 2], w)]


def test_key_state_of_a_type_pickle_cannot_find_falls_back_to_cloudpickle() -> None:
    import pickle

    class Local:
        def __init__(self, n: int) -> None:
            self.n = n

    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(Local(1))
    restored = pickle.loads(grouping.dumps(("key", [Local(7)])))
    assert restored[0] == "key"
    assert restored[1][0].n == 7


def test_a_keys_windows_survive_their_plain_form() -> None:
    from beam_spark_runner.execution.default_trigger import (
        DefaultTriggerState,
        WindowPanes,
        plain_state,
        restored_state,
    )

    state = DefaultTriggerState()
    state[IntervalWindow(-5, 5)] = WindowPanes([1, "x"], [4_999_999], 1, 0, True)
    state[window.GlobalWindow()] = WindowPanes([None], [], 0, 0, False)
    restored = restored_state(plain_state(state))
    assert restored == state
    assert list(restored) == list(state)  # the order windows came in
    # Keys share one window object per window.
    again = restored_state(plain_state(state))
    assert next(iter(again)) is next(iter(restored))


class MemoryChunks:
    """A ``ChunkStore`` in memory, as ``chunk_lists.ListStateChunks`` keeps it in Spark's
    list state; it counts the chunks written and read."""

    def __init__(self) -> None:
        self.chunks: list[tuple[bytes, bytes]] = []
        self.appended = self.taken = 0

    def append(self, chunks: list[tuple[bytes, bytes]]) -> None:
        self.appended += len(chunks)
        self.chunks.extend(chunks)

    def take(self, tags: set[bytes]) -> dict[bytes, list[bytes]]:
        taken: dict[bytes, list[bytes]] = {}
        kept = []
        for tag, chunk in self.chunks:
            if tag in tags:
                taken.setdefault(tag, []).append(chunk)
            else:
                kept.append((tag, chunk))
        self.chunks = kept
        self.taken += sum(len(c) for c in taken.values())
        return taken


def test_a_windows_values_wait_in_the_chunk_store_until_it_fires() -> None:
    """An hour's window: each batch appends its values once, the shard's value does not
    grow with them, and the batch that fires the window reads them back, in order."""
    chunks = MemoryChunks()
    shard = _Shard(beam.WindowInto(window.FixedWindows(3600)), store=True, chunks=chunks)
    hour = IntervalWindow(0, 3600)
    sizes = []
    for n in range(6):
        values = [(f"k{i % 3}", n * 100 + i, n * 60 + i, hour) for i in range(50)]
        panes, _ = shard.batch(values, watermark=n * 60)
        assert panes == []
        assert shard.state is not None
        sizes.append(len(grouping.encode_shard_state(shard.state)))
    assert chunks.appended == 6 and chunks.taken == 0
    assert len(chunks.chunks) == 6
    # The value holds the window's end and earliest hold, no key (its watermarks grow a
    # few bytes): 300 values and 3 keys would be well over a kilobyte.
    assert max(sizes) < sizes[0] + 32 < 400
    assert shard.state.blobs == {} and list(shard.state.buffered.values()) == [
        (3600 * SECOND, 3600 * SECOND - 1)
    ]
    panes, out = shard.batch([("k0", -1, 3599, hour)], watermark=3600)
    assert chunks.taken == 6 and chunks.chunks == []
    by_key = {p.value[0]: list(p.value[1]) for p in panes}
    assert by_key["k0"] == [n * 100 + i for n in range(6) for i in range(0, 50, 3)] + [-1]
    assert by_key["k1"] == [n * 100 + i for n in range(6) for i in range(1, 50, 3)]
    assert {p.pane_info.timing for p in panes} == {PaneInfoTiming.ON_TIME}
    assert out == 3600 * SECOND
    assert shard.state.buffered == {}
    # Past its garbage-collection time: the keys are forgotten.
    assert shard.batch([], watermark=3601) == ([], 3601 * SECOND)
    assert shard.state.blobs == {}


def test_new_keys_of_windows_before_their_end_never_enter_the_shard() -> None:
    """Values of keys the shard does not hold, for a window before its end, go to the
    chunk store without a key state; the window that expires as it fires gives its panes
    without them: neither batch's change log names a key."""
    import pickle

    chunks = MemoryChunks()
    shard = _Shard(beam.WindowInto(window.FixedWindows(10)), store=True, chunks=chunks)
    w = IntervalWindow(0, 10)
    panes, out = shard.batch([(f"k{i}", i, 1 + i % 5, w) for i in range(20)], watermark=0)
    assert panes == [] and out == 0
    assert shard.state is not None and shard.state.blobs == {}
    assert len(chunks.chunks) == 1 and list(shard.state.buffered.values()) == [
        (10 * SECOND, 10 * SECOND - 1)
    ]
    assert pickle.loads(grouping.shard_changes(shard.state))[3:] == ([], [])
    panes, out = shard.batch([("k0", 20, 9, w), ("new", 21, 9, w)], watermark=11)
    assert sorted(_values(panes)) == sorted(
        [(f"k{i}", [i, 20] if i == 0 else [i], w) for i in range(20)] + [("new", [21], w)]
    )
    assert {p.pane_info.timing for p in panes} == {PaneInfoTiming.ON_TIME}
    assert {p.timestamp for p in panes} == {Timestamp(9.999)}  # in the coder's milliseconds
    assert out == 11 * SECOND
    assert shard.state.blobs == {} and shard.state.buffered == {} and chunks.chunks == []
    assert pickle.loads(grouping.shard_changes(shard.state))[3:] == ([], [])


def test_a_new_key_whose_window_fires_within_its_lateness_enters_the_shard() -> None:
    """With allowed lateness the fired window stays, for its late panes: the key is kept."""
    shard = _Shard(
        beam.WindowInto(window.FixedWindows(10), allowed_lateness=30),
        store=True,
        chunks=MemoryChunks(),
    )
    w = IntervalWindow(0, 10)
    assert shard.batch([(1, 1, w)], watermark=0)[0] == []
    assert shard.state is not None and shard.state.blobs == {}
    panes, _ = shard.batch([], watermark=11)
    assert [p.pane_info.timing for p in panes] == [PaneInfoTiming.ON_TIME]
    assert list(shard.state.blobs) == [b"k"]
    panes, _ = shard.batch([(2, 5, w)], watermark=12)
    assert [(p.pane_info.timing, p.pane_info.index) for p in panes] == [(PaneInfoTiming.LATE, 1)]


def test_buffered_values_give_the_panes_of_values_kept_in_the_keys() -> None:
    """Sliding windows, accumulating, with allowed lateness: late panes of a window whose
    on-time values came back from the store hold them too."""
    windowing = beam.WindowInto(
        window.SlidingWindows(10, 5),
        allowed_lateness=20,
        accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
    )
    kept, buffered = (
        _Shard(windowing, store=True),
        _Shard(windowing, store=True, chunks=MemoryChunks()),
    )
    for shard in (kept, buffered):
        assert shard.grouper.buffers
    w = window.SlidingWindows(10, 5)
    batches = [
        ([(1, 1), (2, 6)], 2),
        ([(3, 7), (4, 3)], 4),
        ([(5, 8)], 11),  # fires [-5, 5) and [0, 10)
        ([(6, 2), (7, 12)], 16),  # 6 late into [0, 10); fires [5, 15)
        ([], 40),
    ]
    for values, watermark in batches:
        elements = [
            ("k", v, t, win)
            for v, t in values
            for win in w.assign(window.WindowFn.AssignContext(Timestamp(t)))
        ]
        expected = kept.batch(elements, watermark)
        got = buffered.batch(elements, watermark)
        assert [(p.value, p.timestamp, p.windows, p.pane_info) for p in got[0]] == [
            (p.value, p.timestamp, p.windows, p.pane_info) for p in expected[0]
        ]
        assert got[1] == expected[1]
    assert buffered.chunks is not None and buffered.chunks.chunks == []  # type: ignore[attr-defined]


def test_sessions_keep_their_values_in_the_keys() -> None:
    chunks = MemoryChunks()
    shard = _Shard(beam.WindowInto(window.Sessions(10)), chunks=chunks)
    assert not shard.grouper.buffers
    shard.batch([(1, 1, IntervalWindow(1, 11))], watermark=0)
    assert chunks.chunks == []


def test_a_shard_written_before_the_chunk_store_is_read() -> None:
    """A checkpoint of the layout before: its values in its keys' states, no buffered
    windows. They come before the values buffered after it."""
    import pickle

    shard = _Shard(beam.WindowInto(window.FixedWindows(10)), store=True)
    w = IntervalWindow(0, 10)
    shard.batch([(1, 1, w)], watermark=5)
    assert shard.state is not None
    encoded = grouping.encode_shard_state(shard.state)
    layout, *fields, buffered = pickle.loads(encoded)
    assert buffered == {}
    shard.state = grouping.decode_shard_state(pickle.dumps((layout, *fields)))
    shard.chunks = MemoryChunks()
    assert _values(shard.batch([(2, 2, w)], watermark=6)[0]) == []
    assert shard.chunks.chunks  # type: ignore[attr-defined]
    panes, _ = shard.batch([(3, 3, w)], watermark=12)
    assert [list(p.value[1]) for p in panes] == [[1, 2, 3]]


class _Unscanned(dict):  # type: ignore[type-arg]
    """Visits that must not be looked through."""

    def items(self) -> Any:
        raise AssertionError("every key's visit was looked at")


def test_a_batch_before_every_keys_visit_looks_at_no_key() -> None:
    from beam_spark_runner.execution.default_trigger import DefaultTriggerState
    from beam_spark_runner.streaming.watermarks import WatermarkState

    shard = grouping.ShardState(WatermarkState(expected=frozenset()))
    for name, visit in (("a", 100), ("b", 200)):
        key_bytes = name.encode()
        shard.blobs[key_bytes] = grouping._encode_key(
            grouping.KeyState(name, DefaultTriggerState())
        )
        shard.visits[key_bytes] = visit
    shard.load_due(50)  # decoded from the store: its earliest visit not known yet
    assert shard.keys == {} and shard.earliest_visit == 100
    shard.visits = _Unscanned(shard.visits)
    shard.load_due(99)
    shard.visits = dict(shard.visits)
    shard.load_due(150)
    assert list(shard.keys) == [b"a"] and shard.earliest_visit == 200
    shard.set_visit(b"a", 120)  # settled at the end of the batch
    assert shard.earliest_visit == 120


def test_the_least_hold_is_kept_as_holds_change_and_looked_up_only_when_it_left() -> None:
    from beam_spark_runner.streaming.watermarks import WatermarkState

    shard = grouping.ShardState(WatermarkState(expected=frozenset()))
    shard.holds = {b"a": 30, b"b": 10, b"c": 20}  # decoded: its least not known yet
    assert shard.earliest_hold(99) == 10
    shard.holds = _NoLookup(shard.holds)
    shard.set_hold(b"c", 5)
    assert shard.earliest_hold(99) == 5
    shard.set_hold(b"a", 40)
    assert shard.earliest_hold(99) == 5
    shard.set_hold(b"c", None)  # the least left: looked up again
    shard.holds = dict(shard.holds)
    assert shard.earliest_hold(99) == 10
    shard.set_hold(b"b", 50)
    shard.set_hold(b"a", None)
    assert shard.earliest_hold(99) == 50
    shard.set_hold(b"b", None)
    assert shard.earliest_hold(99) == 99


class _NoLookup(dict):  # type: ignore[type-arg]
    """Holds whose least must not be looked up."""

    def values(self) -> Any:
        raise AssertionError("every key's hold was looked at")


def test_keys_with_the_same_visit_and_hold_share_one_object_of_each() -> None:
    """Millions of keys in the global window share a visit and a hold: one int each, not
    32 bytes a key for each, when settled and when read back from the store."""
    shard = _Shard(
        beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(100)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
    )
    g = window.GlobalWindow()
    shard.batch([(f"k{i}", i, 1, g) for i in range(50)], watermark=0)
    assert shard.state is not None
    for state in (
        shard.state,
        grouping.decode_shard_state(grouping.encode_shard_state(shard.state)),
    ):
        assert len(state.visits) == len(state.holds) == 50
        assert len({id(v) for v in state.visits.values()}) == 1
        assert len({id(h) for h in state.holds.values()}) == 1


def test_a_change_log_writes_the_removed_keys_sorted() -> None:
    """Not in their set's order, which the hash seed decides: the bytes a batch logs are the
    same in every worker process."""
    import pickle

    from beam_spark_runner.streaming.watermarks import WatermarkState

    removed = {f"key{i}".encode() for i in range(50)}
    shard = grouping.ShardState(WatermarkState(frozenset({"src"})), removed=set(removed))
    assert pickle.loads(grouping.shard_changes(shard))[3] == sorted(removed)
