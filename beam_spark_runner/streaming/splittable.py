"""Unbounded splittable DoFns in a streaming run: residuals kept in state between batches.

The stage that processes an unbounded splittable DoFn's elements and restrictions (Beam's
``expand_sdf`` gives it a Reshuffle in front) is a node of a stateful level, as the brief
recommends: a shard runs one bundle per micro-batch over its new elements and the residuals
whose requested resume time has come, and keeps the residuals the bundle returns (each
element, restriction and watermark-estimator state, as the SDK encoded it), with the time
to resume each and the output watermark each reported. Its output watermark is the minimum
of its input watermark and its residuals' reported watermarks, -inf for a residual that
reports none (as Beam's Prism runner does); once no residual is left and its input is at
+inf, it is +inf. Spark's checkpoint then covers the source's position too.
"""

from __future__ import annotations

import dataclasses
import pickle
import traceback
from collections.abc import Iterable
from typing import Any

from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.stage_worker import StageSpec, TaskSinks, stage_worker
from beam_spark_runner.metrics import task_metrics
from beam_spark_runner.streaming.rows import ELEMENT, Row, marker_of, routed_marker
from beam_spark_runner.streaming.stateful import routed_outputs
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
    MIN_MICROS,
    Marker,
    WatermarkState,
)


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


def _residual(root: Any, now: int) -> Residual:
    delay = root.requested_time_delay.ToMicroseconds()
    watermarks = [
        Timestamp.from_proto(w).micros for w in root.application.output_watermarks.values()
    ]
    return Residual(root.application.element, now + delay, min(watermarks, default=MIN_MICROS))


def run_splittable_shard(
    topology: Topology,
    node: Node,
    shard: int,
    spec: StageSpec,
    state: SplittableShardState | None,
    rows: Iterable[Any],
    sinks: TaskSinks,
) -> tuple[SplittableShardState, list[Row]]:
    """One micro-batch of one shard of an unbounded splittable DoFn's processing stage."""
    if state is None:
        state = SplittableShardState(WatermarkState(expected=node.expected))
    cells: list[bytes] = []
    markers: list[Marker] = []
    for row in rows:
        if row[ELEMENT] is not None:
            cells.append(bytes(row[ELEMENT]))
        else:
            markers.append(marker_of(row))
    watermarks = state.watermarks
    watermarks.advance(markers)
    now = watermarks.processing_time
    due = [r for r in state.residuals if r.resume_at <= now]
    waiting = [r for r in state.residuals if r.resume_at > now]
    data = b"".join([*cells, *(r.element for r in due)])
    outputs = []
    if data:
        worker = stage_worker(spec)
        try:
            with task_metrics(sinks.metrics, spec.name) as metrics:
                bundle, residuals = worker.run_bundle(data, metrics)
        except StageExecutionError:
            raise
        except Exception as error:  # noqa: BLE001 - re-raised with the stage's name
            raise StageExecutionError(spec.display_name, traceback.format_exc()) from error
        worker.finalize_bundles()
        outputs.append(bundle)
        waiting.extend(_residual(root, now) for root in residuals)
        out = routed_outputs(topology, node, spec, worker, outputs)
    else:
        out = []
    state.residuals = waiting
    output = watermarks.output(state.hold())
    out.extend(routed_marker(topology, node, shard, output, now))
    return state, out
