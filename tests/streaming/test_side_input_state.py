"""A stage with side inputs' shard state on ``state_cache``'s change log, without Spark.

Its changes replayed on the state as it was give the state a whole rewrite would; a shard
run through ``state_cache`` (several workers, a read-back) gives the outputs and state of
the value rewritten whole, writes per batch what it changed, and reads a value written
whole by the layout before.
"""

from __future__ import annotations

import copy
import pickle
import random
import uuid
from typing import Any

from apache_beam.transforms.window import GlobalWindow

from beam_spark_runner.execution.stage_worker import NO_SINKS
from beam_spark_runner.streaming import state_cache
from beam_spark_runner.streaming.compression import pack
from beam_spark_runner.streaming.side_input_state import SideInputShardState
from beam_spark_runner.streaming.side_inputs import SideInputShard
from beam_spark_runner.streaming.watermarks import Marker, WatermarkState
from tests.streaming import test_side_inputs as side_tests
from tests.streaming.memory_state import MemoryList as _List
from tests.streaming.memory_state import MemoryValue as _Value
from tests.streaming.test_side_inputs import MemoryWaitingStore, side_rows


def _random_batch(state: SideInputShardState, draw: random.Random, made: Any) -> None:
    """One batch of random side elements (plain and fired), waits, releases and forgets."""
    impl = made.side_impls[0][0]
    store = MemoryWaitingStore()
    state.begin_batch()
    for _ in range(draw.randrange(3)):
        index = draw.choice([None, None, 0, 1, 2])
        values = [draw.randrange(100) for _ in range(draw.randrange(1, 4))]
        state.add_side(0, side_tests._panes(impl, values, index), made)
    for _ in range(draw.randrange(4)):
        state.wait(b"m", draw.randrange(50), (draw.randrange(5),))
    state.store_new(store)
    ready = [n for n in state.buckets if draw.random() < 0.3]
    state.take_ready(ready, store)
    state.watermarks.advance([Marker("side", draw.randrange(100), 0)])
    if draw.random() < 0.3:
        state.forget([draw.choice([0, 2, GlobalWindow().max_timestamp().micros + 1])])


def test_changes_replayed_on_the_state_before_give_the_state_after() -> None:
    made = side_tests._side_coders()
    draw = random.Random(63)
    state = SideInputShardState(WatermarkState(expected=frozenset({"side"})), [[]])
    replayed = copy.deepcopy(state)
    for _ in range(200):
        _random_batch(state, draw, made)
        replayed.replay(pickle.loads(pickle.dumps(state.changes())))
        assert replayed == state
        # In the same order too (what the bundles read comes in it).
        assert list(replayed.buckets) == list(state.buckets)
        assert [list(fired) for fired in replayed.fired] == [list(fired) for fired in state.fired]
    assert state.encode() == replayed.encode()


class _Logged:
    """A stateless side-input shard's batches through ``state_cache``, over ``workers`` caches."""

    def __init__(self, workers: int = 1) -> None:
        self.spec, self.node, self.topology, self.main, self.side, _ = side_tests._stateless_stage()
        self.store = MemoryWaitingStore()
        self.value, self.log = _Value(), _List()
        self.key = (uuid.uuid4().hex, self.node.index, 0)
        self.caches: list[Any] = [None] * workers
        self.batches = 0
        # Per batch: the bytes written to the log, and to the log and the value.
        self.logged: list[int] = []
        self.written: list[int] = []

    def batch(self, mains: list[int], sides: list[int], marks: dict[str, int]) -> None:
        slot = self.batches % len(self.caches)
        self.batches += 1
        state_cache._CACHE.pop(self.key, None)
        if self.caches[slot] is not None:
            state_cache._CACHE[self.key] = self.caches[slot]
        log_before = sum(len(row[0]) for row in self.log.rows)
        puts = self.log.puts
        shard = SideInputShard(self.spec, NO_SINKS, self.store)
        rows = side_rows(self.main, self.side, mains, sides, marks, width=10)
        state_cache.run_logged(
            shard, shard, self.value, self.log, self.key, self.topology, self.node, rows
        )
        self.caches[slot] = state_cache._CACHE[self.key]
        log_after = sum(len(row[0]) for row in self.log.rows)
        # A base put rewrites the list; otherwise the batch appended to it.
        log_written = log_after if self.log.puts > puts else log_after - log_before
        assert self.value.value is not None
        self.logged.append(log_written)
        self.written.append(log_written + len(self.value.value[0]))

    def state(self) -> SideInputShardState:
        return state_cache._CACHE[self.key].state  # type: ignore[no-any-return]

    def read_back(self) -> SideInputShardState:
        shard = SideInputShard(self.spec, NO_SINKS, self.store)
        return state_cache._reload(shard, shard, self.log, self.key)  # type: ignore[no-any-return]


_SCRIPT = [
    ([1, 2], [], {"main": 0, "side": 0}),
    ([3], [0], {"main": 0, "side": 5}),
    ([12], [10, 21], {"main": 5, "side": 10}),
    ([], [], {"main": 15, "side": 20}),
    ([25, 31], [30], {"main": 22, "side": 25}),
    ([], [], {"main": 40, "side": 40}),
]


def test_a_logged_shard_runs_as_on_the_whole_value(monkeypatch: Any) -> None:
    """Each batch in the next of three workers' caches; the same reads, state and read-back."""
    # The log kept, and changes in the header, however small the state.
    monkeypatch.setattr(state_cache, "COMPACT_FRACTION", 100.0)
    monkeypatch.setattr(state_cache, "RECENT_SHARE", 100.0)
    side_tests._READ.clear()
    whole = side_tests._Batches()
    for args in _SCRIPT:
        whole.batch(*args)
    expected = list(side_tests._READ)
    for workers in (1, 3):
        side_tests._READ.clear()
        logged = _Logged(workers)
        for args in _SCRIPT:
            logged.batch(*args)
        assert side_tests._READ == expected
        assert sum(row[0][:1] == b"C" for row in logged.log.rows) == len(_SCRIPT) - 1
        assert whole.value is not None
        assert logged.state() == SideInputShardState.decode(whole.value)
        assert logged.read_back() == logged.state()


def test_a_batch_adding_a_few_side_elements_writes_those_not_all_it_holds() -> None:
    """Side windows far ahead of the main input stay held; a batch adds one of them."""
    logged = _Logged()
    held = list(range(1000, 21000, 10))
    logged.batch([], held, {"main": 0, "side": 0})
    for batch in range(1, 20):
        logged.batch([batch], [30000 + batch * 10], {"main": batch, "side": 0})
    base = sum(len(row[0]) for row in logged.log.rows if row[0][:1] == b"B")
    assert len(logged.state().sides[0]) == len(held) + 19
    # Each change: a chunk of one element, one bucket, the watermarks; not the 2000 held.
    # The value (header) keeps the last few changes too.
    assert max(logged.logged[1:]) * 50 < base, (logged.logged, base)
    assert max(logged.written[1:]) * 10 < base, (logged.written, base)


def test_a_value_written_whole_by_the_layout_before_is_read_and_written_as_a_base() -> None:
    side_tests._READ.clear()
    whole = side_tests._Batches()
    for args in _SCRIPT[:3]:
        whole.batch(*args)
    logged = _Logged()
    assert whole.value is not None
    # The layout before: the state pickled whole in the value, compressed.
    logged.value.update((pack(whole.value),))
    logged.store.chunks = list(whole.store.chunks)
    for args in _SCRIPT[3:]:
        whole.batch(*args)
        logged.batch(*args)
    assert whole.value is not None
    assert logged.state() == SideInputShardState.decode(whole.value)
    assert logged.read_back() == logged.state()
    assert state_cache._Header.decode(logged.value.value[0]).token  # type: ignore[index]
