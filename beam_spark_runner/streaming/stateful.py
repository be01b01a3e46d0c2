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
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.stage_worker import (
    ELEMENT as STAGE_ELEMENT,
)
from beam_spark_runner.execution.stage_worker import (
    KEY as STAGE_KEY,
)
from beam_spark_runner.execution.stage_worker import (
    TAG,
    BundleOutputs,
    StageSpec,
    TaskSinks,
    stage_worker,
)
from beam_spark_runner.execution.timers import PendingTimers, TimerFamilyId
from beam_spark_runner.metrics import task_metrics
from beam_spark_runner.streaming.rows import (
    ELEMENT,
    Row,
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


def _run(spec: StageSpec, bundles: Iterator[BundleOutputs], out: list[BundleOutputs]) -> None:
    try:
        out.extend(bundles)
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
    cells: list[bytes] = []
    markers: list[Marker] = []
    for row in rows:
        if row[ELEMENT] is not None:
            cells.append(bytes(row[ELEMENT]))
        else:
            markers.append(marker_of(row))
    worker = stage_worker(spec)
    pending = PendingTimers(worker.timer_families)
    for family_key, encoded in state.timers.items():
        pending.add_written(family_key, encoded)
    worker.state.import_user_state(state.user_state)
    watermarks = state.watermarks
    outputs: list[BundleOutputs] = []
    try:
        with task_metrics(sinks.metrics, spec.name) as metrics:
            if cells:
                _run(spec, worker.process_with_timers(b"".join(cells), metrics, pending), outputs)
            watermarks.advance(markers)
            done = watermarks.input_watermark >= MAX_MICROS
            watermark = Timestamp(micros=watermarks.input_watermark)
            now = MAX_TIMESTAMP if done else Timestamp(micros=watermarks.processing_time)
            for _ in range(_MAX_TIMER_ROUNDS):
                due = pending.next_round(watermark, now)
                if not due:
                    break
                _run(spec, worker.process_with_timers(b"", metrics, pending, due), outputs)
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
            for tag, key, element in zip(
                batch.column(TAG).to_pylist(),
                batch.column(STAGE_KEY).to_pylist(),
                batch.column(STAGE_ELEMENT).to_pylist(),
                strict=True,
            ):
                out.extend(output_rows(topology, node, tag, key, element))
    return out
