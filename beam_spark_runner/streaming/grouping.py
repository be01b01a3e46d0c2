"""GroupByKey in a streaming run: Beam's trigger driver over one shard's keys, per micro-batch.

A stateful level runs as ``groupBy(target, shard).transformWithState`` (time mode none):
Spark calls the level's processor once per (node, shard) with that micro-batch's rows.
Every shard gets every producer's marker every batch, so it runs every batch. For a
GroupByKey shard it:

1. runs each key's new elements through Beam's streaming ``GeneralTriggerDriver`` (under
   the default trigger over non-merging windows, the runner's ``DefaultTriggerDriver``,
   which gives the same panes: ``streaming.default_trigger``) against the shard's
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

The shard's keys, their trigger-driver state (Beam's ``InMemoryUnmergedState``) and its
watermarks are one value in Spark's state store, read once and written once per batch:
two state calls per shard and batch, none per key or element (see docs/architecture.md).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.transforms import trigger
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner import beam_globals
from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.grouping import GroupSpec
from beam_spark_runner.streaming.default_trigger import (
    DefaultTriggerDriver,
    DefaultTriggerState,
)
from beam_spark_runner.streaming.default_trigger import applies as default_trigger_applies
from beam_spark_runner.streaming.rows import (
    ELEMENT,
    KEY,
    KEYED_RUN,
    PORT,
    Row,
    keyed_run_elements,
    marker_of,
    output_rows,
    routed_marker,
)
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
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


@dataclasses.dataclass
class ShardState:
    """Everything one GroupByKey shard keeps between micro-batches."""

    watermarks: WatermarkState
    keys: dict[bytes, KeyState] = dataclasses.field(default_factory=dict)


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


def encode_shard_state(shard: ShardState) -> bytes:
    """The shard's state as one state-store value (cloudpickle: windows may be user types)."""
    from pyspark import cloudpickle

    keys = {
        k: (v.key, v.state if isinstance(v.state, DefaultTriggerState) else _plain(v.state))
        for k, v in shard.keys.items()
    }
    return cloudpickle.dumps((shard.watermarks, keys))  # type: ignore[no-any-return]


def decode_shard_state(data: bytes) -> ShardState:
    """The shard state ``encode_shard_state`` wrote."""
    import pickle

    watermarks, keys = pickle.loads(data)
    return ShardState(
        watermarks,
        {
            k: KeyState(key, plain if isinstance(plain, DefaultTriggerState) else _restored(plain))
            for k, (key, plain) in keys.items()
        },
    )


class StreamingGrouper:
    """One GroupByKey's coders and trigger driver, built once per worker process.

    Under the default trigger over non-merging windows the driver is the runner's
    ``DefaultTriggerDriver`` (the same panes, a fraction of the Python); otherwise it is
    Beam's ``GeneralTriggerDriver``. ``beam_driver`` forces Beam's (tests compare them).
    """

    def __init__(self, spec: GroupSpec, beam_driver: bool = False) -> None:
        beam_globals.enter_run(spec.run_id, spec.pickle_library, spec.main_session)
        context = bi.PipelineContext(bi.beam_runner_api_pb2.Components.FromString(spec.components))
        self.name = spec.name
        self.pre_impl = context.coders[spec.pre_grouping_coder_id].get_impl()
        self.post_impl = context.coders[spec.post_grouping_coder_id].get_impl()
        self.windowing = context.windowing_strategies[spec.windowing_strategy_id]
        self.clock = _Clock(0)
        self.driver = trigger.create_trigger_driver(self.windowing, clock=self.clock)
        self.default: DefaultTriggerDriver | None = (
            DefaultTriggerDriver(self.windowing)
            if not beam_driver and default_trigger_applies(self.windowing)
            else None
        )
        self.allowed_lateness = self.windowing.allowed_lateness

    def process(
        self,
        shard: ShardState,
        elements: dict[bytes, list[bytes]],
        markers: list[Marker],
    ) -> Iterator[Any]:
        """Runs one micro-batch of a shard; yields (key bytes, key, pane) per pane fired."""
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
            key_state = shard.keys.get(key_bytes)
            if key_state is None:
                new_state = DefaultTriggerState() if self.default else bi.trigger_state()
                key_state = KeyState(values[0].value[0], new_state)
                shard.keys[key_bytes] = key_state
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
        yield from self._fire_timers(shard)
        self._collect_garbage(shard)

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
        for key_bytes, key_state in shard.keys.items():
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

        for key_bytes in list(shard.keys):
            state = shard.keys[key_bytes].state
            if isinstance(state, DefaultTriggerState):
                DefaultTriggerDriver.forget_expired(state, expired)
                if not state:
                    del shard.keys[key_bytes]
                continue
            bi.forget_expired_windows(state, expired)
            if bi.trigger_state_is_empty(state):
                del shard.keys[key_bytes]

    def hold(self, shard: ShardState) -> int:
        """The earliest watermark hold of the shard's keys (microseconds)."""
        holds = [
            DefaultTriggerDriver.earliest_hold(k.state)
            if isinstance(k.state, DefaultTriggerState)
            else k.state.get_earliest_hold()
            for k in shard.keys.values()
        ]
        return min((h.micros for h in holds), default=MAX_MICROS)

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
    beam_globals.enter_run(spec.run_id, spec.pickle_library, spec.main_session)
    return grouper


def run_group_shard(
    topology: Topology,
    node: Node,
    shard: int,
    spec: GroupSpec,
    state: ShardState | None,
    rows: Iterable[Any],
) -> tuple[ShardState, list[Row]]:
    """One micro-batch of one GroupByKey shard: its new state and the rows it emits."""
    if state is None:
        state = ShardState(WatermarkState(expected=node.expected))
    elements: dict[bytes, list[bytes]] = collections.defaultdict(list)
    markers = []
    for row in rows:
        if row[ELEMENT] is None:
            markers.append(marker_of(row))
        elif row[PORT] == KEYED_RUN:
            for key, element in keyed_run_elements(bytes(row[ELEMENT])):
                elements[key].append(element)
        else:
            elements[bytes(row[KEY])].append(bytes(row[ELEMENT]))
    grouper = streaming_grouper(spec)
    out: list[Row] = []
    # The grouping key goes along: a stateful reader shards by it.
    for key_bytes, key, pane in grouper.process(state, elements, markers):
        out.extend(output_rows(topology, node, 0, key_bytes, grouper.encode(key, pane)))
    output = state.watermarks.output(grouper.hold(state))
    out.extend(routed_marker(topology, node, shard, output, state.watermarks.processing_time))
    return state, out
