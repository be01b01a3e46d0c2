"""GroupByKey shards on ``state_cache``: cached between micro-batches, changes logged.

The shards run as ``streaming.levels`` runs them, against in-memory stand-ins for the
level's value and list state, without Spark.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import uuid
import weakref
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.transforms import trigger, window
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner.streaming import group_panes, grouping, state_cache
from beam_spark_runner.streaming.compression import pack
from tests.streaming.memory_state import MemoryList as _List
from tests.streaming.memory_state import MemoryValue as _Value
from tests.streaming.test_grouping import MemoryChunks, _Shard


@pytest.fixture(autouse=True)
def _runs_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard here is a run of its own, several at a time."""
    monkeypatch.setattr(state_cache, "_RUNS_KEPT", 100)


class _Logged(_Shard):
    """A shard whose micro-batches run through ``state_cache.run_logged``.

    Its batches go round ``workers`` worker processes, each with its own cache, as Spark
    hands a task whichever idle worker comes first.
    """

    def __init__(self, windowing: beam.WindowInto, chunks: Any = None, workers: int = 1):
        super().__init__(windowing, chunks=chunks)
        self.value, self.log = _Value(), _List()
        self.key = (uuid.uuid4().hex, self.node.index, 0)
        self.caches: list[Any] = [None] * workers
        self.batches = 0

    def run(self, rows: list[dict[str, Any]]) -> list[Any]:
        worker = self.batches % len(self.caches)
        self.batches += 1
        state_cache._CACHE.pop(self.key, None)
        if self.caches[worker] is not None:
            state_cache._CACHE[self.key] = self.caches[worker]
        run = group_panes.GroupShard(group_panes.streaming_grouper(self.spec), self.chunks)
        out = state_cache.run_logged(
            run, run, self.value, self.log, self.key, self.topology, self.node, rows
        )
        self.caches[worker] = state_cache._CACHE[self.key]
        return out

    def cached(self) -> grouping.ShardState:
        state = state_cache._CACHE[self.key].state
        assert isinstance(state, grouping.ShardState)
        return state


def _panes(panes: list[WindowedValue]) -> list[Any]:
    return [(p.value[0], list(p.value[1]), p.timestamp, p.windows, p.pane_info) for p in panes]


def _layout(state: grouping.ShardState) -> tuple[Any, ...]:
    """What a shard keeps, its keys' order included."""
    return (
        list(state.blobs.items()),
        list(state.visits.items()),
        sorted(state.holds.items()),
        state.buffered,
        state.watermarks.input_watermark,
        state.watermarks.output_watermark,
    )


WINDOWINGS = {
    "fixed, values in the chunk store": (lambda: beam.WindowInto(window.FixedWindows(10)), True),
    "sessions": (lambda: beam.WindowInto(window.Sessions(5)), False),
    "global, count driver": (
        lambda: beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(3)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        ),
        False,
    ),
    "sessions, Beam's driver": (
        lambda: beam.WindowInto(
            window.Sessions(5),
            trigger=trigger.Repeatedly(trigger.AfterCount(2)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        ),
        False,
    ),
    "sliding, late panes": (
        lambda: beam.WindowInto(
            window.SlidingWindows(10, 5),
            allowed_lateness=15,
            accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
        ),
        True,
    ),
}


@pytest.mark.parametrize("name", list(WINDOWINGS))
def test_cached_and_read_back_shards_give_the_panes_of_the_whole_value(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same batches through the value rewritten whole, one worker's cache, caches of
    three workers taking turns (each catching up on the changes it missed), and of six
    (too far behind: base and log read back every batch): the same panes, watermarks and
    state, keys in the same order."""
    # A dozen keys: each batch changes much of the state, which the header keeps anyway.
    monkeypatch.setattr(state_cache, "RECENT_SHARE", 100.0)
    make, chunked = WINDOWINGS[name]
    whole = _Shard(make(), store=True, chunks=MemoryChunks() if chunked else None)
    cached, turns, read_back = (
        _Logged(make(), chunks=MemoryChunks() if chunked else None, workers=workers)
        for workers in (1, 3, 6)
    )
    draw = random.Random(name)
    watermark = 0.0
    fired = 0
    before = dataclasses.replace(state_cache.STATS)
    for _ in range(25):
        elements = []
        for _ in range(draw.randrange(8)):
            at = watermark - 3 + draw.random() * 20
            windows = make().windowing.windowfn.assign(
                window.WindowFn.AssignContext(beam.utils.timestamp.Timestamp(at))
            )
            key = f"k{draw.randrange(12)}"
            elements += [(key, draw.randrange(100), at, w) for w in windows]
        watermark += draw.random() * 6
        expected = whole.batch(elements, watermark)
        fired += len(expected[0])
        for shard in (cached, turns, read_back):
            panes, out = shard.batch(elements, watermark)
            assert (_panes(panes), out) == (_panes(expected[0]), expected[1])
    assert fired > 10
    stats = state_cache.STATS
    # After the first batch: ``cached`` hits 24 times; ``turns`` reads back its second
    # and third, then catches up 22 times; ``read_back`` reads back all 24.
    assert stats.hits - before.hits == 24
    assert stats.caught_up - before.caught_up == 22
    assert stats.reloads - before.reloads == 2 + 24
    assert whole.state is not None
    grouping.encode_shard_state(whole.state)
    expected = _layout(whole.state)
    assert _layout(cached.cached()) == _layout(turns.cached()) == expected
    assert _layout(read_back.cached()) == expected


def _global(count: int) -> beam.WindowInto:
    return beam.WindowInto(
        window.GlobalWindows(),
        trigger=trigger.Repeatedly(trigger.AfterCount(count)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    )


def test_a_batch_run_again_after_a_failed_attempt_reads_the_store_not_the_cache() -> None:
    shard = _Logged(_global(2))
    g = window.GlobalWindow()
    shard.batch([("k", 1, 1, g)], watermark=0)
    committed = (shard.value.value, list(shard.log.rows))
    first, _ = shard.batch([("k", 2, 2, g)], watermark=0)
    assert [p.value for p in first] == [("k", [1, 2])]
    # Spark discards the attempt's writes; this process's cache still holds its state.
    shard.value.value, shard.log.rows = committed
    reloads = state_cache.STATS.reloads
    again, _ = shard.batch([("k", 2, 2, g)], watermark=0)
    assert state_cache.STATS.reloads == reloads + 1
    assert _panes(again) == _panes(first)


def test_a_batch_writes_and_reads_what_it_touched_and_the_log_is_compacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_cache, "COMPACT_ENTRIES", 4)
    shard = _Logged(_global(100))
    g = window.GlobalWindow()
    shard.batch([(f"k{i}", i, 1, g) for i in range(2000)], watermark=0)
    assert shard.log.puts == 1 and shard.log.appends == 0
    (base,) = shard.log.rows
    hits = state_cache.STATS.hits
    for n in range(4):
        shard.batch([(f"k{n}", -1, 2, g)], watermark=0)
        header = shard.value.value
        # A token and the last few batches' changes: one key's state each.
        assert header is not None and len(header[0]) * 5 < len(base[0])
    assert state_cache.STATS.hits == hits + 4
    assert shard.log.reads == 0 and shard.log.puts == 1 and shard.log.appends == 4
    changes = shard.log.rows[1:]
    assert len(changes) == 4
    # One key's state each, not the 2 000 keys'.
    assert max(len(c[0]) for c in changes) * 20 < len(base[0])
    shard.batch([("k9", -1, 2, g)], watermark=0)
    assert shard.log.puts == 2 and len(shard.log.rows) == 1  # the log folded into the base


def test_a_value_written_whole_before_the_log_is_read_and_written_as_a_base() -> None:
    whole = _Shard(_global(2))
    g = window.GlobalWindow()
    whole.batch([("k", 1, 1, g)], watermark=0)
    assert whole.state is not None
    shard = _Logged(_global(2))
    shard.value.value = (pack(grouping.encode_shard_state(whole.state)),)
    panes, _ = shard.batch([("k", 2, 2, g)], watermark=0)
    assert [p.value for p in panes] == [("k", [1, 2])]
    assert shard.log.puts == 1
    header = shard.value.value
    assert header is not None and header[0].startswith(state_cache._HEADER)


def test_the_header_keeps_recent_changes_only_while_small_beside_the_base() -> None:
    g = window.GlobalWindow()
    small = _Logged(_global(100))
    small.batch([("k", 1, 1, g)], watermark=0)
    small.batch([("k", 2, 1, g)], watermark=0)  # changes the whole state
    header = small.value.value
    assert header is not None
    assert state_cache._Header.decode(header[0]).recent == []
    large = _Logged(_global(100))
    large.batch([(f"k{i}", i, 1, g) for i in range(2000)], watermark=0)
    for n in range(6):
        large.batch([(f"k{n}", -1, 2, g)], watermark=0)
    header = large.value.value
    assert header is not None
    assert len(state_cache._Header.decode(header[0]).recent) == state_cache.RECENT_CHANGES


def test_a_worker_forgets_the_shards_it_ran_least_recently_beyond_its_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state_cache.clear()
    g = window.GlobalWindow()
    first, second = _Logged(_global(2)), _Logged(_global(2))
    first.batch([(f"k{i}", i, 1, g) for i in range(200)], watermark=0)
    size = state_cache._CACHE[first.key].stored_bytes
    assert size > 0
    # Room for one of the shards, not both.
    monkeypatch.setattr(state_cache, "CACHE_BYTES", size + size // 2)
    second.batch([(f"k{i}", i, 1, g) for i in range(200)], watermark=0)
    assert first.key not in state_cache._CACHE and second.key in state_cache._CACHE
    first.caches = [None]  # this worker's cache, as it is now
    reloads = state_cache.STATS.reloads
    panes, _ = first.batch([("k3", 3, 2, g)], watermark=0)
    assert state_cache.STATS.reloads == reloads + 1
    assert [p.value for p in panes] == [("k3", [3, 3])]
    assert second.key not in state_cache._CACHE


def test_a_batch_leaves_the_cached_state_out_of_the_collector_and_collects_it_now_and_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a batch the worker's objects are frozen (full collections skip them); every
    ``FULL_COLLECT_BATCHES`` batches they are collected, so cyclic garbage does not stay."""
    monkeypatch.setattr(state_cache, "FULL_COLLECT_BATCHES", 3)
    state_cache.clear()
    shard = _Logged(_global(100))
    g = window.GlobalWindow()
    try:
        shard.batch([(f"k{i}", i, 1, g) for i in range(100)], watermark=0)
        assert gc.get_freeze_count() > 0
        cyclic = _Cyclic()
        ref = weakref.ref(cyclic)
        shard.batch([("k1", 2, 2, g)], watermark=0)  # frozen with the batch's objects
        del cyclic  # garbage now, in a cycle: only a collection frees it
        gc.collect()
        assert ref() is not None
        shard.batch([("k2", 3, 3, g)], watermark=0)  # the third: collected, frozen again
        assert ref() is None
        assert gc.get_freeze_count() > 0
    finally:
        state_cache.clear()
    assert gc.get_freeze_count() == 0


class _Cyclic:
    """An object only a reference cycle keeps alive once its creator drops it."""

    def __init__(self) -> None:
        self.me = self
