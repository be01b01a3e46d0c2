"""GroupByKey in a streaming run: Beam's trigger driver over one shard's keys, per micro-batch.

A stateful level runs as ``groupBy(target, shard).transformWithState`` (time mode none):
Spark calls the level's processor once per (node, shard) with that micro-batch's rows.
Every shard gets every producer's marker every batch, so it runs every batch. For a
GroupByKey shard it:

1. runs each key's new elements through Beam's streaming ``GeneralTriggerDriver`` (under
   the default trigger, the runner's driver, which gives the same panes:
   ``execution.default_trigger`` over non-merging windows, ``execution.session_trigger``
   over sessions) against the shard's
   *previous* input watermark (late data is dropped where Beam drops it: behind a
   window's end plus the allowed lateness);
2. advances the input watermark from the markers (the minimum over the producers it
   expects) and the runner's processing time;
3. fires the timers now due, key by key in timestamp order, until none are (a firing may
   set new timers); once the input is at +inf, processing-time timers fire too, as a
   bounded run ends;
4. forgets windows past their garbage-collection time, and keys with nothing left;
5. emits the panes (to the GroupByKey's readers) and its output watermark, the minimum of
   the input watermark and the earliest hold of its keys (the trigger driver's watermark
   holds: unfired panes at their timestamp combiner's output time), as markers.

The shard's keys, their trigger-driver state and its watermarks are one value in Spark's
state store, read once and written once per batch: two state calls per shard and batch,
none per key or element (see docs/architecture.md). Inside that value each key's state is
its own pickle (``ShardState.blobs``), with the watermark at which the key next has work
and its earliest hold kept beside it: a micro-batch decodes and re-encodes only the keys
it has elements for or work due, not every key the shard holds. Under the runner's
default-trigger driver a window that has not fired is not in that value either: each
batch appends its keys' new values and holds to the level's list state (``chunk_lists``),
a chunk per window, and the batch that fires the window reads them back (one more state
call in a batch with new values, three in a batch that fires buffered windows).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.default_trigger import (
    DefaultTriggerDriver,
    DefaultTriggerState,
    WindowPanes,
    add_hold,
    end_of,
    plain_state,
    restored_state,
    upgraded_state,
    window_of,
    window_token,
)
from beam_spark_runner.execution.default_trigger import applies as default_trigger_applies
from beam_spark_runner.execution.grouping import GroupSpec
from beam_spark_runner.execution.session_trigger import (
    SessionsDriver,
    SessionTriggerState,
    plain_sessions,
    restored_sessions,
)
from beam_spark_runner.execution.session_trigger import applies as sessions_applies
from beam_spark_runner.streaming.chunk_lists import ChunkStore
from beam_spark_runner.streaming.rows import (
    ELEMENT,
    KEY,
    KEYED_RUN,
    PORT,
    Row,
    cell,
    keyed_run_elements,
    marker_of,
    output_rows,
    routed_marker,
)
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
    MIN_MICROS,
    Marker,
    WatermarkState,
)

_LOGGER = logging.getLogger(__name__)

# Timer rounds in one micro-batch before the runner says a trigger keeps re-arming itself.
_MAX_TIMER_ROUNDS = 10_000


class _Clock:
    """The runner's processing time for Beam's trigger contexts (seconds, as ``time()``)."""

    def __init__(self, micros: int) -> None:
        self.micros = micros

    def time(self) -> float:
        return self.micros / 1e6


@dataclasses.dataclass
class KeyState:
    """One key of a shard: its decoded key and its trigger driver's state."""

    key: Any
    state: Any  # trigger.InMemoryUnmergedState


# Each key's state is its own pickle inside the shard's value; the value is a tuple tagged
# with this layout (an untagged pair is the layout before it: every key in one pickle).
_LAYOUT = "beam-spark-gbk-keys-v2"
# The visit time of a key with work every micro-batch (a processing-time timer, or a key
# of an older checkpoint until its first batch settles it).
_ALWAYS = MIN_MICROS


@dataclasses.dataclass
class ShardState:
    """Everything one GroupByKey shard keeps between micro-batches.

    ``blobs`` has every key of the shard, in the order keys first came, each as its own
    encoded state; ``keys`` the keys decoded in this micro-batch, whose blobs are stale
    until the shard is encoded. A micro-batch decodes only the keys it has elements for
    and the keys due a visit: ``visits`` says, per key, the input watermark at which it
    next has work (a window to fire or to forget, an event-time timer of Beam's driver;
    ``_ALWAYS`` for a key with a processing-time timer), and ``holds`` its earliest
    watermark hold, so a key with nothing to do costs a comparison, not a decode and an
    encode.
    """

    watermarks: WatermarkState
    keys: dict[bytes, KeyState] = dataclasses.field(default_factory=dict)
    blobs: dict[bytes, bytes] = dataclasses.field(default_factory=dict)
    visits: dict[bytes, int] = dataclasses.field(default_factory=dict)
    holds: dict[bytes, int] = dataclasses.field(default_factory=dict)
    # Windows waiting in the shard's chunk store for their on-time pane, their keys' values
    # and holds with them: the window's tag (``_window_tag``) -> (its end, the earliest
    # hold of its keys; micros). See ``StreamingGrouper.process``.
    buffered: dict[bytes, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def key_state(self, key_bytes: bytes) -> KeyState | None:
        """The key's state, decoded on first use; None for a key the shard does not hold."""
        loaded = self.keys.get(key_bytes)
        if loaded is None:
            blob = self.blobs.get(key_bytes)
            if blob is None:
                return None
            loaded = self.keys[key_bytes] = _decode_key(blob)
        return loaded

    def add(self, key_bytes: bytes, key_state: KeyState) -> None:
        """A key new to the shard."""
        self.keys[key_bytes] = key_state
        self.blobs[key_bytes] = b""  # its place in the order; encoded with the shard

    def remove(self, key_bytes: bytes) -> None:
        """Forgets a key with nothing left."""
        del self.keys[key_bytes]
        del self.blobs[key_bytes]
        self.visits.pop(key_bytes, None)
        self.holds.pop(key_bytes, None)

    def load_due(self, watermark: int) -> None:
        """Decodes every key with work once the input watermark is ``watermark``."""
        for key_bytes in [k for k, due in self.visits.items() if due <= watermark]:
            self.key_state(key_bytes)

    def loaded(self) -> list[tuple[bytes, KeyState]]:
        """The decoded keys, in the order keys first came to the shard."""
        keys = self.keys
        if len(keys) == len(self.blobs):
            return [(k, keys[k]) for k in self.blobs]
        return [(k, keys[k]) for k in self.blobs if k in keys]


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


def _dumps(value: Any) -> bytes:
    """Python's C pickle, or cloudpickle where it cannot.

    cloudpickle pickles by value what plain pickle cannot find by name: keys, values or
    windows of a type defined in a script or a function.
    """
    import pickle

    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        from pyspark import cloudpickle

        return cloudpickle.dumps(value)  # type: ignore[no-any-return]


# A key's blob says which driver's state it holds.
_DEFAULT_DRIVER, _BEAM_DRIVER, _SESSIONS_DRIVER = 0, 1, 2


def _encode_key(key_state: KeyState) -> bytes:
    state = key_state.state
    if isinstance(state, SessionTriggerState):
        return _dumps((key_state.key, _SESSIONS_DRIVER, plain_sessions(state)))
    if isinstance(state, DefaultTriggerState):
        return _dumps((key_state.key, _DEFAULT_DRIVER, plain_state(state)))
    return _dumps((key_state.key, _BEAM_DRIVER, _plain(state)))


def _decode_key(blob: bytes) -> KeyState:
    import pickle

    key, driver, plain = pickle.loads(blob)
    if driver == _SESSIONS_DRIVER:
        return KeyState(key, restored_sessions(plain))
    return KeyState(key, restored_state(plain) if driver == _DEFAULT_DRIVER else _restored(plain))


def encode_shard_state(shard: ShardState) -> bytes:
    """The shard's state as one state-store value.

    Its decoded keys are encoded again (their blobs brought up to date); the others keep
    the blobs they came with.
    """
    import pickle

    for key_bytes, key_state in shard.keys.items():
        shard.blobs[key_bytes] = _encode_key(key_state)
    return pickle.dumps(
        (_LAYOUT, shard.watermarks, shard.blobs, shard.visits, shard.holds, shard.buffered),
        protocol=pickle.HIGHEST_PROTOCOL,
    )


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
    import pickle

    value = pickle.loads(data)
    if value[0] == _LAYOUT:
        _, watermarks, blobs, visits, holds, *buffered = value
        return ShardState(watermarks, {}, blobs, visits, holds, *buffered)
    watermarks, keys = value
    shard = ShardState(watermarks)
    for key_bytes, (key, plain) in keys.items():
        state = (
            upgraded_state(plain) if isinstance(plain, DefaultTriggerState) else _restored(plain)
        )
        shard.add(key_bytes, KeyState(key, state))
        shard.visits[key_bytes] = _ALWAYS  # settled at the end of the first micro-batch
    return shard


class StreamingGrouper:
    """One GroupByKey's coders and trigger driver, built once per worker process.

    Under the default trigger the driver is the runner's (the same panes, a fraction of the
    Python): ``DefaultTriggerDriver`` over non-merging windows, ``SessionsDriver`` over
    Beam's ``Sessions``; otherwise it is Beam's ``GeneralTriggerDriver``. ``beam_driver``
    forces Beam's (tests compare them).
    """

    def __init__(self, spec: GroupSpec, beam_driver: bool = False) -> None:
        spec.environment.enter()
        context = bi.PipelineContext(bi.beam_runner_api_pb2.Components.FromString(spec.components))
        self.name = spec.name
        self.pre_impl = context.coders[spec.pre_grouping_coder_id].get_impl()
        self.post_impl = context.coders[spec.post_grouping_coder_id].get_impl()
        self.windowing = context.windowing_strategies[spec.windowing_strategy_id]
        self.clock = _Clock(0)
        self.driver = bi.create_trigger_driver(self.windowing, clock=self.clock)
        # The runner's own driver (``SessionsDriver`` is a ``DefaultTriggerDriver``, its
        # state a ``DefaultTriggerState``), where it takes the windowing.
        self.default: DefaultTriggerDriver | None = None
        if not beam_driver and default_trigger_applies(self.windowing):
            self.default = DefaultTriggerDriver(self.windowing)
        elif not beam_driver and sessions_applies(self.windowing):
            self.default = SessionsDriver(self.windowing)
        self.allowed_lateness = self.windowing.allowed_lateness
        # Whether values wait in the shard's chunk store (``process``): under the
        # default-trigger driver over windows that do not merge (sessions merge: theirs
        # stay in the keys' states).
        self.buffers = type(self.default) is DefaultTriggerDriver

    def process(
        self,
        shard: ShardState,
        elements: dict[bytes, list[bytes]],
        markers: list[Marker],
        chunks: ChunkStore | None = None,
    ) -> Iterator[Any]:
        """Runs one micro-batch of a shard; yields (key bytes, key, pane) per pane fired.

        With ``chunks``, under the runner's default-trigger driver, a window that has not
        had its on-time pane waits there, not in its keys' states: at the end of each
        batch its keys' values and holds of that batch go into one chunk (``_buffer``),
        and the batch whose input watermark reaches its end reads them back before it
        fires (``_unbuffer``). Until then the shard's value holds only the window's end
        and earliest hold; a key with nothing else is not in it at all. Before, every
        key's values and holds were in the value, read and written again every
        micro-batch until the window fired.
        """
        watermarks = shard.watermarks
        # Elements arrive at the micro-batch's processing time; the watermark moves after.
        watermarks.processing_time = max(
            [watermarks.processing_time, *(m.processing_time for m in markers)]
        )
        self.clock.micros = watermarks.processing_time
        input_watermark = Timestamp(micros=watermarks.input_watermark)
        output_watermark = Timestamp(micros=watermarks.output_watermark)
        for key_bytes, cells in elements.items():
            values = list(self.pre_impl.decode_all(b"".join(cells)))
            key_state = shard.key_state(key_bytes)
            if key_state is None:
                new_state = self.default.new_state() if self.default else bi.trigger_state()
                key_state = KeyState(values[0].value[0], new_state)
                shard.add(key_bytes, key_state)
            driver = self._driver_of(key_state)
            panes = driver.process_elements(
                key_state.state,
                [wv.with_value(wv.value[1]) for wv in values],
                output_watermark,
                input_watermark,
            )
            for pane in panes:
                yield key_bytes, key_state.key, pane
        watermarks.advance(markers)
        self.clock.micros = watermarks.processing_time
        shard.load_due(watermarks.input_watermark)
        if shard.buffered:
            assert chunks is not None, f"GroupByKey '{self.name}' has windows in a chunk store"
            self._unbuffer(shard, chunks)
        yield from self._fire_timers(shard)
        self._collect_garbage(shard)
        if chunks is not None and self.buffers:
            self._buffer(shard, chunks)
        self._settle(shard)

    def _unbuffer(self, shard: ShardState, chunks: ChunkStore) -> None:
        """Puts every buffered window the input watermark reached back into its keys.

        Such a window's on-time pane fires in this batch. A key's values from the chunks
        go before those it got in this batch, which came later (a pane's values stay in
        arrival order), and its holds join them; a key the shard no longer holds comes
        back, after the keys it holds.
        """
        watermark = shard.watermarks.input_watermark
        due = [tag for tag, (end, _) in shard.buffered.items() if end <= watermark]
        if not due:
            return
        import pickle

        # (window token, key bytes) -> [key, values, holds], in the order they came.
        earlier: dict[tuple[Any, bytes], list[Any]] = {}
        for tag, tagged in chunks.take(set(due)).items():
            token = pickle.loads(tag)
            for chunk in tagged:
                for key_bytes, key, values, holds in pickle.loads(chunk):
                    entry = earlier.get((token, key_bytes))
                    if entry is None:
                        earlier[(token, key_bytes)] = [key, values, holds]
                    else:
                        entry[1].extend(values)
                        entry[2].extend(holds)
        for (token, key_bytes), (key, values, holds) in earlier.items():
            key_state = shard.key_state(key_bytes)
            if key_state is None:
                key_state = KeyState(key, DefaultTriggerState())
                shard.add(key_bytes, key_state)
            window = window_of(token)
            panes = key_state.state.get(window)
            if panes is None:
                # Never fired (it would not wait in the store): no pane counted yet.
                panes = key_state.state[window] = WindowPanes(timer=True)
            panes.values[:0] = values
            for hold in holds:
                add_hold(panes.holds, hold)
        for tag in due:
            del shard.buffered[tag]

    def _buffer(self, shard: ShardState, chunks: ChunkStore) -> None:
        """Moves the windows still before their end out of this batch's keys, to ``chunks``.

        One chunk per window: (key bytes, key, values, holds) of each key it has in this
        batch, in the order of the shard's keys. Those windows' end-of-window timers are
        set (the watermark has not reached them), none has fired (a window that has keeps
        its values in its key's state, for late panes of the accumulating mode), so a
        key's window is its values and holds alone. A key left with no window leaves the
        shard's value.
        """
        new: dict[bytes, list[tuple[bytes, Any, list[Any], list[int]]]] = {}
        ends: dict[bytes, tuple[int, int]] = {}
        tags: dict[Any, bytes] = {}
        emptied = []
        for key_bytes, key_state in shard.keys.items():
            state = key_state.state
            if type(state) is not DefaultTriggerState:
                continue
            pending = [window for window, panes in state.items() if panes.timer]
            for window in pending:
                panes = state.pop(window)
                tag = tags.get(window)
                if tag is None:
                    tag = tags[window] = _window_tag(window)
                entry = (key_bytes, key_state.key, panes.values, panes.holds)
                new.setdefault(tag, []).append(entry)
                end, hold = ends.get(tag) or shard.buffered.get(tag) or (end_of(window), MAX_MICROS)
                ends[tag] = (end, min([hold, *panes.holds]))
            if pending and not state:
                emptied.append(key_bytes)
        for key_bytes in emptied:
            shard.remove(key_bytes)
        if new:
            chunks.append([(tag, _dumps(entries)) for tag, entries in new.items()])
            shard.buffered.update(ends)

    def _driver_of(self, key_state: KeyState) -> Any:
        """The driver of a key's state.

        A key whose state Beam's driver wrote (a checkpoint of an earlier runner version)
        stays with Beam's driver; new keys get the default one.
        """
        if isinstance(key_state.state, DefaultTriggerState):
            assert self.default is not None, "default-trigger state under another trigger"
            return self.default
        return self.driver

    def _fire_timers(self, shard: ShardState) -> Iterator[Any]:
        watermark = Timestamp(micros=shard.watermarks.input_watermark)
        beams = {}
        for key_bytes, key_state in shard.loaded():
            if isinstance(key_state.state, DefaultTriggerState):
                # Its firings never set timers: one round.
                for pane in self._driver_of(key_state).fire_timers(key_state.state, watermark):
                    yield key_bytes, key_state.key, pane
            else:
                beams[key_bytes] = key_state
        done = shard.watermarks.input_watermark >= MAX_MICROS
        processing_time = MAX_TIMESTAMP if done else Timestamp(micros=self.clock.micros)
        for _ in range(_MAX_TIMER_ROUNDS):
            fired = False
            for key_bytes, key_state in beams.items():
                expired, _ = key_state.state.get_timers(
                    clear=True, watermark=watermark, processing_time=processing_time
                )
                for window, (name, domain, timestamp, _tag) in sorted(
                    expired, key=lambda timer: timer[1][2]
                ):
                    fired = True
                    for pane in self.driver.process_timer(
                        window, name, domain, timestamp, key_state.state, watermark
                    ):
                        yield key_bytes, key_state.key, pane
            if not fired:
                return
        raise RuntimeError(
            f"GroupByKey '{self.name}' fired timers {_MAX_TIMER_ROUNDS} rounds in one "
            "micro-batch and they keep coming: its trigger re-arms itself at or before the "
            "current time. Check the windowing's trigger."
        )

    def _collect_garbage(self, shard: ShardState) -> None:
        """Drops windows whose input can only be dropped as late, and keys left empty."""
        watermark = Timestamp(micros=shard.watermarks.input_watermark)
        lateness = self.allowed_lateness

        def expired(window: Any) -> bool:
            return bool(window.end + lateness < watermark)

        at, micros = shard.watermarks.input_watermark, lateness.micros
        for key_bytes, key_state in list(shard.keys.items()):
            state = key_state.state
            if isinstance(state, DefaultTriggerState):
                self._driver_of(key_state).forget_expired(state, at, micros)
                if not state:
                    shard.remove(key_bytes)
                continue
            bi.forget_expired_windows(state, expired)
            if bi.trigger_state_is_empty(state):
                shard.remove(key_bytes)

    def _settle(self, shard: ShardState) -> None:
        """Records each decoded key's next visit and earliest hold."""
        lateness = self.allowed_lateness.micros
        for key_bytes, key_state in shard.keys.items():
            state = key_state.state
            if isinstance(state, DefaultTriggerState):
                driver = self._driver_of(key_state)
                shard.visits[key_bytes] = driver.next_visit(state, lateness)
                hold = driver.earliest_hold(state)
            else:
                due = bi.trigger_state_next_work(state, lateness)
                shard.visits[key_bytes] = _ALWAYS if due is None else min(due, MAX_MICROS)
                hold = state.get_earliest_hold().micros
            if hold < MAX_MICROS:  # Beam's MAX_TIMESTAMP
                shard.holds[key_bytes] = hold
            else:
                shard.holds.pop(key_bytes, None)

    def hold(self, shard: ShardState) -> int:
        """The earliest watermark hold of the shard's keys (microseconds).

        A buffered window's holds as its keys' would be (Beam's earliest hold is a
        microsecond before the earliest element hold).
        """
        held = min(shard.holds.values(), default=MAX_MICROS)
        if shard.buffered:
            earliest = min(hold for _, hold in shard.buffered.values())
            if earliest < MAX_MICROS:
                held = min(held, earliest - 1)
        return held

    def encode(self, key: Any, pane: Any) -> bytes:
        """A pane as the GroupByKey's output element: ``KV<K, Iterable<V>>``."""
        return self.post_impl.encode_nested(pane.with_value((key, pane.value)))  # type: ignore[no-any-return]


_GROUPERS: collections.OrderedDict[str, StreamingGrouper] = collections.OrderedDict()
_MAX_CACHED = 64


def streaming_grouper(spec: GroupSpec) -> StreamingGrouper:
    """The grouper of ``spec`` in this process."""
    grouper = _GROUPERS.get(spec.cache_key)
    if grouper is None:
        grouper = StreamingGrouper(spec)
        _GROUPERS[spec.cache_key] = grouper
        while len(_GROUPERS) > _MAX_CACHED:
            _GROUPERS.popitem(last=False)
    spec.environment.enter()
    return grouper


def _window_tag(window: Any) -> bytes:
    """A window as the tag of its chunks: its ``window_token``, pickled."""
    import pickle

    return pickle.dumps(window_token(window), protocol=pickle.HIGHEST_PROTOCOL)


def run_group_shard(
    topology: Topology,
    node: Node,
    shard: int,
    spec: GroupSpec,
    state: ShardState | None,
    rows: Iterable[Any],
    chunks: ChunkStore | None = None,
) -> tuple[ShardState, list[Row]]:
    """One micro-batch of one GroupByKey shard: its new state and the rows it emits.

    ``chunks``: the shard's chunk store, where values wait for their window's on-time
    pane (without one they stay in the shard's state value).
    """
    if state is None:
        state = ShardState(WatermarkState(expected=node.expected))
    elements: dict[bytes, list[bytes]] = collections.defaultdict(list)
    markers = []
    for row in rows:
        if row[ELEMENT] is None:
            markers.append(marker_of(row))
        elif row[PORT] == KEYED_RUN:
            for key, element in keyed_run_elements(cell(row[ELEMENT])):
                elements[key].append(element)
        else:
            elements[bytes(row[KEY])].append(cell(row[ELEMENT]))
    grouper = streaming_grouper(spec)
    out: list[Row] = []
    # The grouping key goes along: a stateful reader shards by it.
    for key_bytes, key, pane in grouper.process(state, elements, markers, chunks):
        out.extend(output_rows(topology, node, 0, key_bytes, grouper.encode(key, pane)))
    output = state.watermarks.output(grouper.hold(state))
    out.extend(routed_marker(topology, node, shard, output, state.watermarks.processing_time))
    return state, out
