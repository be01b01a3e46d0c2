"""Progress of a running pipeline, logged from Spark's status tracker.

A batch pipeline is one Spark action that can run for hours; this logs, every
``interval`` seconds, how many tasks of the pipeline's active Spark stages are done.
"""

from __future__ import annotations

import logging
import threading
import time
from types import TracebackType
from typing import Any

_LOGGER = logging.getLogger(__name__)


class ProgressReporter:
    """A daemon thread that logs the progress of one Spark job group until stopped."""

    def __init__(self, spark_context: Any, job_group: str, label: str, interval: float = 30.0):
        self._tracker = spark_context.statusTracker()
        self._group = job_group
        self._label = label
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{label}", daemon=True)
        self._started = time.monotonic()

    def summary(self) -> str | None:
        """One line: tasks done and running over the group's active stages, or None."""
        done = running = total = 0
        for job_id in self._tracker.getJobIdsForGroup(self._group):
            job = self._tracker.getJobInfo(job_id)
            if job is None or job.status != "RUNNING":
                continue
            for stage_id in job.stageIds:
                stage = self._tracker.getStageInfo(stage_id)
                if stage is None:
                    continue
                done += stage.numCompletedTasks
                running += stage.numActiveTasks
                total += stage.numTasks
        if total == 0:
            return None
        elapsed = time.monotonic() - self._started
        return (
            f"Beam pipeline {self._label}: {done}/{total} Spark tasks done, {running} running "
            f"({elapsed:.0f} s)"
        )

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                line = self.summary()
            except Exception:  # noqa: BLE001 - progress must never fail the pipeline
                _LOGGER.debug("Progress unavailable", exc_info=True)
                continue
            if line:
                _LOGGER.info(line)

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
