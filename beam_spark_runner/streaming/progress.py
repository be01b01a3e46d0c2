"""What a running streaming query reports: throughput, batch time, the slowest transform.

Every few seconds the driver logs one line per query: the last micro-batch's id and
duration, input rows per second, and the transform whose output watermark is furthest
behind (every stateful node's shards send their output watermark to the driver with each
micro-batch), with how far it lags the runner's processing time. A query whose
micro-batches keep taking longer than its trigger interval says that it cannot keep up.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from beam_spark_runner.streaming.watermarks import MAX_MICROS, MIN_MICROS

_LOGGER = logging.getLogger(__name__)

# Micro-batches in a row over the trigger interval before the query says it falls behind.
BEHIND_AFTER = 3


def _when(micros: int) -> str:
    if micros >= MAX_MICROS:
        return "+inf (done)"
    if micros <= MIN_MICROS:
        return "-inf (nothing yet)"
    moment = datetime.datetime.fromtimestamp(micros / 1e6, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclasses.dataclass
class ProgressReport:
    """Builds the progress lines of one query from Spark's progress and the watermarks."""

    job_name: str
    trigger_seconds: float
    # A producer id's node index (the part before '#') -> the Beam transform's name.
    names: Mapping[int, str]
    slow_batches: int = 0
    last_batch: int = -1
    last_duration: float = 0.0
    warned: bool = False

    def slowest(self, watermarks: Mapping[str, int]) -> tuple[str, int] | None:
        """The transform (by Beam name) whose output watermark is lowest, and that mark."""
        by_node: dict[str, int] = {}
        for producer, watermark in watermarks.items():
            node, _, _ = producer.partition("#")
            name = self.names.get(int(node), producer) if node.isdigit() else producer
            by_node[name] = min(by_node.get(name, watermark), watermark)
        if not by_node:
            return None
        return min(by_node.items(), key=lambda item: item[1])

    def line(self, progress: Mapping[str, Any] | None, watermarks: Mapping[str, int]) -> str:
        """The progress line for Spark's last progress and the latest watermarks."""
        parts = [f"Beam pipeline {self.job_name} (streaming)"]
        if progress:
            duration = (progress.get("durationMs") or {}).get("triggerExecution")
            parts.append(
                f"micro-batch {progress.get('batchId')}"
                + (f" took {duration / 1000:.1f} s" if duration is not None else "")
            )
            rate = progress.get("inputRowsPerSecond")
            if rate is not None:
                parts.append(f"{float(rate):.1f} input rows/s")
            processed = progress.get("processedRowsPerSecond")
            if processed is not None:
                parts.append(f"{float(processed):.1f} processed rows/s")
        else:
            parts.append("no micro-batch completed yet")
        slowest = self.slowest(watermarks)
        if slowest is not None:
            name, watermark = slowest
            text = f"slowest transform '{name}' at watermark {_when(watermark)}"
            if MIN_MICROS < watermark < MAX_MICROS:
                lag = datetime.datetime.now(datetime.timezone.utc).timestamp() - watermark / 1e6
                text += f" ({lag:.1f} s behind the clock)"
            parts.append(text)
        return ", ".join(parts)

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
