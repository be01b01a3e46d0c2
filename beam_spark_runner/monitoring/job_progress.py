"""Progress of a running pipeline, on a logger a person sees at the default logging level.

A batch pipeline is one Spark action that can run for hours; this logs, every
``interval`` seconds, how many tasks of the pipeline's active Spark stages are done (as
Spark's console progress bar shows). A streaming query's lines (``streaming.progress``) go
to the same logger, ``beam_spark_runner.progress``, at INFO. Python shows only warnings by
default, so where the logging configuration would not show them (and nobody set the
logger's level), ``progress_logger`` gives the logger its own handler on stderr; setting the
logger's level (``logging.getLogger("beam_spark_runner.progress").setLevel(logging.WARNING)``)
quiets it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import TracebackType
from typing import Any

_LOGGER = logging.getLogger(__name__)

PROGRESS_LOGGER = logging.getLogger("beam_spark_runner.progress")
# Spark's console lines' date layout, so the two read as one stream.
_FORMAT = logging.Formatter("%(asctime)s %(message)s", datefmt="%y/%m/%d %H:%M:%S")


class _ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``progress_logger`` adds: stderr as it is when a record is logged."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_FORMAT)

    def emit(self, record: logging.LogRecord) -> None:
        """Writes to the current ``sys.stderr`` (tests and notebooks replace it)."""
        self.setStream(sys.stderr)
        super().emit(record)


def progress_logger() -> logging.Logger:
    """The progress logger, made visible at INFO where nothing else would show its lines.

    Left alone when its level was set (by the user, or by an earlier call), or when the
    logging configuration already shows INFO records of it (a handler on the way up).
    Otherwise it gets a handler on stderr and level INFO, and stops propagating: Beam's
    root handler (installed at import) would print each line a second time.
    """
    logger = PROGRESS_LOGGER
    if logger.level != logging.NOTSET:
        return logger
    if logger.getEffectiveLevel() <= logging.INFO and _has_handler_above(logger):
        return logger
    logger.addHandler(_ConsoleHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def _has_handler_above(logger: logging.Logger) -> bool:
    current: logging.Logger | None = logger
    while current is not None:
        if current.handlers:
            return True
        current = current.parent if current.propagate else None
    return False


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
                progress_logger().info(line)

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
