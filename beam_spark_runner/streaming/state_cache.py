"""A shard's state cached in the Python worker, its changes logged in the state store.

A shard whose kind can say what a micro-batch changed (``LoggedShard``: every kind of
stateful shard) keeps its state in the state store as a *base* (its whole state, as
``ShardRun.encode`` writes it) followed by a *log* of changes, both rows of the level's list state
(``level_shell.LOG_STATE``), and a small *header* in its value state: a random token, new
with every write, and the last ``RECENT_CHANGES`` batches' changes, each with the tokens
before and after it. The decoded state stays in this process's cache (``_CACHE``) under
(level run, node, shard), with the token it was written under. A micro-batch reads the
header (one state call): if the cache holds the shard under that token, it runs on the
cached state; if under a token a recent change follows (Spark hands a task whichever idle
Python worker comes first, so a shard's batches rotate over a few processes), the changes
since are replayed on it; otherwise (a restart, a batch run again after a failed attempt,
whose token the store never committed) it reads base and log back and replays the log. It
then appends its changes in one call and writes a new header: what a batch writes and
checkpoints is what it touched, not the whole state.

The log is folded into a new base (the list rewritten whole) once its bytes reach
``COMPACT_FRACTION`` of the base's, or after ``COMPACT_ENTRIES`` batches: a change is then
written at most about 1 + 1 / ``COMPACT_FRACTION`` times over, and a reload reads at most
1 + ``COMPACT_FRACTION`` times the base.

A shard of a value written before this layout (its whole state in the value) is read from
the value and written back as a base.

A worker keeps the shards it ran most recently, at most ``CACHE_BYTES`` of them by their
size in the store (base and log, before compression), and forgets the least recently run
beyond: a shard's batches rotate over a few workers, each of which would otherwise hold a
copy of every shard's state. A shard forgotten is read back at its next batch there.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import os
import pickle
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from beam_spark_runner.streaming.compression import pack, unpack
from beam_spark_runner.streaming.rows import Row
from beam_spark_runner.streaming.shard_run import HasWatermarks, ShardRun
from beam_spark_runner.streaming.topology import Node, Topology

_LOGGER = logging.getLogger(__name__)

# A header starts with this (a value of the layout before it is a pickle, 0x80, or packed,
# ``compression._MAGIC``).
_HEADER = b"\xfeSC1"
_TOKEN_BYTES = 16
# A log row's first byte: a chunk of the base, or one batch's changes.
_BASE, _CHANGES = b"B", b"C"
# The packed base is cut into rows of at most this (one list row crosses as one cell).
BASE_ROW_BYTES = 4 << 20
COMPACT_FRACTION = 0.5
COMPACT_ENTRIES = 256
# Changes the header keeps for caches a few batches behind, and at most these bytes of them,
# nor more than this share of the base and log's before compression, what a read-back
# decodes (where a batch changes much of a small state, a read-back costs little more than
# a catch-up, and the header is rewritten every batch).
RECENT_CHANGES = 4
RECENT_BYTES = 4 << 20
RECENT_SHARE = 0.25
# Level runs whose shards stay cached in a worker process, the most recently used: each
# stateful level of a query is a run of its own; an ended query's would only take memory.
_RUNS_KEPT = 16
# The shards a worker keeps cached, by their size in the store before compression (decoded,
# they take up to a few times more).
CACHE_BYTES = 512 << 20
# Batches between two full collections of the worker's frozen objects (below).
FULL_COLLECT_BATCHES = 64

S = TypeVar("S", bound=HasWatermarks, contravariant=True)


class LoggedShard(Protocol[S]):
    """A kind of shard that can write a micro-batch's changes and replay them."""

    def changes(self, state: S) -> bytes:
        """What the micro-batch changed in ``state``, encoded; ``state`` now as committed."""

    def replay(self, state: S, changes: bytes) -> None:
        """Applies ``changes`` (``changes`` wrote them) to ``state``."""


@dataclasses.dataclass
class _Cached:
    """A shard's decoded state, as committed under ``token``."""

    token: bytes
    state: Any
    # Its base and log in the store, before compression.
    stored_bytes: int = 0


@dataclasses.dataclass
class _Header:
    """A logged shard's value: its token, its recent changes, the size of its base and log."""

    token: bytes = b""
    # (token before, token after, packed change), oldest first.
    recent: list[tuple[bytes, bytes, bytes]] = dataclasses.field(default_factory=list)
    base_bytes: int = 0
    log_bytes: int = 0
    log_entries: int = 0
    # Base and log before compression (0 in a header written before it was kept).
    raw_bytes: int = 0

    def encode(self) -> bytes:
        fields = (
            self.token,
            self.recent,
            self.base_bytes,
            self.log_bytes,
            self.log_entries,
            self.raw_bytes,
        )
        return _HEADER + pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decode(data: bytes) -> _Header:
        return _Header(*pickle.loads(memoryview(data)[len(_HEADER) :]))

    def since(self, token: bytes) -> list[bytes] | None:
        """The changes after ``token``, oldest first; None if none follows it."""
        for i, (before, _, _) in enumerate(self.recent):
            if before == token:
                return [change for _, _, change in self.recent[i:]]
        return None

    def compaction_due(self) -> bool:
        return (
            self.log_bytes >= COMPACT_FRACTION * self.base_bytes
            or self.log_entries >= COMPACT_ENTRIES
        )


# (level run, node, shard) -> the shard's state, the most recently run last; runs most
# recently used last.
_CACHE: collections.OrderedDict[tuple[str, int, int], _Cached] = collections.OrderedDict()
_RUNS: collections.OrderedDict[str, None] = collections.OrderedDict()


@dataclasses.dataclass
class CacheStats:
    """How this process's shards were loaded (for tests and the benchmark's log)."""

    hits: int = 0
    caught_up: int = 0
    reloads: int = 0
    compactions: int = 0
    evictions: int = 0


STATS = CacheStats()


@dataclasses.dataclass
class _Collector:
    """Keeps the cached states out of Python's cyclic garbage collector.

    A cached shard holds millions of objects (a cell's values, a key's pickle), all
    long-lived. Python's full collections traverse every tracked object, and a batch's
    allocations set one off often enough that at millions of keys it cost most of a batch.
    So after each batch the worker's objects are frozen (``gc.freeze``: collections skip
    them; reference counting still frees them); every ``FULL_COLLECT_BATCHES`` batches they
    are unfrozen and collected once, so cyclic garbage among them is freed in the end.
    """

    batches: int = 0

    def after_batch(self) -> None:
        self.batches += 1
        if self.batches % FULL_COLLECT_BATCHES == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()


_GC = _Collector()


def clear() -> None:
    """Forgets every cached shard (the next batch of each reloads from the store)."""
    _CACHE.clear()
    _RUNS.clear()
    _GC.batches = 0
    gc.unfreeze()


def _use_run(run: str) -> None:
    _RUNS.pop(run, None)
    _RUNS[run] = None
    while len(_RUNS) > _RUNS_KEPT:
        old, _ = _RUNS.popitem(last=False)
        for key in [k for k in _CACHE if k[0] == old]:
            del _CACHE[key]


def run_logged(
    shard_run: ShardRun[Any, Any],
    logged: LoggedShard[Any],
    value_state: Any,
    log_state: Any,
    key: tuple[str, int, int],
    topology: Topology,
    node: Node,
    rows: Iterable[Any],
    packed_share: float | None = None,
) -> list[Row]:
    """One micro-batch of a logged shard: its rows out; its changes in the store.

    ``packed_share``, for a kind whose batches may change much of a state that compresses
    well: a change reaching that share of the base, both compressed, is written as a new
    base, and the header keeps at most that share of it in recent changes.
    """
    _use_run(key[0])
    # Taken out while it runs: a failed batch must not leave a half-run state under a
    # token the store still holds.
    cached = _CACHE.pop(key, None)
    # Asked first: Spark warns on reading a value state that holds none.
    stored = value_state.get() if value_state.exists() else None
    data = bytes(stored[0]) if stored is not None else None
    header, state = _Header(), None
    if data is not None and data.startswith(_HEADER):
        header = _Header.decode(data)
        since = None if cached is None else header.since(cached.token)
        if cached is not None and cached.token == header.token:
            STATS.hits += 1
            state = cached.state
        elif cached is not None and since is not None:
            STATS.caught_up += 1
            with shard_run.storing():
                for change in since:
                    logged.replay(cached.state, unpack(change))
            state = cached.state
        else:
            STATS.reloads += 1
            state = _reload(shard_run, logged, log_state, key)
    elif data is not None:
        # The layout before: the whole state in the value; written back as a base.
        state = shard_run.decode(unpack(data))
    with shard_run.storing():
        state, out = shard_run.run(topology, node, key[2], state, rows)
        token = os.urandom(_TOKEN_BYTES)
        raw_change = logged.changes(state)
        change = pack(raw_change)
        share = packed_share * header.base_bytes if packed_share is not None else None
        rewrite = share is not None and len(change) >= share
        recent = [] if rewrite else header.recent
        if header.token and not rewrite:
            cap = min(RECENT_BYTES, RECENT_SHARE * (header.raw_bytes or header.base_bytes))
            if share is not None:
                cap = min(cap, share)
            recent = _kept([*recent, (header.token, token, change)], cap)
        if header.token and not rewrite and not header.compaction_due():
            log_state.appendList([(_CHANGES + change,)])
            header = _Header(
                token,
                recent,
                header.base_bytes,
                header.log_bytes + len(change),
                header.log_entries + 1,
                header.raw_bytes + len(raw_change),
            )
        else:
            raw_base = shard_run.encode(state)
            base = pack(raw_base)
            rows_out = range(0, len(base), BASE_ROW_BYTES)
            log_state.put([(_BASE + base[i : i + BASE_ROW_BYTES],) for i in rows_out] or [(_BASE,)])
            STATS.compactions += 1
            header = _Header(token, recent, len(base), raw_bytes=len(raw_base))
        value_state.update((header.encode(),))
        shard_run.release(state)
    _CACHE[key] = _Cached(token, state, header.raw_bytes)
    _evict(key)
    _GC.after_batch()
    return out


def _evict(kept: tuple[str, int, int]) -> None:
    """Forgets the least recently run shards while the cache holds over ``CACHE_BYTES``."""
    total = sum(cached.stored_bytes for cached in _CACHE.values())
    while total > CACHE_BYTES:
        key = next(iter(_CACHE))
        if key == kept:
            return
        total -= _CACHE.pop(key).stored_bytes
        STATS.evictions += 1


def _kept(recent: list[tuple[bytes, bytes, bytes]], cap: float) -> list[tuple[bytes, bytes, bytes]]:
    """The latest ``RECENT_CHANGES`` changes, fewer if they pass ``cap`` bytes."""
    recent = recent[-RECENT_CHANGES:]
    while recent and sum(len(change) for _, _, change in recent) > cap:
        recent = recent[1:]
    return recent


def _reload(
    shard_run: ShardRun[Any, Any],
    logged: LoggedShard[Any],
    log_state: Any,
    key: tuple[str, int, int],
) -> Any:
    """The shard's state read back from its base and log."""
    base: list[bytes] = []
    changes: list[bytes] = []
    for row in log_state.get():
        data = bytes(row[0])
        if data[:1] == _BASE:
            base.append(data[1:])
        else:
            changes.append(data[1:])
    packed_base = b"".join(base)
    with shard_run.storing():
        state = shard_run.decode(unpack(packed_base))
        for change in changes:
            logged.replay(state, unpack(change))
    _LOGGER.debug(
        "Shard %s read back from the state store: a base of %d bytes and %d changes.",
        key[1:],
        len(packed_base),
        len(changes),
    )
    return state
