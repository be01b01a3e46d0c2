"""The ``PipelineResult`` of a streaming run: the query runs while the result is held."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from apache_beam.runners.runner import PipelineState

from beam_spark_runner.monitoring.metrics import RunMetrics
from beam_spark_runner.result import SparkPipelineResult


class StreamingPipelineResult(SparkPipelineResult):
    """A running streaming query: RUNNING until it ends DONE, FAILED or CANCELLED.

    DONE once +inf has reached every stage. ``metrics()`` reads committed metrics of the
    micro-batches completed so far.
    """

    def __init__(
        self,
        spark_app_id: str | None,
        metrics: Callable[[], RunMetrics],
        cancel: Callable[[], None],
    ) -> None:
        super().__init__(PipelineState.RUNNING, RunMetrics.collect({}, [], []), spark_app_id)
        self._read_metrics = metrics
        self._cancel = cancel
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self.micro_batches = 0

    def finish(self, state: str, micro_batches: int, error: BaseException | None = None) -> None:
        """Called by the query's watcher once the query has ended."""
        self.micro_batches = micro_batches
        self._run_metrics = self._read_metrics()
        self._metrics = self._monitoring_metrics = None
        self._error = error
        self._state = state
        self._finished.set()

    @property
    def state(self) -> str:
        """RUNNING, DONE, FAILED or CANCELLED."""
        return self._state  # type: ignore[no-any-return]

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Waits for the end (or ``duration`` milliseconds); raises if the pipeline failed."""
        self._finished.wait(None if duration is None else duration / 1000)
        if self._error is not None:
            raise self._error
        return self._state  # type: ignore[no-any-return]

    def cancel(self) -> str:
        """Stops the query; the state becomes CANCELLED (unless it had already ended)."""
        if not PipelineState.is_terminal(self._state):
            self._cancel()
            self._finished.wait()
        return self._state  # type: ignore[no-any-return]

    def _refresh(self) -> None:
        if not self._finished.is_set():
            self._run_metrics = self._read_metrics()
            self._metrics = self._monitoring_metrics = None

    def metrics(self) -> Any:
        """Committed metrics of the micro-batches completed so far."""
        self._refresh()
        return super().metrics()

    def monitoring_metrics(self) -> Any:
        """User and system metrics of the micro-batches completed so far."""
        self._refresh()
        return super().monitoring_metrics()


def wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    """Polls ``predicate`` until it holds or ``timeout`` seconds pass; returns whether it held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True
