"""Stateful DoFns in a streaming run: one shard's keys per micro-batch, state kept between.

A stateful stage is a node of a stateful level (``levels``). Each micro-batch a shard
(``StatefulShard``, on ``shard_run``'s skeleton) loads its user state (the cells of Beam's
in-memory ``StateServicer``, every state kind) and pending timers; runs one bundle over its
new elements; advances its input watermark and fires the timers due, round by round, each
key's earliest first (``execution.timers``; all of them once the input is at +inf); emits
the outputs and its output watermark, the minimum of its input watermark and its timers'
holds; drops the user state and pending timers of the windows that expired, and the
elements that arrive in them (``window_expiry``); and stores state and timers as one value
in the state store.
"""

from __future__ import annotations

import contextlib
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
from beam_spark_runner.execution.timers import PendingTimers, TimerFamilyId
from beam_spark_runner.monitoring.metrics import task_metrics
from beam_spark_runner.streaming.rows import Row, elements_and_markers
from beam_spark_runner.streaming.shard_run import ShardRun, routed_outputs, run_user_code
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, Marker, WatermarkState
from beam_spark_runner.streaming.window_expiry import collect_expired, window_expiry


@dataclasses.dataclass
class StatefulShardState:
    """What one shard of a stateful stage keeps between micro-batches."""

    watermarks: WatermarkState
    user_state: Any = None
    timers: dict[TimerFamilyId, bytes] = dataclasses.field(default_factory=dict)

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

    def new_state(self, watermarks: WatermarkState) -> StatefulShardState:
        return StatefulShardState(watermarks)

    def decode(self, data: bytes) -> StatefulShardState:
        return StatefulShardState.decode(data)

    def encode(self, state: StatefulShardState) -> bytes:
        return state.encode()

    def read(self, node: Node, state: StatefulShardState, rows: Iterable[Any]) -> list[Marker]:
        self.cells, markers = elements_and_markers(rows)
        self.previous_watermark = state.watermarks.input_watermark
        for family_key, encoded in state.timers.items():
            self.pending.add_written(family_key, encoded)
        self.worker.state.import_user_state(state.user_state)
        return markers

    @contextlib.contextmanager
    def running(self, state: StatefulShardState) -> Iterator[None]:
        """The stage's metrics over its bundles; its user state exported, then let go."""
        try:
            with task_metrics(self.sinks.metrics, self.spec.name) as self.metrics:
                yield
            self.worker.finalize_bundles()
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
            state.user_state = collect_expired(expiry, state.user_state, self.pending, watermark)
        state.timers = self.pending.encoded()

    def hold(self, state: StatefulShardState) -> int:
        hold = self.pending.earliest_hold()
        return MAX_MICROS if hold is None else hold.micros - 1

    def rows(self, topology: Topology, node: Node, outputs: list[Any]) -> list[Row]:
        return routed_outputs(topology, node, self.spec, self.worker, outputs)
