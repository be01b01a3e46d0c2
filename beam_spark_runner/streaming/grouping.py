"""A GroupByKey shard's state between micro-batches: its keys, their trigger state, its layout.

The shard's keys, their trigger-driver state and its watermarks are one encoded value
(``encode_shard_state``), kept between batches by ``state_cache``: cached decoded in the
worker, in the state store as a base of that value and a log of each batch's changes
(``shard_changes``: the keys it decoded, added or removed), never a state call per key or
element (see docs/streaming.md). Each key's state is its own pickle
(``ShardState.blobs``), with the watermark at which the key next has work and its earliest
hold kept beside it: a micro-batch decodes and re-encodes only the keys it has elements
for or work due, not every key the shard holds. Under the runner's default-trigger driver
a window that has not fired is not in the state either: each
batch appends its keys' new values and holds to the level's list state (``chunk_lists``),
a chunk per window, and the batch that fires the window reads them back (one more state
call in a batch with new values, three in a batch that fires buffered windows).

What a micro-batch does with them: ``group_panes``.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.count_trigger import (
    CountTriggerState,
    plain_counts,
    restored_counts,
)
from beam_spark_runner.execution.default_trigger import (
    DefaultTriggerState,
    plain_state,
    restored_state,
    upgraded_state,
)
from beam_spark_runner.execution.session_trigger import (
    SessionTriggerState,
    plain_sessions,
    restored_sessions,
)
from beam_spark_runner.spark.internals import pickle_by_value
from beam_spark_runner.streaming.watermarks import MIN_MICROS, WatermarkState


@dataclasses.dataclass
class KeyState:
    """One key of a shard: its decoded key and its trigger driver's state."""

    key: Any
    state: Any  # trigger.InMemoryUnmergedState


# Each key's state is its own pickle inside the shard's value; the value is a tuple tagged
# with this layout (an untagged pair is the layout before it: every key in one pickle).
_LAYOUT = "beam-spark-gbk-keys-v2"
# What a micro-batch changed (``state_cache``'s log), tagged likewise.
_CHANGES = "beam-spark-gbk-changes-v1"
# The visit time of a key with work every micro-batch (a processing-time timer, or a key
# of an older checkpoint until its first batch settles it).
ALWAYS = MIN_MICROS


@dataclasses.dataclass
class ShardState:
    """Everything one GroupByKey shard keeps between micro-batches.

    ``blobs`` has every key of the shard, in the order keys first came, each as its own
    encoded state; ``keys`` the keys decoded in this micro-batch, whose blobs are stale
    until the shard is encoded. A micro-batch decodes only the keys it has elements for
    and the keys due a visit: ``visits`` says, per key, the input watermark at which it
    next has work (a window to fire or to forget, an event-time timer of Beam's driver;
    ``ALWAYS`` for a key with a processing-time timer), and ``holds`` its earliest
    watermark hold, so a key with nothing to do costs a comparison, not a decode and an
    encode.
    """

    watermarks: WatermarkState
    keys: dict[bytes, KeyState] = dataclasses.field(default_factory=dict)
    blobs: dict[bytes, bytes] = dataclasses.field(default_factory=dict)
    visits: dict[bytes, int] = dataclasses.field(default_factory=dict)
    holds: dict[bytes, int] = dataclasses.field(default_factory=dict)
    # Windows waiting in the shard's chunk store for their on-time pane, their keys' values
    # and holds with them: the window's tag (``group_panes._window_tag``) -> (its end, the earliest
    # hold of its keys; micros). See ``group_panes.StreamingGrouper.process``.
    buffered: dict[bytes, tuple[int, int]] = dataclasses.field(default_factory=dict)
    # Keys whose blob, visit or hold this micro-batch may change, in the order a replay
    # must put them (``shard_changes``), and keys it removed: not encoded.
    dirty: dict[bytes, None] = dataclasses.field(default_factory=dict)
    removed: set[bytes] = dataclasses.field(default_factory=set)
    # At most every key's visit (None: not known), so a batch before it looks at none.
    earliest_visit: int | None = None
    # The least of ``holds`` (None: not known), kept as holds change.
    least_hold: int | None = None

    def key_state(self, key_bytes: bytes) -> KeyState | None:
        """The key's state, decoded on first use; None for a key the shard does not hold."""
        loaded = self.keys.get(key_bytes)
        if loaded is None:
            blob = self.blobs.get(key_bytes)
            if blob is None:
                return None
            loaded = self.keys[key_bytes] = _decode_key(blob)
            self.dirty[key_bytes] = None
        return loaded

    def add(self, key_bytes: bytes, key_state: KeyState) -> None:
        """A key new to the shard."""
        self.keys[key_bytes] = key_state
        self.blobs[key_bytes] = b""  # its place in the order; encoded with the shard
        self.dirty.pop(key_bytes, None)  # a key removed and added again goes last
        self.dirty[key_bytes] = None

    def remove(self, key_bytes: bytes) -> None:
        """Forgets a key with nothing left."""
        del self.keys[key_bytes]
        del self.blobs[key_bytes]
        self.visits.pop(key_bytes, None)
        self.set_hold(key_bytes, None)
        self.dirty.pop(key_bytes, None)
        self.removed.add(key_bytes)

    def set_visit(self, key_bytes: bytes, visit: int) -> None:
        """The input watermark at which the key next has work."""
        self.visits[key_bytes] = visit = _shared(visit)
        if self.earliest_visit is not None and visit < self.earliest_visit:
            self.earliest_visit = visit

    def set_hold(self, key_bytes: bytes, hold: int | None) -> None:
        """The key's earliest watermark hold (micros), or None for none."""
        old = self.holds.pop(key_bytes, None) if hold is None else self.holds.get(key_bytes)
        if hold is not None:
            self.holds[key_bytes] = hold = _shared(hold)
        least = self.least_hold
        if least is None:
            return
        if old == least and (hold is None or hold > least):
            self.least_hold = None  # another key may hold as early: looked up when asked
        elif hold is not None and hold < least:
            self.least_hold = hold

    def earliest_hold(self, default: int) -> int:
        """The least of the keys' holds; ``default`` if none holds."""
        if self.least_hold is None:
            self.least_hold = min(self.holds.values(), default=default)
        return min(self.least_hold, default)

    def load_due(self, watermark: int) -> None:
        """Decodes every key with work once the input watermark is ``watermark``."""
        if self.earliest_visit is not None and watermark < self.earliest_visit:
            return
        visits = self.visits
        for key_bytes in [k for k, due in visits.items() if due <= watermark]:
            self.key_state(key_bytes)
        # The keys decoded here are visited again at the end of the batch (``set_visit``).
        self.earliest_visit = min((v for v in visits.values() if v > watermark), default=None)

    def loaded(self) -> list[tuple[bytes, KeyState]]:
        """The decoded keys, in the order this batch decoded or added them.

        Not the order of ``blobs``: finding the few decoded keys among every key the shard
        holds would cost a look at each.
        """
        return list(self.keys.items())


# Visits and holds as one object per value (most keys of a shard share a few: a window's
# end), not one per key: 32 bytes a key, millions of keys.
_SHARED: dict[int, int] = {}
_MAX_SHARED = 4096


def _shared(value: int) -> int:
    """``value``, the object an equal value set before is, where there was one."""
    shared = _SHARED.get(value)
    if shared is None:
        if len(_SHARED) >= _MAX_SHARED:
            _SHARED.clear()
        shared = _SHARED[value] = value
    return shared


def _shared_values(values: dict[bytes, int]) -> dict[bytes, int]:
    """``values`` with equal values one object (``_shared``)."""
    return {key: _shared(value) for key, value in values.items()}


def _plain(state: Any) -> tuple[dict, dict, dict]:
    """An ``InMemoryUnmergedState`` as plain dicts (its defaultdicts hold lambdas)."""
    return (
        {window: dict(timers) for window, timers in state.timers.items()},
        {window: dict(tags) for window, tags in state.state.items()},
        dict(state.global_state),
    )


def _restored(plain: tuple[dict, dict, dict]) -> Any:
    timers, tags, global_state = plain
    state = bi.trigger_state()
    state.timers.update(timers)
    for window, values in tags.items():
        state.state[window].update(values)
    state.global_state.update(global_state)
    return state


def dumps(value: Any) -> bytes:
    """Python's C pickle, or cloudpickle where it cannot.

    cloudpickle pickles by value what plain pickle cannot find by name: keys, values or
    windows of a type defined in a script or a function.
    """
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return pickle_by_value(value)


# A key's blob says which driver's state it holds.
_DEFAULT_DRIVER, _BEAM_DRIVER, _SESSIONS_DRIVER, _COUNT_DRIVER = 0, 1, 2, 3


def _encode_key(key_state: KeyState) -> bytes:
    state = key_state.state
    if isinstance(state, SessionTriggerState):
        return dumps((key_state.key, _SESSIONS_DRIVER, plain_sessions(state)))
    if isinstance(state, CountTriggerState):
        return dumps((key_state.key, _COUNT_DRIVER, plain_counts(state)))
    if isinstance(state, DefaultTriggerState):
        return dumps((key_state.key, _DEFAULT_DRIVER, plain_state(state)))
    return dumps((key_state.key, _BEAM_DRIVER, _plain(state)))


def _decode_key(blob: bytes) -> KeyState:
    key, driver, plain = pickle.loads(blob)
    if driver == _SESSIONS_DRIVER:
        return KeyState(key, restored_sessions(plain))
    if driver == _COUNT_DRIVER:
        return KeyState(key, restored_counts(plain))
    return KeyState(key, restored_state(plain) if driver == _DEFAULT_DRIVER else _restored(plain))


def encode_shard_state(shard: ShardState) -> bytes:
    """The shard's state as one state-store value.

    Its decoded keys are encoded again (their blobs brought up to date); the others keep
    the blobs they came with.
    """
    for key_bytes, key_state in shard.keys.items():
        shard.blobs[key_bytes] = _encode_key(key_state)
    shard.dirty.clear()
    shard.removed.clear()
    return pickle.dumps(
        (_LAYOUT, shard.watermarks, shard.blobs, shard.visits, shard.holds, shard.buffered),
        protocol=pickle.HIGHEST_PROTOCOL,
    )


def shard_changes(shard: ShardState) -> bytes:
    """What the micro-batch changed, for ``replay_changes``.

    The shard's watermarks and buffered windows, its removed keys, and each changed key's
    blob, visit and hold. The changed keys' blobs are brought up to date, as
    ``encode_shard_state`` does.
    """
    blobs, keys, visits, holds = shard.blobs, shard.keys, shard.visits, shard.holds
    changed = []
    for key_bytes in shard.dirty:
        blob = blobs[key_bytes] = _encode_key(keys[key_bytes])
        changed.append((key_bytes, blob, visits.get(key_bytes), holds.get(key_bytes)))
    # Removed keys sorted: a set's order, which the hash seed decides, is not written.
    data = pickle.dumps(
        (_CHANGES, shard.watermarks, shard.buffered, sorted(shard.removed), changed),
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    shard.dirty.clear()
    shard.removed.clear()
    return data


def replay_changes(shard: ShardState, data: bytes) -> None:
    """Applies what ``shard_changes`` wrote to the shard as it was before that batch.

    Removed keys go first, then the changed keys in order: a key the batch kept stays in
    its place, one it added (or removed and added again) goes last, as in the batch.
    """
    layout, watermarks, buffered, removed, changed = pickle.loads(data)
    assert layout == _CHANGES, f"expected a GroupByKey shard's changes, found {layout!r}"
    blobs, visits = shard.blobs, shard.visits
    for key_bytes in removed:
        blobs.pop(key_bytes, None)
        visits.pop(key_bytes, None)
        shard.set_hold(key_bytes, None)
    for key_bytes, blob, visit, hold in changed:
        blobs[key_bytes] = blob
        if visit is None:
            visits.pop(key_bytes, None)
        else:
            shard.set_visit(key_bytes, visit)
        shard.set_hold(key_bytes, hold)
    shard.watermarks = watermarks
    shard.buffered = buffered


def release_shard_state(shard: ShardState) -> None:
    """Lets go of the shard's decoded keys, once it is encoded.

    The states Beam's driver holds are emptied in place first
    (``beam_internals.empty_trigger_state``: over merging windows the driver leaves them in
    reference cycles, which only the cyclic collector would free).
    """
    for key_state in shard.keys.values():
        if not isinstance(key_state.state, DefaultTriggerState):
            bi.empty_trigger_state(key_state.state)
    shard.keys.clear()


def decode_shard_state(data: bytes) -> ShardState:
    """The shard state ``encode_shard_state`` wrote, no key decoded yet.

    A value of the layout before it (every key in one pickle) comes back with every key
    decoded, and is written in the new layout at the end of its micro-batch; one written
    before the chunk store has no buffered windows (its keys hold all their values).
    """
    value = pickle.loads(data)
    if value[0] == _LAYOUT:
        _, watermarks, blobs, visits, holds, *buffered = value
        visits, holds = _shared_values(visits), _shared_values(holds)
        return ShardState(watermarks, {}, blobs, visits, holds, *buffered)
    watermarks, keys = value
    shard = ShardState(watermarks)
    for key_bytes, (key, plain) in keys.items():
        state = (
            upgraded_state(plain) if isinstance(plain, DefaultTriggerState) else _restored(plain)
        )
        shard.add(key_bytes, KeyState(key, state))
        shard.visits[key_bytes] = ALWAYS  # settled at the end of the first micro-batch
    return shard
