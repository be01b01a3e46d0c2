"""Stateful DoFns reading streamed side inputs: Beam's slowly-updating pattern, stateful."""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate, window
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner.coders import KeyExtractor
from beam_spark_runner.execution.bundle_outputs import BundleOutputs
from beam_spark_runner.execution.stage_spec import OutputSpec
from beam_spark_runner.execution.stage_worker import NO_SINKS
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.streaming.rows import (
    ROUTED_SCHEMA,
    packed,
)
from beam_spark_runner.streaming.shard_run import routed_outputs
from beam_spark_runner.streaming.topology import STAGE, Node, Topology
from tests import slowly_updating

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip(
        "streaming runs need PySpark 3.5+; this is older",
        allow_module_level=True,
    )

from beam_spark_runner.streaming import state_cache  # noqa: E402
from beam_spark_runner.streaming.stateful_side_inputs import StatefulSideInputShard  # noqa: E402
from tests.streaming.memory_state import MemoryList as _List  # noqa: E402
from tests.streaming.memory_state import MemoryValue as _Value  # noqa: E402
from tests.streaming.test_side_inputs import MemoryWaitingStore, side_rows, side_stage  # noqa: E402


class _CountedRead(beam.DoFn):  # type: ignore[misc]
    """A stateful DoFn reading the side input: each element, the side value and its count."""

    SEEN = userstate.BagStateSpec("seen", VarIntCoder())

    def process(
        self, kv: tuple[str, float], side: float, seen: Any = beam.DoFn.StateParam(SEEN)
    ) -> Any:
        seen.add(1)
        yield kv[1], side


@pytest.mark.spark
@pytest.mark.slow
def test_a_stateful_dofn_reads_the_slowly_updating_side_input_as_it_streams(
    tmp_path: Path,
) -> None:
    start, end, records = slowly_updating.run(
        tmp_path,
        slowly_updating.windowed_side,
        lambda main, view: main | beam.Map(lambda at: ("k", at)) | beam.ParDo(_CountedRead(), view),
    )
    window_of = slowly_updating.WINDOW
    assert [(m, s) for m, s, _ in records] == [
        (float(t), float(t // window_of * window_of)) for t in range(int(start), int(end))
    ]
    first_window = [at for m, _, at in records if m < start + window_of]
    assert max(first_window) < end, "the first window was written only after the source ended"


_SEEN: list[tuple[str, float, float]] = []


class _ReadThenTimer(beam.DoFn):  # type: ignore[misc]
    """Records each element with the side value it read, and a timer at its window's end."""

    SEEN = userstate.BagStateSpec("seen", VarIntCoder())
    END = userstate.TimerSpec("end", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        kv: tuple[str, float],
        side: float,
        seen: Any = beam.DoFn.StateParam(SEEN),
        end: Any = beam.DoFn.TimerParam(END),
        w: Any = beam.DoFn.WindowParam,
    ) -> Any:
        seen.add(1)
        end.set(w.end)
        _SEEN.append(("element", kv[1], side))
        yield kv[1]

    @userstate.on_timer(END)
    def on_end(self, seen: Any = beam.DoFn.StateParam(SEEN)) -> Any:
        _SEEN.append(("timer", float(sum(seen.read())), 0.0))
        yield -1.0


def _shard_and_coders() -> tuple[Any, ...]:
    """A shard of ``_ReadThenTimer`` reading a fixed-windowed side input, run in-process."""
    return side_stage(
        lambda main, side: (
            main | beam.Map(lambda at: ("k", at)) | beam.ParDo(_ReadThenTimer(), side)
        ),
        window.FixedWindows(5),
        stateful=True,
    )


def test_elements_wait_for_their_side_window_and_timers_wait_behind_them() -> None:
    spec, node, topology, main, side, _ = _shard_and_coders()
    store = MemoryWaitingStore()
    _SEEN.clear()

    def batch(previous: bytes | None, *args: Any) -> tuple[bytes, int]:
        shard = StatefulSideInputShard(spec, NO_SINKS, store)
        encoded, rows = shard.run_encoded(topology, node, 0, previous, side_rows(main, side, *args))
        return encoded, next(r[5] for r in rows if r[5] is not None)

    # The side input has not reached the end of [0, 5): the elements wait, holding the
    # output watermark at the earliest; nothing runs.
    state, output = batch(None, [1, 3], [], {"main": 20, "side": 2})
    assert _SEEN == []
    assert output == 1_000_000
    # Its window's element comes and its watermark passes the window: they run with it.
    # Their timer at the window's end waits behind the element of [5, 10) still waiting
    # (at 5 s), which holds the output watermark too.
    state, output = batch(state, [5], [0], {"main": 20, "side": 5})
    assert _SEEN == [("element", 1.0, 0.0), ("element", 3.0, 0.0)]
    assert output == 4_999_999
    _SEEN.clear()
    state, output = batch(state, [], [5], {"main": 20, "side": 10})
    assert _SEEN == [("element", 5.0, 5.0), ("timer", 2.0, 0.0), ("timer", 1.0, 0.0)]
    assert output == 20_000_000


@pytest.mark.parametrize("workers", [1, 2])
def test_a_logged_shard_runs_as_on_the_whole_value(workers: int) -> None:
    """Through ``state_cache`` (each batch in the next of ``workers`` caches), then read back."""
    spec, node, topology, main, side, _ = _shard_and_coders()
    store, value, log = MemoryWaitingStore(), _Value(), _List()
    key = (uuid.uuid4().hex, node.index, 0)
    caches: list[Any] = [None] * workers
    script = [
        ([1, 3], [], {"main": 20, "side": 2}),
        ([5], [0], {"main": 20, "side": 5}),
        ([], [5], {"main": 20, "side": 10}),
    ]
    outputs = []
    _SEEN.clear()
    for number, args in enumerate(script):
        state_cache._CACHE.pop(key, None)
        if caches[number % workers] is not None:
            state_cache._CACHE[key] = caches[number % workers]
        shard = StatefulSideInputShard(spec, NO_SINKS, store)
        rows = state_cache.run_logged(
            shard, shard, value, log, key, topology, node, side_rows(main, side, *args)
        )
        caches[number % workers] = state_cache._CACHE[key]
        outputs.append(next(r[5] for r in rows if r[5] is not None))
    assert outputs == [1_000_000, 4_999_999, 20_000_000]
    assert _SEEN == [
        ("element", 1.0, 0.0),
        ("element", 3.0, 0.0),
        ("element", 5.0, 5.0),
        ("timer", 2.0, 0.0),
        ("timer", 1.0, 0.0),
    ]
    shard = StatefulSideInputShard(spec, NO_SINKS, store)
    read_back = state_cache._reload(shard, shard, log, key)
    cached = state_cache._CACHE[key].state
    assert shard.encode(read_back) == shard.encode(cached)


class _SidesWholeShard(StatefulSideInputShard):
    """The shard as the layout before wrote its changes: side inputs and buckets whole."""

    def changes(self, state: Any) -> bytes:
        side = (state.sides, state.buckets, state.waiting, state.fired, state.ends)
        return pickle.dumps(
            ("beam-spark-stateful-side-input-changes-v2", side, self.user_changes(state))
        )


def test_a_log_whose_changes_hold_side_inputs_whole_replays(monkeypatch: Any) -> None:
    """A base, two changes logged by the layout before, two by this; read back, as the value
    rewritten whole."""
    monkeypatch.setattr(state_cache, "COMPACT_FRACTION", 100.0)
    spec, node, topology, main, side, _ = _shard_and_coders()
    script = [
        ([1, 3], [], {"main": 20, "side": 2}),
        ([5], [0], {"main": 20, "side": 5}),
        ([7], [], {"main": 20, "side": 7}),
        ([11], [5], {"main": 20, "side": 10}),
        ([], [10], {"main": 20, "side": 15}),
    ]
    whole_store, whole = MemoryWaitingStore(), None
    for args in script:
        shard = StatefulSideInputShard(spec, NO_SINKS, whole_store)
        whole, _ = shard.run_encoded(topology, node, 0, whole, side_rows(main, side, *args))
    store, value, log = MemoryWaitingStore(), _Value(), _List()
    key = (uuid.uuid4().hex, node.index, 0)
    for number, args in enumerate(script):
        kind = _SidesWholeShard if number < 3 else StatefulSideInputShard
        shard = kind(spec, NO_SINKS, store)
        state_cache.run_logged(
            shard, shard, value, log, key, topology, node, side_rows(main, side, *args)
        )
    assert sum(row[0][:1] == b"C" for row in log.rows) == 4
    shard = StatefulSideInputShard(spec, NO_SINKS, store)
    read_back = state_cache._reload(shard, shard, log, key)
    assert whole is not None
    assert shard.encode(read_back) == shard.encode(shard.decode(whole))


class _KeyingWorker:
    """What ``routed_outputs`` reads of a stage worker whose output a stateful stage reads."""

    def __init__(self, coder: Any) -> None:
        self.key_extractors = {0: KeyExtractor(coder)}


def test_a_keys_elements_of_two_windows_in_one_bundle_each_wait_for_their_side_window() -> None:
    # An unbounded source catching up emits ticks 4 and 5 in one bundle; its output is keyed
    # (its reader is stateful). The side input is ready for [0, 5) only: the tick of [5, 10)
    # waits for its own side window rather than run with the tick of [0, 5).
    spec, node, _, main, side, main_coder = _shard_and_coders()
    reader = dataclasses.replace(node, index=1)
    producer = Node(index=0, name="producer", kind=STAGE, stateful=True, step=1, targets=((1,),))
    topology = Topology(
        nodes=(producer, reader), roots={}, levels=2, shards=1, sink_producers=frozenset()
    )
    ticks = [
        main.encode_nested(
            WindowedValue(
                ("k", float(t)), Timestamp(t), [IntervalWindow(t // 5 * 5, t // 5 * 5 + 5)]
            )
        )
        for t in (4, 5)
    ]
    bundle = BundleOutputs(1)
    bundle.data[0].append((b"".join(ticks), list(itertools.accumulate(map(len, ticks)))))
    producer_spec: Any = SimpleNamespace(outputs=(OutputSpec("producer-out", "main-coder"),))
    routed = routed_outputs(topology, producer, producer_spec, _KeyingWorker(main_coder), [bundle])
    main_rows = [
        dict(zip(ROUTED_SCHEMA.names, row, strict=True)) for row in packed(routed, topology)
    ]
    _SEEN.clear()
    shard = StatefulSideInputShard(spec, NO_SINKS, MemoryWaitingStore())
    state, _ = shard.run(
        topology,
        reader,
        0,
        None,
        [*main_rows, *side_rows(main, side, [], [0], {"main": 6, "side": 5})],
    )
    assert _SEEN == [("element", 4.0, 0.0)]
    assert [bucket[1] for bucket in state.buckets.values()] == [5_000_000]


def test_a_long_run_of_expiring_windows_keeps_the_state_value_flat() -> None:
    spec, node, topology, main, side, _ = side_stage(
        lambda main, side: (
            main | beam.Map(lambda at: ("k", at)) | beam.ParDo(_ReadThenTimer(), side)
        ),
        window.FixedWindows(10),
        stateful=True,
    )
    store = MemoryWaitingStore()
    value: bytes | None = None
    sizes = []
    _SEEN.clear()
    # A window of 10 s per batch: its side value and two main elements; the side input's
    # watermark past its end, the main input's past the end of the window before.
    for batch in range(40):
        at = batch * 10
        rows = side_rows(main, side, [at + 1, at + 2], [at], {"main": at, "side": at + 10}, 10)
        shard = StatefulSideInputShard(spec, NO_SINKS, store)
        value, _ = shard.run_encoded(topology, node, 0, value, rows)
        sizes.append(len(value))
    elements = [(e, m, s) for e, m, s in _SEEN if e == "element"]
    assert elements == [
        ("element", float(t), float(t // 10 * 10))
        for b in range(40)
        for t in (b * 10 + 1, b * 10 + 2)
    ]
    assert [e for e in _SEEN if e[0] == "timer"] == [("timer", 2.0, 0.0)] * 39
    # Kept: the open window's side value, user state and timer.
    assert max(sizes[2:]) - min(sizes[2:]) <= 8, sizes
    state = StatefulSideInputShard(spec, NO_SINKS, store).decode(value)
    assert [len(chunks) for chunks in state.sides] == [1]
