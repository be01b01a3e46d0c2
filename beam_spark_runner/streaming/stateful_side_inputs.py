"""Stateful DoFns reading streamed side inputs: main elements wait, then run with state.

A stateful stage whose side inputs stream is a node of a stateful level whose shard
(``StatefulSideInputShard``) is a stateful DoFn's (``stateful.StatefulShard``: user state
and pending timers kept between micro-batches) that keeps its main elements waiting as a
stage with side inputs does (``side_inputs``): side-input elements reach every shard and
stay in its state; main elements, sharded by key, wait in the level's list state until each
side input is ready for their window (its watermark past the end of the window they map
to, or a trigger firing of that window), then run in one bundle with the side inputs
served from state. Event-time timers fire at the main input's watermark held back to
before the earliest waiting element (as Dataflow holds a stateful DoFn's timers behind its
blocked elements): an element that came earlier sets its state before a later timer reads
it. The output watermark is held by both the timers and the waiting elements.
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterable, Iterator
from typing import Any

from beam_spark_runner.execution.stage_worker import BundleOutputs, TaskSinks
from beam_spark_runner.execution.timer_index import HeldTimers, TimerFamilyId
from beam_spark_runner.streaming.side_input_state import SideInputShardState, WaitingStore
from beam_spark_runner.streaming.side_inputs import (
    SideInputStageSpec,
    coders_of,
    forget_unreachable,
    load_side_inputs,
    read_rows,
    ready_needs,
)
from beam_spark_runner.streaming.stateful import StatefulShard
from beam_spark_runner.streaming.topology import Node
from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
    Marker,
    WatermarkState,
    input_watermark,
)

# What a batch changed (``StatefulSideInputShard.changes``), tagged; and the changes of the
# layouts before, still replayed: side inputs and buckets whole (v2), and pending timers
# whole too (v1).
_CHANGES = "beam-spark-stateful-side-input-changes-v3"
_CHANGES_SIDES_WHOLE = "beam-spark-stateful-side-input-changes-v2"
_CHANGES_TIMERS_WHOLE = "beam-spark-stateful-side-input-changes-v1"


@dataclasses.dataclass
class StatefulSideInputShardState(SideInputShardState):
    """A stage with side inputs' state, plus a stateful DoFn's user state and timers."""

    user_state: Any = None
    timers: dict[TimerFamilyId, bytes] = dataclasses.field(default_factory=dict)
    # As ``StatefulShardState``'s.
    next_expiry: int | None = None
    pending: HeldTimers | None = None


class StatefulSideInputShard(StatefulShard):
    """One micro-batch of a stateful stage with streamed side inputs: ready elements, timers."""

    def __init__(self, spec: SideInputStageSpec, sinks: TaskSinks, store: WaitingStore) -> None:
        super().__init__(spec.stage, sinks)
        self.side_spec = spec
        self.store = store
        self.side_expected: tuple[frozenset[str], ...] = ()
        self.main_expected: frozenset[str] = frozenset()

    def new_state(self, watermarks: WatermarkState) -> Any:
        return StatefulSideInputShardState(
            watermarks, [[] for _ in self.side_spec.side_inputs], fired=[]
        )

    def decode(self, data: bytes) -> Any:
        return StatefulSideInputShardState.decode(data)

    def read(self, node: Node, state: Any, rows: Iterable[Any]) -> list[Marker]:
        """Side-input elements into the state, main elements into their buckets."""
        self.spec.environment.enter()
        markers = read_rows(node, state, rows, coders_of(self.side_spec))
        self.side_expected = node.side_expected
        self.main_expected = node.main_expected
        self.cells = []
        self.take_state(state)
        return markers

    def changes(self, state: Any) -> bytes:
        """What the batch changed: as a stage with side inputs' and as a stateful DoFn's."""
        return pickle.dumps(
            (_CHANGES, state.changes(), self.user_changes(state)),
            protocol=pickle.HIGHEST_PROTOCOL,
        )

    def replay(self, state: Any, changes: bytes) -> None:
        """Applies what ``changes`` wrote to the state as it was before that batch."""
        layout, side, user = pickle.loads(changes)
        assert layout in (_CHANGES, _CHANGES_SIDES_WHOLE, _CHANGES_TIMERS_WHOLE), (
            f"expected a stateful side-input shard's changes, found {layout!r}"
        )
        if layout == _CHANGES:
            state.replay(side)
        else:
            state.sides, state.buckets, state.waiting, state.fired, state.ends = side
            state.sides_replaced()
        self.replay_user(state, user, timers_whole=layout == _CHANGES_TIMERS_WHOLE)

    def before_watermark(self, state: Any, markers: list[Marker]) -> Iterator[BundleOutputs]:
        yield from ()

    def after_watermark(self, state: Any) -> Iterator[BundleOutputs]:
        """One bundle over the main elements whose side inputs are ready."""
        ready = state.take_ready(ready_needs(state, self.side_expected), self.store)
        if ready or self.pending:
            # Timers' outputs too may reach a step of the stage that reads side inputs.
            load_side_inputs(self.worker, self.side_spec, state)
        if ready:
            yield from self._bundles(b"".join(ready))

    def timer_watermark(self, state: Any) -> int:
        main = input_watermark(self.main_expected, state.watermarks.producers)
        return min(main, self._waiting_hold(state) - 1)

    def finish(self, state: Any) -> None:
        super().finish(state)
        main = input_watermark(self.main_expected, state.watermarks.producers)
        # A pending timer's outputs may reach a step reading side inputs.
        timers = self.pending.earliest_hold()
        earliest = MAX_MICROS if timers is None else timers.micros
        forget_unreachable(state, coders_of(self.side_spec), main, earliest)
        state.store_new(self.store)

    def _waiting_hold(self, state: Any) -> int:
        return min((bucket[1] for bucket in state.buckets.values()), default=MAX_MICROS + 1)

    def hold(self, state: Any) -> int:
        return min(super().hold(state), self._waiting_hold(state))

    def main_input_watermark(self, node: Node, state: Any) -> int:
        return input_watermark(node.main_expected, state.watermarks.producers)
