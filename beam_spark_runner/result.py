"""The ``PipelineResult`` of a pipeline run on Spark."""

from __future__ import annotations

from typing import Any

from apache_beam.runners.runner import PipelineResult, PipelineState

from beam_spark_runner.metrics import pipeline_metrics


class SparkPipelineResult(PipelineResult):
    """Result of a batch run. The run is synchronous: it has finished when returned."""

    def __init__(self, state: str, monitoring_infos: list[Any], spark_app_id: str | None) -> None:
        super().__init__(state)
        self._monitoring_infos = monitoring_infos
        self._metrics: Any = None
        self.spark_application_id = spark_app_id

    def wait_until_finish(self, duration: int | None = None) -> str:
        """Returns the final state; the batch run has already finished."""
        return self._state

    def cancel(self) -> str:
        """A finished batch run cannot be cancelled; returns its final state."""
        if not PipelineState.is_terminal(self._state):
            raise NotImplementedError("Cancelling a running pipeline is not supported yet.")
        return self._state

    def metrics(self) -> Any:
        """User counters, distributions, gauges and string sets, queryable as in Beam."""
        if self._metrics is None:
            self._metrics = pipeline_metrics(self._monitoring_infos)
        return self._metrics

    def monitoring_infos(self) -> list[Any]:
        """The raw Beam monitoring infos collected from all tasks."""
        return list(self._monitoring_infos)
