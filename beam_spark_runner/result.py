"""The ``PipelineResult`` of a pipeline run on Spark."""

from __future__ import annotations

from typing import Any

from apache_beam.runners.runner import PipelineResult, PipelineState

from beam_spark_runner.monitoring.metrics import RunMetrics, SparkMetrics


class SparkPipelineResult(PipelineResult):
    """Result of a batch run. The run is synchronous: it has finished when returned.

    Its metrics are Beam's, committed and attempted: committed values count each Spark
    task once, from its successful attempt; attempted values also count what failed (and
    retried) attempts did before failing.
    """

    def __init__(self, state: str, run_metrics: RunMetrics, spark_app_id: str | None) -> None:
        super().__init__(state)
        self._run_metrics = run_metrics
        self._metrics: SparkMetrics | None = None
        self._monitoring_metrics: SparkMetrics | None = None
        self.spark_application_id = spark_app_id

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Returns the final state; the batch run has already finished."""
        return self._state

    def cancel(self) -> str:
        """A finished batch run cannot be cancelled; returns its final state."""
        if not PipelineState.is_terminal(self._state):
            raise NotImplementedError("Cancelling a running pipeline is not supported yet.")
        return self._state

    def metrics(self) -> SparkMetrics:
        """User counters, distributions, gauges, string sets and bounded tries."""
        if self._metrics is None:
            self._metrics = SparkMetrics(self._run_metrics, user_metrics_only=True)
        return self._metrics

    def monitoring_metrics(self) -> SparkMetrics:
        """User and system metrics (execution times per transform, ...), as FnApiRunner's.

        Metrics labelled by PCollection only (element counts, sampled byte sizes) have no
        step, so ``query()`` leaves them out, as in Beam; ``monitoring_infos()`` has them.
        """
        if self._monitoring_metrics is None:
            self._monitoring_metrics = SparkMetrics(self._run_metrics, user_metrics_only=False)
        return self._monitoring_metrics

    def monitoring_infos(self) -> list[Any]:
        """The committed Beam monitoring infos of all stages, user and system ones."""
        return [info for infos in self._run_metrics.committed.values() for info in infos]

    def monitoring_infos_by_stage(self) -> dict[str, list[Any]]:
        """The committed monitoring infos per Beam stage name; pipeline-wide ones under ''."""
        return {stage: list(infos) for stage, infos in self._run_metrics.committed.items()}

    @property
    def _monitoring_infos_by_stage(self) -> dict[str, list[Any]]:
        # The attribute FnApiRunner's RunnerResult has, which Beam's own tests read.
        return self.monitoring_infos_by_stage()

    @property
    def failed_attempts(self) -> int:
        """How many failed task attempts reported metrics (they count as attempted only)."""
        return self._run_metrics.failed_attempt_count
