"""A stateful DoFn's shard in a streaming run (``streaming.stateful``), in-process, no Spark.

The shard runs micro-batch after micro-batch on its encoded state, as a level runs it: a
window's user state and pending timers go once the window expires (``window_expiry``),
after the timers due by then have fired.
"""

from __future__ import annotations

import itertools
import os
import pickle
import uuid
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, userstate, util, window
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import NO_SINKS, StageSpec
from beam_spark_runner.planning import build_plan
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.streaming import state_cache
from beam_spark_runner.streaming.compression import pack
from beam_spark_runner.streaming.rows import ELEMENT, PRODUCER, PTIME, WATERMARK
from beam_spark_runner.streaming.stateful import StatefulShard, StatefulShardState
from beam_spark_runner.streaming.watermarks import MAX_MICROS, WatermarkState
from beam_spark_runner.streaming.window_expiry import WindowExpiry, window_expiry
from tests.conftest import SPARK_TEST_MASTER
from tests.stage_specs import one_stage_topology, stage_spec
from tests.streaming.memory_state import MemoryList as _List
from tests.streaming.memory_state import MemoryValue as _Value

_SOURCE = "source"
_FIRED: list[tuple[str, int, int]] = []


class _SumAtWindowEnd(beam.DoFn):  # type: ignore[misc]
    """Keeps a key's values per window and records their sum at the window's end.

    It never clears its state, and each element also sets a processing-time timer that the
    stream reaches only at its end (recorded as -1): left alone, both would stay in the
    shard's state until then.
    """

    VALUES = userstate.BagStateSpec("values", VarIntCoder())
    END = userstate.TimerSpec("end", userstate.TimeDomain.WATERMARK)
    NEVER = userstate.TimerSpec("never", userstate.TimeDomain.REAL_TIME)

    def process(
        self,
        kv: Any,
        w: Any = beam.DoFn.WindowParam,
        values: Any = beam.DoFn.StateParam(VALUES),
        end: Any = beam.DoFn.TimerParam(END),
        never: Any = beam.DoFn.TimerParam(NEVER),
    ) -> None:
        values.add(kv[1])
        end.set(w.max_timestamp())
        never.set(Timestamp(10**9))

    @userstate.on_timer(END)
    def on_end(
        self,
        key: Any = beam.DoFn.KeyParam,
        w: Any = beam.DoFn.WindowParam,
        values: Any = beam.DoFn.StateParam(VALUES),
    ) -> None:
        _FIRED.append((key, int(w.start), sum(values.read())))

    @userstate.on_timer(NEVER)
    def on_never(self, key: Any = beam.DoFn.KeyParam, w: Any = beam.DoFn.WindowParam) -> None:
        _FIRED.append((key, int(w.start), -1))


def _spec(allowed_lateness: int, windows: Any = None) -> StageSpec:
    p = beam.Pipeline()
    _ = (
        p
        | beam.Impulse()
        | beam.Map(lambda _: ("k", 1))
        | beam.WindowInto(windows or window.FixedWindows(10), allowed_lateness=allowed_lateness)
        | "Sum" >> beam.ParDo(_SumAtWindowEnd())
    )
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()), streaming=True)
    (stage,) = [s for s in plan.stages if any("Sum" in n for n in s.user_transform_names)]
    return stage_spec(plan, stage, f"stateful-expiry-{allowed_lateness}")


def _encoder(spec: StageSpec) -> Any:
    descriptor = bi.beam_fn_api_pb2.ProcessBundleDescriptor.FromString(spec.descriptor)
    port = bi.remote_grpc_port(descriptor.transforms[spec.input_transform_id].spec.payload)
    return bi.PipelineContext(descriptor).coders[port.coder_id].get_impl()


class _Run:
    """The shard's micro-batches, each on the state value the last one wrote."""

    def __init__(self, allowed_lateness: int = 0) -> None:
        self.spec = _spec(allowed_lateness)
        self.topology = one_stage_topology(self.spec, _SOURCE)
        self.encoder = _encoder(self.spec)
        self.value: bytes | None = None

    def _rows(self, elements: list[tuple[str, int, int]], watermark: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for key, value, at in elements:
            start = at - at % 10
            encoded = self.encoder.encode_nested(
                WindowedValue(
                    (key, value), Timestamp(at), [window.IntervalWindow(start, start + 10)]
                )
            )
            rows.append({ELEMENT: pack(encoded)})
        micros = MAX_MICROS if watermark >= MAX_MICROS else watermark * 1_000_000
        rows.append({ELEMENT: None, PRODUCER: _SOURCE, WATERMARK: micros, PTIME: 0})
        return rows

    def batch(self, elements: list[tuple[str, int, int]], watermark: int) -> int:
        """Runs one batch: (key, value, timestamp in s) elements, then the watermark (s)."""
        shard = StatefulShard(self.spec, NO_SINKS)
        self.value, _ = shard.run_encoded(
            self.topology, self.topology.nodes[0], 0, self.value, self._rows(elements, watermark)
        )
        return len(self.value)

    @property
    def state(self) -> StatefulShardState:
        assert self.value is not None
        return StatefulShardState.decode(self.value)

    def cells(self) -> int:
        """How many user-state cells the state value holds."""
        user_state = self.state.user_state
        return len(user_state[0]) if user_state else 0

    def timers(self) -> int:
        """How many pending timers the state value holds."""
        pending = StatefulShard(self.spec, NO_SINKS).pending
        for family, encoded in self.state.timers.items():
            pending.add_written(family, encoded)
        return len(pending)


def test_expired_windows_leave_the_state_value_and_its_size_stays_flat() -> None:
    _FIRED.clear()
    run = _Run()
    sizes = []
    # A window of 10 s per batch, each with three keys' elements; the watermark closes the
    # window of the batch before.
    for batch in range(40):
        at = batch * 10
        elements = [(key, batch, at + 1) for key in "abc"]
        sizes.append(run.batch(elements, watermark=at))
    assert sorted(_FIRED) == sorted((key, b * 10, b) for b in range(39) for key in "abc")
    _FIRED.clear()
    # Left: the open window's bags and two timers per key, and the bags and never-reached
    # timers of the window the watermark reached the end of (it expires once past it).
    assert (run.cells(), run.timers()) == (6, 9)
    assert max(sizes[2:]) - min(sizes[2:]) <= 8, sizes
    run.batch([], watermark=MAX_MICROS)
    assert (run.cells(), run.timers()) == (0, 0)
    # At +inf, the last window's timer and the processing-time timers of the two windows
    # that had not expired.
    ends = [(key, 390, 39) for key in "abc"]
    never = [(key, start, -1) for key in "abc" for start in (380, 390)]
    assert sorted(_FIRED) == sorted(ends + never)


def test_timers_due_by_the_expiry_fire_before_the_state_goes() -> None:
    _FIRED.clear()
    run = _Run(allowed_lateness=5)
    run.batch([("a", 1, 1), ("a", 2, 2)], watermark=0)
    # The watermark jumps past the window's end and its allowed lateness at once: the timer
    # at the window's end fires on the state before the state is dropped.
    run.batch([], watermark=100)
    assert _FIRED == [("a", 0, 3)]
    assert (run.cells(), run.timers()) == (0, 0)


def test_a_window_within_its_allowed_lateness_keeps_its_state() -> None:
    _FIRED.clear()
    run = _Run(allowed_lateness=5)
    run.batch([("a", 1, 1)], watermark=0)
    run.batch([], watermark=12)  # past the end (10), not past the end plus lateness (15)
    assert _FIRED == [("a", 0, 1)]
    # A late element still sees the window's state, and fires again on all of it.
    run.batch([("a", 2, 3)], watermark=14)
    assert _FIRED == [("a", 0, 1), ("a", 0, 3)]
    assert (run.cells(), run.timers()) == (1, 1)  # its bag and its processing-time timer
    run.batch([], watermark=16)
    assert (run.cells(), run.timers()) == (0, 0)


def test_an_element_of_an_expired_window_is_dropped() -> None:
    _FIRED.clear()
    run = _Run(allowed_lateness=5)
    run.batch([("a", 1, 1)], watermark=16)
    assert (run.cells(), run.timers()) == (0, 0)
    # Window [0, 10) expired at 15: dropped as Beam's StatefulDoFnRunner drops it, rather
    # than run on a state that is gone; window [10, 20) is within its lateness.
    run.batch([("a", 2, 3), ("b", 4, 14)], watermark=30)
    assert _FIRED == [("a", 0, 1), ("b", 10, 4)]
    assert (run.cells(), run.timers()) == (0, 0)


def test_an_element_keeps_only_its_windows_that_have_not_expired() -> None:
    spec = _spec(0, window.SlidingWindows(10, 5))
    expiry = window_expiry(spec.descriptor, spec.input_transform_id)
    encoder = _encoder(spec)
    windows = (window.IntervalWindow(0, 10), window.IntervalWindow(5, 15))
    element = WindowedValue(("k", 1), Timestamp(7), windows)
    data = encoder.encode_nested(element) + encoder.encode_nested(element)
    assert expiry.on_time(data, watermark=10_000_000) == data  # [0, 10) expires past 10 s
    kept = expiry.on_time(data, watermark=12_000_000)
    assert [v.windows for v in encoder.decode_all(kept)] == [windows[1:], windows[1:]]
    assert expiry.on_time(data, watermark=16_000_000) == b""


class _SumPerWindow(beam.DoFn):  # type: ignore[misc]
    """Emits, at each window's end, the key, the window's start and its values' sum."""

    VALUES = userstate.BagStateSpec("values", VarIntCoder())
    END = userstate.TimerSpec("end", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        kv: Any,
        w: Any = beam.DoFn.WindowParam,
        values: Any = beam.DoFn.StateParam(VALUES),
        end: Any = beam.DoFn.TimerParam(END),
    ) -> None:
        values.add(kv[1])
        end.set(w.max_timestamp())

    @userstate.on_timer(END)
    def on_end(
        self,
        key: Any = beam.DoFn.KeyParam,
        w: Any = beam.DoFn.WindowParam,
        values: Any = beam.DoFn.StateParam(VALUES),
    ) -> Any:
        yield key, int(w.start), sorted(values.read())


def _expiring_windows(pipeline: beam.Pipeline) -> Any:
    coder = beam.coders.TupleCoder([beam.coders.StrUtf8Coder(), VarIntCoder()])
    stream = ScriptedStream(coder=coder)
    for batch in range(6):
        at = batch * 10
        stream.add_elements([TimestampedValue((key, batch), at + 1) for key in "ab"])
        stream.advance_watermark_to(at + 12)
        # Late, within the allowed lateness: the window fires again on all its state.
        stream.add_elements([TimestampedValue(("a", 100 + batch), at + 3)])
    return (
        pipeline
        | stream.advance_watermark_to_infinity()
        | beam.WindowInto(window.FixedWindows(10), allowed_lateness=6)
        | beam.ParDo(_SumPerWindow())
    )


_COLLECTED: list[Any] = []


def _collect(element: Any) -> None:
    _COLLECTED.append(element)


@pytest.mark.spark
@pytest.mark.skipif(
    pyspark_version() < OLDEST_STREAMING_SPARK, reason="streaming runs need PySpark 3.5+"
)
def test_a_stateful_dofn_over_expiring_windows_gives_direct_runners_output() -> None:
    options = PipelineOptions(["--runner=DirectRunner", "--streaming"])
    _COLLECTED.clear()
    with beam.Pipeline(options=options) as pipeline:
        _ = _expiring_windows(pipeline) | beam.Map(_collect)
    expected = list(_COLLECTED)
    # Late values within the lateness fire the window again on its whole state.
    assert ("a", 0, [0, 100]) in expected and len(expected) == 18, expected
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    assert_that(_expiring_windows(pipeline), equal_to(expected))
    assert pipeline.run().wait_until_finish() == PipelineState.DONE


def _batch_sizes(pipeline: beam.Pipeline) -> Any:
    # Beam's util_test.test_stateful_buffering_timer_in_global_window_streaming: one element
    # and 5 s of processing time, ten times; the buffering timer (42 s on a clock stuck at
    # 0) flushes the first nine, the end of the input the last.
    start = Timestamp(0)
    stream = ScriptedStream().advance_watermark_to(start)
    for i in range(10):
        stream.add_elements([TimestampedValue(i, start + i)]).advance_processing_time(5)
    stream.advance_watermark_to(start + 11).advance_watermark_to_infinity()
    return (
        pipeline
        | stream
        | beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        | util.BatchElements(
            min_batch_size=20,
            max_batch_size=20,
            max_batch_duration_secs=42,
            clock=_StoppedClock(),
        )
        | beam.Map(len)
    )


class _StoppedClock:
    """Beam's ``FakeClock`` at 0: a clock that never moves."""

    def __call__(self) -> Timestamp:
        return Timestamp(0)


@pytest.mark.spark
@pytest.mark.skipif(
    pyspark_version() < OLDEST_STREAMING_SPARK, reason="streaming runs need PySpark 3.5+"
)
def test_batch_elements_with_a_buffering_timer_gives_direct_runners_batches() -> None:
    # Beam keys the batches by process; Spark's tasks run in pooled processes, so the
    # batches followed whichever process ran each micro-batch's keying.
    options = PipelineOptions(["--runner=DirectRunner", "--streaming"])
    _COLLECTED.clear()
    with beam.Pipeline(options=options) as pipeline:
        _ = _batch_sizes(pipeline) | beam.Map(_collect)
    assert sorted(_COLLECTED) == [1, 9]
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    assert_that(_batch_sizes(pipeline), equal_to([9, 1]))
    assert pipeline.run().wait_until_finish() == PipelineState.DONE


class _LoggedRun(_Run):
    """The shard's micro-batches through ``state_cache.run_logged``, as a level runs them.

    Its batches go round ``workers`` worker processes, each with its own cache, as Spark
    hands a task whichever idle worker comes first.
    """

    def __init__(self, allowed_lateness: int = 0, workers: int = 1) -> None:
        super().__init__(allowed_lateness)
        self.store, self.log = _Value(), _List()
        self.key = (uuid.uuid4().hex, 0, 0)
        self.caches: list[Any] = [None] * workers
        self.batches = 0

    def batch(self, elements: list[tuple[str, int, int]], watermark: int) -> int:
        worker = self.batches % len(self.caches)
        self.batches += 1
        state_cache._CACHE.pop(self.key, None)
        if self.caches[worker] is not None:
            state_cache._CACHE[self.key] = self.caches[worker]
        shard = StatefulShard(self.spec, NO_SINKS)
        state_cache.run_logged(
            shard,
            shard,
            self.store,
            self.log,
            self.key,
            self.topology,
            self.topology.nodes[0],
            self._rows(elements, watermark),
        )
        self.caches[worker] = state_cache._CACHE[self.key]
        return sum(len(row[0]) for row in self.log.rows)

    def read_back(self) -> StatefulShardState:
        """The state as a new worker reads it from the store (base and log)."""
        shard = StatefulShard(self.spec, NO_SINKS)
        state = state_cache._reload(shard, shard, self.log, self.key)
        assert isinstance(state, StatefulShardState)
        return state

    @property
    def state(self) -> StatefulShardState:
        return self.caches[(self.batches - 1) % len(self.caches)].state  # type: ignore[no-any-return]


def _kept(state: StatefulShardState, spec: StageSpec) -> tuple[Any, ...]:
    """What a shard keeps: its cells, its pending timers, its watermarks."""
    pending = StatefulShard(spec, NO_SINKS).timers_of(state).held
    cells, ordered = state.user_state or ({}, {})
    return (
        dict(cells),
        dict(ordered),
        # Each family's in its order (what fires first among equals).
        sorted(((k, t.fire_timestamp) for k, t in pending.items()), key=lambda kt: kt[0][:2]),
        state.watermarks.input_watermark,
        state.watermarks.output_watermark,
    )


def _script() -> list[tuple[list[tuple[str, int, int]], int]]:
    """Batches of elements over windows that fire and expire, keys coming and going."""
    batches = []
    for batch in range(12):
        at = batch * 5
        keys = "abcde"[batch % 3 : batch % 3 + 3]
        batches.append(([(key, batch, at + 1) for key in keys], at))
    return [*batches, ([], MAX_MICROS)]


@pytest.mark.parametrize("workers", [1, 3])
def test_a_logged_shard_gives_the_outputs_and_state_of_the_whole_value(workers: int) -> None:
    _FIRED.clear()
    whole = _Run(allowed_lateness=3)
    states = []
    for elements, watermark in _script():
        whole.batch(elements, watermark)
        states.append(_kept(whole.state, whole.spec))
    expected, _FIRED[:] = list(_FIRED), []
    logged = _LoggedRun(allowed_lateness=3, workers=workers)
    for (elements, watermark), state in zip(_script(), states, strict=True):
        logged.batch(elements, watermark)
        assert _kept(logged.state, logged.spec) == state
        assert _kept(logged.read_back(), logged.spec) == state
    assert _FIRED == expected


def test_a_logged_batch_run_again_after_a_failed_attempt_reads_the_store() -> None:
    _FIRED.clear()
    run = _LoggedRun()
    run.batch([("a", 1, 1)], watermark=0)
    committed = (run.store.value, list(run.log.rows))
    run.batch([("a", 2, 2)], watermark=20)
    first = list(_FIRED)
    # Spark discards the attempt's writes; this process's cache holds the state after it.
    run.store.value, run.log.rows = committed
    reloads = state_cache.STATS.reloads
    run.batch([("a", 2, 2)], watermark=20)
    assert state_cache.STATS.reloads == reloads + 1
    assert _FIRED == first + first[-1:] == [("a", 0, 3), ("a", 0, 3)]


def test_a_logged_batch_writes_the_cells_it_used_not_every_key() -> None:
    run = _LoggedRun()
    run.batch([(f"k{i}", i, 1) for i in range(2000)], watermark=0)
    assert run.log.puts == 1 and run.log.appends == 0
    (base,) = run.log.rows
    hits = state_cache.STATS.hits
    for n in range(3):
        # At the timestamp it came with: its timers are set again as they were.
        run.batch([(f"k{n}", 1, 1)], watermark=0)
    assert state_cache.STATS.hits == hits + 3
    assert run.log.reads == 0 and run.log.puts == 1 and run.log.appends == 3
    # One key's cell each; the timers, unchanged, not written.
    assert max(len(row[0]) for row in run.log.rows[1:]) * 20 < len(base[0])
    header = run.store.value
    assert header is not None and len(header[0]) * 5 < len(base[0])


def test_a_value_written_whole_is_read_and_written_as_a_base() -> None:
    _FIRED.clear()
    whole = _Run()
    whole.batch([("a", 1, 1)], watermark=0)
    assert whole.value is not None
    run = _LoggedRun()
    run.store.value = (pack(whole.value),)
    run.batch([("a", 2, 2)], watermark=20)
    assert _FIRED == [("a", 0, 3)]
    assert run.log.puts == 1
    header = run.store.value
    assert header is not None and header[0].startswith(state_cache._HEADER)


def test_expiry_looks_at_the_cells_only_once_one_may_have_expired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = _LoggedRun()
    looked: list[int] = []
    scan = WindowExpiry.scan

    def counted(self: WindowExpiry, keys: Any, watermark: int) -> Any:
        keys = list(keys)
        looked.append(len(keys))
        return scan(self, keys, watermark)

    monkeypatch.setattr(WindowExpiry, "scan", counted)
    # 500 keys in window [100, 110), which expires past 110 s.
    run.batch([(f"k{i}", 1, 101) for i in range(500)], watermark=0)
    looked.clear()
    for watermark in range(10, 100, 10):
        run.batch([("k1", 1, 102)], watermark=watermark)
    assert max(looked) <= 1, looked  # the batch's own cell, not the shard's 500
    _FIRED.clear()
    run.batch([], watermark=120)
    assert len(_FIRED) == 500 and run.state.user_state == ({}, {})


def test_a_logged_batch_writes_the_timers_it_set_not_every_pending_timer() -> None:
    run = _LoggedRun()
    # Two pending timers a key: its window's end, and a processing-time one.
    run.batch([(f"k{i}", i, 1) for i in range(2000)], watermark=0)
    (base,) = run.log.rows
    # A key's element in the next window: two new timers, the others as they were.
    run.batch([("k7", 1, 11)], watermark=0)
    assert run.log.appends == 1
    assert len(run.log.rows[1][0]) * 20 < len(base[0])
    assert _kept(run.read_back(), run.spec) == _kept(run.state, run.spec)
    assert len(run.state.pending or {}) == 4002


# The changes of the layout before, which wrote every pending timer where one changed.
_TIMERS_WHOLE = "beam-spark-stateful-changes-v1"


def _old_log(states: list[StatefulShardState]) -> tuple[tuple[bytes], list[tuple[bytes]]]:
    """A header and log as the layout before wrote them: a base, then a change per state."""
    base = pack(states[0].encode())
    rows = [(state_cache._BASE + base,)]
    for before, after in itertools.pairwise(states):
        cells, ordered = after.user_state or ({}, {})
        timers = None if after.timers == before.timers else after.timers
        user = (after.watermarks, timers, after.next_expiry, (dict(cells), ordered), None)
        rows.append((state_cache._CHANGES + pack(pickle.dumps((_TIMERS_WHOLE, user))),))
    changes = sum(len(row[0]) - 1 for row in rows[1:])
    header = state_cache._Header(os.urandom(16), [], len(base), changes, len(rows) - 1)
    return (header.encode(),), rows


@pytest.mark.parametrize("workers", [1, 3])
def test_a_log_written_by_the_layout_before_replays(workers: int) -> None:
    """A log whose changes hold every pending timer (or none, unchanged) is read back and
    the batches after it give the outputs and state of the whole value."""
    _FIRED.clear()
    whole = _Run(allowed_lateness=3)
    # A batch that changes no timer: its change held none.
    script = _script()
    script.insert(3, ([], script[2][1]))
    states, fired, kept = [], [], []
    for elements, watermark in script:
        whole.batch(elements, watermark)
        states.append(whole.state)
        fired.append(list(_FIRED))
        kept.append(_kept(whole.state, whole.spec))
        _FIRED.clear()
    assert any(a.timers == b.timers for a, b in itertools.pairwise(states[:6]))
    run = _LoggedRun(allowed_lateness=3, workers=workers)
    (run.store.value, run.log.rows), run.batches = _old_log(states[:6]), 6
    reloads = state_cache.STATS.reloads
    for step in range(6, len(script)):
        run.batch(*script[step])
        assert (_FIRED, _kept(run.state, run.spec)) == (fired[step], kept[step])
        _FIRED.clear()
    assert state_cache.STATS.reloads >= reloads + 1
    assert _kept(run.read_back(), run.spec) == kept[-1]


def test_a_change_log_writes_the_cells_used_sorted() -> None:
    """Not in their set's order, which the hash seed decides: a replay adds new cells in the
    order written, and the bytes a batch logs are the same in every worker process."""
    shard = StatefulShard(_spec(0), NO_SINKS)
    cells = {f"cell{i}".encode(): [b"v"] for i in range(50)}
    shard.touched, shard.expired = set(list(cells)[:30]), set(list(cells)[30:])
    state = StatefulShardState(WatermarkState(frozenset({_SOURCE})), (cells, {}))
    changed = shard.user_changes(state)[4]
    assert [key for key, _, _ in changed] == sorted(cells)
