"""Metrics: Beam monitoring infos from every task, merged on the driver.

Each Spark task consolidates the monitoring infos of its bundles and adds them to a Spark
accumulator. Spark merges an accumulator update only from a task attempt that succeeded,
so a failed and retried attempt does not count twice.
"""

from __future__ import annotations

from typing import Any

from pyspark.accumulators import AccumulatorParam

from beam_spark_runner import beam_internals as bi

SerializedInfos = list[bytes]


def merge_serialized(left: SerializedInfos, right: SerializedInfos) -> SerializedInfos:
    """Consolidates two lists of serialized monitoring infos into one."""
    if not left:
        return list(right)
    if not right:
        return list(left)
    infos = [bi.metrics_pb2.MonitoringInfo.FromString(b) for b in (*left, *right)]
    return [info.SerializeToString() for info in bi.consolidate_monitoring_infos(infos)]


class MonitoringInfosParam(AccumulatorParam):
    """Accumulates serialized Beam monitoring infos, consolidating as it goes."""

    def zero(self, value: SerializedInfos) -> SerializedInfos:
        """An empty list."""
        return []

    def addInPlace(self, value1: SerializedInfos, value2: SerializedInfos) -> SerializedInfos:  # noqa: N802
        """Merges two lists of infos."""
        return merge_serialized(value1, value2)


def new_accumulator(spark_context: Any) -> Any:
    """A fresh accumulator for one pipeline run."""
    return spark_context.accumulator([], MonitoringInfosParam())


def decode_infos(serialized: SerializedInfos) -> list[Any]:
    """Monitoring info protos from their serialized form."""
    return [bi.metrics_pb2.MonitoringInfo.FromString(b) for b in serialized]


def pipeline_metrics(infos: list[Any]) -> Any:
    """Beam ``MetricResults`` over user metrics, queried like any runner's."""
    return bi.FnApiMetrics({"": infos}, user_metrics_only=True)
