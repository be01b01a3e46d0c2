"""Unbounded splittable DoFns in a streaming run: residuals kept in state between batches.

The stage that processes an unbounded splittable DoFn's elements and restrictions (Beam's
``expand_sdf`` gives it a Reshuffle in front) is a node of a stateful level, as the brief
recommends: a shard (``SplittableShard``, on the skeleton of ``shard_run``) runs one
bundle per micro-batch over its new elements and the residuals whose requested resume time
has come, and keeps the residuals the bundle returns (each element, restriction and
watermark-estimator state, as the SDK encoded it), with the time to resume each and the
output watermark each reported. Its output watermark is the minimum of its input watermark
and its residuals' reported watermarks, -inf for a residual that reports none (as Beam's
Prism runner does); once no residual is left and its input is at +inf, it is +inf. Spark's
checkpoint then covers the source's position too. Its state stays cached in the worker
between batches, its changes logged in the state store (``state_cache``): what a batch
writes is its watermarks, which residuals it resumed (by position) and those it added
(``changes``, ``replay``), not the residuals still waiting.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner.execution.stage_worker import (
    BundleOutputs,
    StageSpec,
    TaskSinks,
    stage_worker,
)
from beam_spark_runner.monitoring.metrics import task_metrics
from beam_spark_runner.streaming.rows import Row, elements_and_markers
from beam_spark_runner.streaming.shard_run import ShardRun, routed_outputs, run_user_code
from beam_spark_runner.streaming.side_input_state import SideInputShardState, WaitingStore
from beam_spark_runner.streaming.side_inputs import (
    SideInputShard,
    SideInputStageSpec,
    coders_of,
    load_side_inputs,
    ready_needs,
)
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
    MIN_MICROS,
    Marker,
    WatermarkState,
)

# What a batch changed (``SplittableShard.changes``, ``SplittableSideInputShard.changes``),
# tagged.
_CHANGES = "beam-spark-splittable-changes-v1"
_SIDE_CHANGES = "beam-spark-splittable-side-input-changes-v1"
# A change reaching this share of the base, both compressed, is written as a new base
# (``state_cache.run_logged``): where every residual resumes each batch, a change holds
# them all, and logging it, kept in the header too, would write more than the whole value.
PACKED_SHARE = 0.25


@dataclasses.dataclass(frozen=True)
class Residual:
    """A deferred remainder: the encoded element, when to resume it, its watermark."""

    element: bytes
    resume_at: int
    watermark: int


@dataclasses.dataclass
class SplittableShardState:
    """What one shard of an unbounded splittable DoFn keeps between micro-batches."""

    watermarks: WatermarkState
    residuals: list[Residual] = dataclasses.field(default_factory=list)

    def encode(self) -> bytes:
        """One state-store value."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def decode(data: bytes) -> SplittableShardState:
        """The state ``encode`` wrote."""
        state = pickle.loads(data)
        assert isinstance(state, SplittableShardState)
        return state

    def hold(self) -> int:
        """The minimum watermark the residuals reported (+inf without residuals)."""
        return min((r.watermark for r in self.residuals), default=MAX_MICROS)


def _replay_residuals(state: Any, resumed: list[int], added: list[Residual]) -> None:
    """Drops the residuals at the positions ``resumed``, then adds ``added``."""
    if resumed:
        gone = set(resumed)
        state.residuals = [r for i, r in enumerate(state.residuals) if i not in gone]
    state.residuals.extend(added)


def _residual(root: Any, now: int) -> Residual:
    delay = root.requested_time_delay.ToMicroseconds()
    watermarks = [
        Timestamp.from_proto(w).micros for w in root.application.output_watermarks.values()
    ]
    return Residual(root.application.element, now + delay, min(watermarks, default=MIN_MICROS))


class SplittableShard(ShardRun[SplittableShardState, BundleOutputs]):
    """One micro-batch of an unbounded splittable DoFn's shard: new elements and due residuals."""

    def __init__(self, spec: StageSpec, sinks: TaskSinks) -> None:
        self.spec = spec
        self.sinks = sinks
        self.cells: list[bytes] = []
        self.worker: Any = None
        self.waiting: list[Residual] | None = None
        # What ``changes`` writes: the positions of the residuals the batch resumed, in the
        # state as it found it, and the residuals its bundle returned.
        self.resumed: list[int] = []
        self.added: list[Residual] = []

    def new_state(self, watermarks: WatermarkState) -> SplittableShardState:
        return SplittableShardState(watermarks)

    def changes(self, state: SplittableShardState) -> bytes:
        """What the batch changed: its watermarks, the residuals it resumed and added."""
        change = (_CHANGES, state.watermarks, self.resumed, self.added)
        return pickle.dumps(change, protocol=pickle.HIGHEST_PROTOCOL)

    def replay(self, state: SplittableShardState, changes: bytes) -> None:
        """Applies what ``changes`` wrote to the state as it was before that batch."""
        layout, watermarks, resumed, added = pickle.loads(changes)
        assert layout == _CHANGES, f"expected a splittable DoFn shard's changes, found {layout!r}"
        state.watermarks = watermarks
        _replay_residuals(state, resumed, added)

    def decode(self, data: bytes) -> SplittableShardState:
        return SplittableShardState.decode(data)

    def encode(self, state: SplittableShardState) -> bytes:
        return state.encode()

    def read(self, node: Node, state: SplittableShardState, rows: Iterable[Any]) -> list[Marker]:
        self.cells, markers = elements_and_markers(rows)
        return markers

    def after_watermark(self, state: SplittableShardState) -> Iterator[BundleOutputs]:
        """One bundle over the new elements and the residuals whose resume time has come."""
        now = state.watermarks.processing_time
        self.resumed = [i for i, r in enumerate(state.residuals) if r.resume_at <= now]
        data = b"".join([*self.cells, *(state.residuals[i].element for i in self.resumed)])
        if data:
            worker = self.worker = stage_worker(self.spec)
            with task_metrics(self.sinks.metrics, self.spec.name) as metrics:
                bundle, residuals = run_user_code(
                    self.spec, lambda: worker.run_bundle(data, metrics)
                )
            worker.finalize_bundles()
            self.added = [_residual(root, now) for root in residuals]
            self.waiting = [r for r in state.residuals if r.resume_at > now]
            self.waiting.extend(self.added)
            yield bundle

    def finish(self, state: SplittableShardState) -> None:
        if self.waiting is not None:
            state.residuals = self.waiting

    def hold(self, state: SplittableShardState) -> int:
        return state.hold()

    def rows(self, topology: Topology, node: Node, outputs: list[Any]) -> list[Row]:
        return routed_outputs(topology, node, self.spec, self.worker, outputs) if outputs else []


@dataclasses.dataclass
class SplittableSideInputShardState(SideInputShardState):
    """A stage with side inputs' state, plus an unbounded splittable DoFn's residuals."""

    residuals: list[Residual] = dataclasses.field(default_factory=list)


class SplittableSideInputShard(SideInputShard):
    """One micro-batch of an unbounded splittable DoFn reading streamed side inputs.

    Its input elements wait for their side inputs as a stage's do (``side_inputs``); once
    ready they run, with the residuals due, in one bundle served the side inputs the state
    holds: a residual reads its window's side value as it is when it resumes (for the
    global window under a repeated trigger, the latest firing).
    """

    def __init__(self, spec: SideInputStageSpec, sinks: TaskSinks, store: WaitingStore) -> None:
        super().__init__(spec, sinks, store)
        self.waiting: list[Residual] = []
        # As ``SplittableShard``'s: the positions of the residuals resumed, those added.
        self.resumed: list[int] = []
        self.added: list[Residual] = []

    def new_state(self, watermarks: WatermarkState) -> SplittableSideInputShardState:
        return SplittableSideInputShardState(watermarks, [[] for _ in self.spec.side_inputs])

    def decode(self, data: bytes) -> SplittableSideInputShardState:
        return SplittableSideInputShardState.decode(data)

    def changes(self, state: Any) -> bytes:
        """What the batch changed: as a stage with side inputs', and its residuals'."""
        change = (_SIDE_CHANGES, state.changes(), self.resumed, self.added)
        return pickle.dumps(change, protocol=pickle.HIGHEST_PROTOCOL)

    def replay(self, state: Any, changes: bytes) -> None:
        """Applies what ``changes`` wrote to the state as it was before that batch."""
        layout, side, resumed, added = pickle.loads(changes)
        assert layout == _SIDE_CHANGES, (
            f"expected a splittable side-input shard's changes, found {layout!r}"
        )
        state.replay(side)
        _replay_residuals(state, resumed, added)

    def after_watermark(self, state: Any) -> Iterator[BundleOutputs]:
        """One bundle over the input elements now ready and the residuals now due."""
        now = state.watermarks.processing_time
        ready = state.take_ready(ready_needs(state, self.side_expected), self.store)
        self.resumed = [i for i, r in enumerate(state.residuals) if r.resume_at <= now]
        due = [state.residuals[i] for i in self.resumed]
        self.waiting = [r for r in state.residuals if r.resume_at > now]
        data = b"".join([*ready, *(r.element for r in due)])
        if not data:
            return
        spec = self.spec
        worker = self.worker = stage_worker(spec.stage)
        load_side_inputs(worker, spec, state)
        with task_metrics(self.sinks.metrics, spec.stage.name) as metrics:
            bundle, residuals = run_user_code(spec.stage, lambda: worker.run_bundle(data, metrics))
        worker.finalize_bundles()
        self.added = [_residual(root, now) for root in residuals]
        self.waiting.extend(self.added)
        yield bundle

    def finish(self, state: Any) -> None:
        state.residuals = self.waiting
        super().finish(state)

    def earliest_kept(self, state: Any) -> int:
        """The residuals' elements' earliest timestamp: they read their windows again."""
        decode = coders_of(self.spec).input_impl.decode_nested
        return min(
            (decode(r.element).timestamp.micros for r in state.residuals), default=MAX_MICROS
        )

    def hold(self, state: Any) -> int:
        residuals = min((r.watermark for r in state.residuals), default=MAX_MICROS)
        return min(super().hold(state), residuals)
