"""Stateful DoFns in a streaming run: one shard's keys per micro-batch, state kept between.

A stateful stage is a node of a stateful level (``levels``). Each micro-batch a shard
(``StatefulShard``, on ``shard_run``'s skeleton) loads its user state (the cells of Beam's
in-memory ``StateServicer``, every state kind) and pending timers; runs one bundle over its
new elements; advances its input watermark and fires the timers due, round by round, each
key's earliest first (``execution.timers``; all of them once the input is at +inf); emits
the outputs and its output watermark, the minimum of its input watermark and its timers'
holds; drops the user state and pending timers of the windows that expired, and the
elements that arrive in them (``window_expiry``, looked for only once the watermark passes
the earliest expiry of the shard's cells, ``StatefulShardState.next_expiry``). Its state
stays cached in the worker between batches, its changes logged in the state store
(``state_cache``): what a batch writes is the cells it read or wrote (the servicer tells
them: ``InMemoryStateBackend.touched_user_state``) and those that expired, its watermarks,
and the timers it set, cleared or fired (``PendingTimers.changes``; ``changes``,
``replay``). Its pending timers stay decoded in the cached state (``pending``), indexed by
when they are due (``execution.timer_index``), encoded per family only where the whole
state is written.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import pickle
from collections.abc import Generator, Iterable, Iterator
from typing import Any

from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.stage_worker import (
    BundleOutputs,
    StageSpec,
    TaskSinks,
    stage_worker,
)
from beam_spark_runner.execution.timer_index import HeldTimers
from beam_spark_runner.execution.timers import PendingTimers, TimerFamilyId
from beam_spark_runner.monitoring.metrics import task_metrics
from beam_spark_runner.streaming.rows import Row, elements_and_markers
from beam_spark_runner.streaming.shard_run import ShardRun, routed_outputs, run_user_code
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, MIN_MICROS, Marker, WatermarkState
from beam_spark_runner.streaming.window_expiry import WindowExpiry, window_expiry

# What a batch changed (``StatefulShard.changes``), tagged; and the changes of the layout
# that wrote every pending timer in a batch that changed one (still replayed).
_CHANGES = "beam-spark-stateful-changes-v2"
_CHANGES_TIMERS_WHOLE = "beam-spark-stateful-changes-v1"


@dataclasses.dataclass
class StatefulShardState:
    """What one shard of a stateful stage keeps between micro-batches."""

    watermarks: WatermarkState
    user_state: Any = None
    # The pending timers encoded per family, as the state store holds them; decoded into
    # ``pending`` at the shard's first use of them.
    timers: dict[TimerFamilyId, bytes] = dataclasses.field(default_factory=dict)
    # At most the watermark past which a cell of ``user_state`` expires (None: not known;
    # a state pickled before it has none), so a batch before it looks at no cell.
    next_expiry: int | None = None
    # The pending timers decoded and indexed by when they are due (None: still in
    # ``timers``); never stored.
    pending: HeldTimers | None = None

    def encode(self) -> bytes:
        """One state-store value."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decode(data: bytes) -> StatefulShardState:
        """The state ``encode`` wrote."""
        state = pickle.loads(data)
        assert isinstance(state, StatefulShardState)
        return state


class StatefulShard(ShardRun[StatefulShardState, BundleOutputs]):
    """One micro-batch of a stateful stage's shard: a bundle, then its timers' bundles."""

    def __init__(self, spec: StageSpec, sinks: TaskSinks) -> None:
        self.spec = spec
        self.sinks = sinks
        self.worker = stage_worker(spec)
        self.pending = PendingTimers(self.worker.timer_families)
        self.cells: list[bytes] = []
        self.metrics: Any = None
        # The input watermark before this batch's markers.
        self.previous_watermark = MAX_MICROS
        # The user-state cells this batch used (None: any may have changed) and those that
        # expired: what ``changes`` writes, with the timers ``pending`` set, cleared or fired.
        self.touched: set[bytes] | None = set()
        self.expired: set[bytes] = set()

    def new_state(self, watermarks: WatermarkState) -> StatefulShardState:
        return StatefulShardState(watermarks)

    def decode(self, data: bytes) -> StatefulShardState:
        return StatefulShardState.decode(data)

    def encode(self, state: StatefulShardState) -> bytes:
        stored = copy.copy(state)
        stored.timers, stored.pending = self.timers_of(state).encoded(), None
        return stored.encode()

    def timers_of(self, state: Any) -> PendingTimers:
        """``state``'s pending timers, decoded from their stored form at the first call."""
        families = self.worker.timer_families
        if state.pending is None:
            pending = PendingTimers(families)
            for family_key, encoded in state.timers.items():
                pending.add_written(family_key, encoded)
            state.pending, state.timers = pending.held, {}
        return PendingTimers(families, state.pending)

    def read(self, node: Node, state: StatefulShardState, rows: Iterable[Any]) -> list[Marker]:
        self.cells, markers = elements_and_markers(rows)
        self.take_state(state)
        return markers

    def take_state(self, state: Any) -> None:
        """Starts the batch on ``state``'s timers and user state, its watermark noted."""
        self.previous_watermark = state.watermarks.input_watermark
        self.pending = self.timers_of(state)
        self.worker.state.import_user_state(state.user_state)

    def changes(self, state: StatefulShardState) -> bytes:
        """What the batch changed: its cells used or expired, watermarks, timers it touched."""
        return pickle.dumps((_CHANGES, self.user_changes(state)), protocol=pickle.HIGHEST_PROTOCOL)

    def replay(self, state: StatefulShardState, changes: bytes) -> None:
        """Applies what ``changes`` wrote to the state as it was before that batch."""
        layout, user = pickle.loads(changes)
        assert layout in (_CHANGES, _CHANGES_TIMERS_WHOLE), (
            f"expected a stateful DoFn shard's changes, found {layout!r}"
        )
        self.replay_user(state, user, timers_whole=layout == _CHANGES_TIMERS_WHOLE)

    def user_changes(self, state: Any) -> tuple[Any, ...]:
        """The changes to what every stateful shard keeps (``changes``), not encoded."""
        empty: tuple[dict[bytes, list[bytes]], dict[bytes, Any]] = ({}, {})
        cells, ordered = state.user_state or empty
        whole: tuple[dict[bytes, list[bytes]], dict[bytes, Any]] | None = None
        changed: list[tuple[bytes, Any, Any]] | None = None
        if self.touched is None:
            whole = (dict(cells), ordered)
        else:
            # Sorted, not in the set's order: that hangs on the hash seed, and a replay adds
            # new cells in this order, so the state read back would too.
            used = sorted(self.touched | self.expired)
            changed = [(key, cells.get(key), ordered.get(key)) for key in used]
        return (state.watermarks, self.pending.changes(), state.next_expiry, whole, changed)

    def replay_user(self, state: Any, user: tuple[Any, ...], timers_whole: bool = False) -> None:
        """Applies what ``user_changes`` returned to the state as it was before that batch.

        ``timers_whole``: its timers are every pending timer (None: unchanged), not those
        the batch set, cleared or fired.
        """
        watermarks, timers, next_expiry, whole, changed = user
        if whole is not None:
            state.user_state = (collections.defaultdict(list, whole[0]), whole[1])
        else:
            if state.user_state is None:
                state.user_state = (collections.defaultdict(list), {})
            cells, ordered = state.user_state
            for key, values, index in changed:
                if values:
                    cells[key] = values
                else:
                    cells.pop(key, None)
                if index is None:
                    ordered.pop(key, None)
                else:
                    ordered[key] = index
        state.watermarks = watermarks
        if not timers_whole:
            pending = self.timers_of(state)
            for family_key, encoded in timers.items():
                pending.add_written(family_key, encoded)
        elif timers is not None:
            state.timers, state.pending = timers, None
        state.next_expiry = next_expiry

    @contextlib.contextmanager
    def running(self, state: StatefulShardState) -> Iterator[None]:
        """The stage's metrics over its bundles; its user state exported, then let go."""
        try:
            with task_metrics(self.sinks.metrics, self.spec.name) as self.metrics:
                yield
            self.worker.finalize_bundles()
            self.touched = self.worker.state.touched_user_state()
            state.user_state = self.worker.state.export_user_state()
        finally:
            self.worker.state.release_user_state()

    def _bundles(self, data: bytes, timers: Any = None) -> list[BundleOutputs]:
        worker, pending = self.worker, self.pending
        return run_user_code(
            self.spec,
            lambda: list(worker.process_with_timers(data, self.metrics, pending, timers)),
        )

    def before_watermark(
        self, state: StatefulShardState, markers: list[Marker]
    ) -> Iterator[BundleOutputs]:
        if self.cells:
            expiry = window_expiry(self.spec.descriptor, self.spec.input_transform_id)
            data = expiry.on_time(b"".join(self.cells), self.previous_watermark)
            if data:
                yield from self._bundles(data)

    def timer_round(
        self, state: StatefulShardState, watermark: Timestamp, now: Timestamp
    ) -> Generator[BundleOutputs, None, bool]:
        due = self.pending.next_round(watermark, now)
        if not due:
            return False
        yield from self._bundles(b"", due)
        return True

    def timers_keep_coming(self, rounds: int) -> Exception:
        return StageExecutionError(
            self.spec.display_name,
            f"Timers fired {rounds} rounds in one micro-batch and keep "
            "coming: a timer callback re-arms a timer at or before the current time.",
        )

    def finish(self, state: StatefulShardState) -> None:
        watermark = state.watermarks.input_watermark
        if self.cells or self.pending.fired or watermark > self.previous_watermark:
            # After the timer rounds: a window's timers due by its expiry have fired.
            expiry = window_expiry(self.spec.descriptor, self.spec.input_transform_id)
            expiry.forget_expired_timers(self.pending, watermark)
            self._forget_expired_cells(expiry, state, watermark)

    def _forget_expired_cells(
        self, expiry: WindowExpiry, state: StatefulShardState, watermark: int
    ) -> None:
        """Drops the cells of expired windows, looking at them only if one may have."""
        if not state.user_state:
            return
        cells, ordered = state.user_state
        if state.next_expiry is not None and self.touched is not None:
            used = [key for key in self.touched if key in cells or key in ordered]
            state.next_expiry = min(state.next_expiry, expiry.scan(used, MIN_MICROS)[1])
            if watermark <= state.next_expiry:
                return
        self.expired, state.next_expiry = expiry.scan([*cells, *ordered], watermark)
        for key in self.expired:
            cells.pop(key, None)
            ordered.pop(key, None)

    def hold(self, state: StatefulShardState) -> int:
        hold = self.pending.earliest_hold()
        return MAX_MICROS if hold is None else hold.micros - 1

    def rows(self, topology: Topology, node: Node, outputs: list[Any]) -> list[Row]:
        return routed_outputs(topology, node, self.spec, self.worker, outputs)
