"""Stateful DoFns in a streaming run: one shard's keys per micro-batch, state kept between.

A stateful stage is a node of a stateful level (``levels``). For each micro-batch a shard:

1. loads its user state (the cells of Beam's in-memory ``StateServicer``, which serves
   every state kind: bag, value, combining, set, map, ordered list) and its pending timers;
2. runs one bundle over the shard's new elements (state requests are served from memory);
3. advances its input watermark from the markers, then fires the timers now due (event
   time at or before the input watermark, processing time at or before the runner's
   processing time; once the input is at +inf, all of them, as a bounded run ends), round
   by round, each key's earliest first, until none are due (``execution.timers``);
4. emits the outputs to the stage's readers and its output watermark: the minimum of its
   input watermark and its pending timers' output timestamps (their holds);
5. stores the state and the pending timers, one value in the state store.
"""

from __future__ import annotations

import dataclasses
import pickle
import traceback
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.stage_worker import (
    BundleOutputs,
    StageSpec,
    TaskSinks,
    stage_worker,
)
from beam_spark_runner.execution.timers import PendingTimers, TimerFamilyId
from beam_spark_runner.monitoring.metrics import task_metrics
from beam_spark_runner.streaming.rows import (
    Row,
    elements_and_markers,
    routed_marker,
    stage_output_rows,
)
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
    WatermarkState,
)

T = TypeVar("T")

# Timer rounds in one micro-batch before the runner says the timers keep re-arming.
_MAX_TIMER_ROUNDS = 10_000


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


def run_user_code(spec: StageSpec, call: Callable[[], T]) -> T:
    """``call()``; a user error is raised as a ``StageExecutionError`` naming the stage."""
    try:
        return call()
    except StageExecutionError:
        raise
    except Exception as error:  # noqa: BLE001 - re-raised with the stage's name
        raise StageExecutionError(spec.display_name, traceback.format_exc()) from error


def run_stateful_shard(
    topology: Topology,
    node: Node,
    shard: int,
    spec: StageSpec,
    state: StatefulShardState | None,
    rows: Iterable[Any],
    sinks: TaskSinks,
) -> tuple[StatefulShardState, list[Row]]:
    """One micro-batch of one shard of a stateful stage: its new state and its rows."""
    if state is None:
        state = StatefulShardState(WatermarkState(expected=node.expected))
    cells, markers = elements_and_markers(rows)
    worker = stage_worker(spec)
    pending = PendingTimers(worker.timer_families)
    for family_key, encoded in state.timers.items():
        pending.add_written(family_key, encoded)
    worker.state.import_user_state(state.user_state)
    watermarks = state.watermarks
    outputs: list[BundleOutputs] = []
    try:
        with task_metrics(sinks.metrics, spec.name) as metrics:

            def bundles(data: bytes, timers: Any = None) -> list[BundleOutputs]:
                return run_user_code(
                    spec, lambda: list(worker.process_with_timers(data, metrics, pending, timers))
                )

            if cells:
                outputs += bundles(b"".join(cells))
            watermarks.advance(markers)
            done = watermarks.input_watermark >= MAX_MICROS
            watermark = Timestamp(micros=watermarks.input_watermark)
            now = MAX_TIMESTAMP if done else Timestamp(micros=watermarks.processing_time)
            for _ in range(_MAX_TIMER_ROUNDS):
                due = pending.next_round(watermark, now)
                if not due:
                    break
                outputs += bundles(b"", due)
            else:
                raise StageExecutionError(
                    spec.display_name,
                    f"Timers fired {_MAX_TIMER_ROUNDS} rounds in one micro-batch and keep "
                    "coming: a timer callback re-arms a timer at or before the current time.",
                )
        worker.finalize_bundles()
        state.user_state = worker.state.export_user_state()
    finally:
        worker.state.release_user_state()
    state.timers = pending.encoded()
    hold = pending.earliest_hold()
    output = watermarks.output(MAX_MICROS if hold is None else hold.micros - 1)
    out = routed_outputs(topology, node, spec, worker, outputs)
    out.extend(routed_marker(topology, node, shard, output, watermarks.processing_time))
    return state, out


def routed_outputs(
    topology: Topology, node: Node, spec: StageSpec, worker: Any, outputs: list[BundleOutputs]
) -> list[Row]:
    """A stage's bundle outputs as rows addressed to the readers of each output."""
    out: list[Row] = []
    for bundle in outputs:
        for batch in bundle.record_batches(spec.outputs, worker.key_extractors):
            out.extend(stage_output_rows(topology, node, batch))
    return out
