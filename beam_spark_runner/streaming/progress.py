"""What a running streaming query reports: element rates, batch time, the slowest transform.

Every few seconds the driver logs one line per query (on ``monitoring.job_progress``'s
progress logger, shown at Python's default level): the last micro-batch's id and duration,
the elements per second out of each source, and the transform whose output watermark is
furthest behind (every stateful node's shards send their output watermark to the driver
with each micro-batch), with its elements per second in and out and how far its watermark
lags the clock. Element counts are Beam's, which every bundle already reports with its
metrics (``monitoring.metrics.element_counts``): nothing more is sent per micro-batch.
Names are the Beam user's transform names. A query whose micro-batches keep taking longer
than its trigger interval says that it cannot keep up.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from beam_spark_runner.planning import BufferKind, Plan, PlannedStage
from beam_spark_runner.streaming.check import SDF_PROCESS_URN, is_unbounded_splittable
from beam_spark_runner.streaming.topology import STAGE, Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, MIN_MICROS

_LOGGER = logging.getLogger(__name__)

# Micro-batches in a row over the trigger interval before the query says it falls behind.
BEHIND_AFTER = 3
# A watermark further than this from the clock is event time of another kind (a replay, a
# test's made-up times): its distance to the clock is no lag.
_CLOCK_SECONDS = 30 * 24 * 3600.0

# A Beam stage's name and a PCollection id: where Beam counts a node's elements.
Counted = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Counts:
    """A node or source by its user name, and the element counts that are its input and output."""

    name: str
    inputs: tuple[Counted, ...] = ()
    outputs: tuple[Counted, ...] = ()


@dataclasses.dataclass(frozen=True)
class ProgressPlan:
    """What progress lines name and count, from the plan and its topology."""

    # A node's index (a shard's producer id's part before '#'), or a source's producer id
    # -> its name and counts.
    nodes: Mapping[int | str, Counts]
    sources: tuple[Counts, ...] = ()
    # Why event time is not the clock's (a TestStream's made-up times), or None.
    not_clock_time: str | None = None


def _when(micros: int) -> str:
    if micros >= MAX_MICROS:
        return "+inf (done)"
    if micros <= MIN_MICROS:
        return "-inf (nothing yet)"
    moment = datetime.datetime.fromtimestamp(micros / 1e6, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _rate(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


@dataclasses.dataclass
class ProgressReport:
    """Builds the progress lines of one query from Spark's progress, watermarks and counts."""

    job_name: str
    trigger_seconds: float
    plan: ProgressPlan
    slow_batches: int = 0
    last_batch: int = -1
    last_duration: float = 0.0
    warned: bool = False
    # The counts and the monotonic time of the last line: rates are over the time since.
    previous: dict[Counted, int] = dataclasses.field(default_factory=dict)
    previous_at: float = dataclasses.field(default_factory=time.monotonic)

    def slowest(self, watermarks: Mapping[str, int]) -> tuple[int | str, int] | None:
        """The node (by index, or the producer id of a source) whose watermark is lowest."""
        by_node: dict[int | str, int] = {}
        for producer, watermark in watermarks.items():
            node, _, _ = producer.partition("#")
            key: int | str = int(node) if node.isdigit() else producer
            by_node[key] = min(by_node.get(key, watermark), watermark)
        if not by_node:
            return None
        return min(by_node.items(), key=lambda item: item[1])

    def line(
        self,
        progress: Mapping[str, Any] | None,
        watermarks: Mapping[str, int],
        counts: Mapping[Counted, int],
        at: float | None = None,
        wall: float | None = None,
    ) -> str:
        """The progress line: Spark's last progress, the watermarks and Beam's element counts.

        ``at`` (monotonic) and ``wall`` (epoch) seconds: now, unless a test says.
        """
        at = time.monotonic() if at is None else at
        elapsed = max(at - self.previous_at, 1e-3)

        def rate(counted: Sequence[Counted]) -> float:
            done = sum(counts.get(c, 0) - self.previous.get(c, 0) for c in counted)
            return max(done, 0) / elapsed

        parts = []
        if progress:
            duration = (progress.get("durationMs") or {}).get("triggerExecution")
            parts.append(
                f"micro-batch {progress.get('batchId')}"
                + (f" took {duration / 1000:.1f} s" if duration is not None else "")
            )
        else:
            parts.append("no micro-batch completed yet")
        for source in self.plan.sources:
            text = f"source '{source.name}' {_rate(rate(source.outputs))} elements/s out"
            if source.inputs:
                text += f" ({_rate(rate(source.inputs))}/s in)"
            parts.append(text)
        slowest = self.slowest(watermarks)
        if slowest is not None:
            node, watermark = slowest
            counted = self.plan.nodes.get(node)
            name = counted.name if counted is not None else str(node)
            text = f"slowest transform '{name}'"
            if counted is not None:
                text += (
                    f" {_rate(rate(counted.inputs))} elements/s in, "
                    f"{_rate(rate(counted.outputs))}/s out,"
                )
            text += f" watermark {_when(watermark)}"
            parts.append(text + self._lag(watermark, wall))
        self.previous = dict(counts)
        self.previous_at = at
        return f"Beam pipeline {self.job_name} (streaming): " + "; ".join(parts)

    def _lag(self, watermark: int, wall: float | None) -> str:
        if not MIN_MICROS < watermark < MAX_MICROS:
            return ""
        if self.plan.not_clock_time is not None:
            return f" ({self.plan.not_clock_time}: no lag behind the clock)"
        now = time.time() if wall is None else wall
        lag = now - watermark / 1e6
        if abs(lag) > _CLOCK_SECONDS:
            return " (event time far from the clock: no lag behind it)"
        return f" ({lag:.1f} s behind the clock)"

    def falls_behind(self, recent: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the micro-batches keep taking longer than the trigger interval.

        ``recent``: Spark's recent progress (``query.recentProgress``); each micro-batch
        counts once. Says so (a warning) once, when it first happens. With a trigger
        interval of 0 a micro-batch starts when the last ends: there is no interval to miss.
        """
        if self.trigger_seconds <= 0:
            return False
        for progress in recent:
            batch = int(progress.get("batchId", -1))
            duration = (progress.get("durationMs") or {}).get("triggerExecution")
            if batch <= self.last_batch or duration is None:
                continue
            self.last_batch = batch
            if duration / 1000 > self.trigger_seconds:
                self.slow_batches += 1
            else:
                self.slow_batches = 0
            self.last_duration = duration / 1000
        behind = self.slow_batches >= BEHIND_AFTER
        if behind and not self.warned:
            self.warned = True
            _LOGGER.warning(
                "Beam pipeline %s cannot keep up: its last %d micro-batches each took longer "
                "than the %s s trigger interval (the last %.1f s). Give the cluster more "
                "cores, or a longer --spark_trigger_interval.",
                self.job_name,
                self.slow_batches,
                self.trigger_seconds,
                self.last_duration,
            )
        return behind


def _input_pcollection(stage: PlannedStage) -> str:
    return next(iter(stage.descriptor.transforms[stage.input_transform_id].outputs.values()))


def _output_pcollection(stage: PlannedStage, buffer_id: bytes) -> list[str]:
    return [
        pcollection
        for output in stage.outputs
        if output.buffer_id == buffer_id
        for pcollection in stage.descriptor.transforms[output.transform_id].inputs.values()
    ]


def _user_name(plan: Plan, transform_id: str) -> str:
    transform = plan.components.transforms.get(transform_id)
    return transform.unique_name if transform is not None else transform_id


def _producer_name(plan: Plan, pcollection_id: str) -> str:
    """The user name of the transform producing ``pcollection_id`` (a root's read)."""
    for transform in plan.components.transforms.values():
        if not transform.subtransforms and pcollection_id in transform.outputs.values():
            return str(transform.unique_name)
    return pcollection_id


def _stage_counts(stage: PlannedStage, name: str) -> Counts:
    return Counts(
        name,
        ((stage.name, _input_pcollection(stage)),),
        tuple(
            (stage.name, p)
            for output in stage.outputs
            for p in stage.descriptor.transforms[output.transform_id].inputs.values()
        ),
    )


def _splittable_source(stage: PlannedStage) -> Counts:
    """An unbounded splittable DoFn as a source: restrictions in, its own elements out."""
    label = (stage.user_transform_names or [stage.name])[0].split("/")[0]
    produced = tuple(
        (stage.name, p)
        for transform in stage.descriptor.transforms.values()
        if transform.spec.urn == SDF_PROCESS_URN
        for p in transform.outputs.values()
    )
    return Counts(label, ((stage.name, _input_pcollection(stage)),), produced)


def progress_plan(plan: Plan, topology: Topology) -> ProgressPlan:
    """Names and element counts of the topology's nodes and sources, in user terms.

    A stage is named by its Beam transforms, a GroupByKey by its transform's name, an
    unbounded splittable DoFn source by the transform the user applied (its name's first
    part, ``PeriodicImpulse``'s label), a TestStream or Spark stream by its transform.
    """
    nodes: dict[int | str, Counts] = {}
    sources: list[Counts] = []
    for node in topology.nodes:
        if node.kind == STAGE:
            stage = plan.stage(node.name)
            counts = _stage_counts(stage, stage.display_name)
            nodes[node.index] = counts
            if is_unbounded_splittable(stage):
                sources.append(_splittable_source(stage))
            continue
        buffer = plan.buffers[node.name.encode()]
        inputs = tuple(
            (writer, p)
            for writer, _ in buffer.writers
            for p in _output_pcollection(plan.stage(writer), buffer.buffer_id)
        )
        readers = [plan.stage(r) for r in buffer.main_readers]
        outputs = ((readers[0].name, _input_pcollection(readers[0])),) if readers else ()
        nodes[node.index] = Counts(_user_name(plan, buffer.name), inputs, outputs)
    test_stream = False
    for root in topology.roots:
        buffer = plan.buffers[root.encode()]
        if buffer.kind == BufferKind.IMPULSE:
            continue
        test_stream = test_stream or buffer.kind == BufferKind.TEST_STREAM
        readers = [plan.stage(r) for r in buffer.main_readers]
        outputs = ((readers[0].name, _input_pcollection(readers[0])),) if readers else ()
        sources.append(Counts(_producer_name(plan, buffer.name), (), outputs))
        nodes[root] = sources[-1]
    return ProgressPlan(
        nodes, tuple(sources), "event time from a TestStream" if test_stream else None
    )
