"""Metrics: Beam monitoring infos from every bundle and task, merged on the driver.

Each Spark task merges the monitoring infos of its bundles and adds them to a Spark
accumulator. Spark merges an accumulator update only from a task attempt that succeeded,
so a failed and retried attempt does not count twice.

Beam's own ``consolidate`` merges only sums and distributions (FnApiRunner runs one bundle
per stage, so it never needs more); with many bundles and tasks, gauges keep the latest
value, string sets and bounded tries take the union, as Beam's metric cells define.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.coders import coders
from apache_beam.metrics.cells import BoundedTrieData
from pyspark.accumulators import AccumulatorParam

from beam_spark_runner import beam_internals as bi

SerializedInfos = list[bytes]
_MI = bi.monitoring_infos
_STRING_SET_CODER = coders.IterableCoder(coders.StrUtf8Coder())


def _latest_gauge(left: Any, right: Any) -> Any:
    left_time, _ = _MI.extract_gauge_value(left)
    right_time, _ = _MI.extract_gauge_value(right)
    return right if right_time > left_time else left


def _union_string_sets(left: Any, right: Any) -> Any:
    merged = _MI.extract_string_set_value(left) | _MI.extract_string_set_value(right)
    result = bi.metrics_pb2.MonitoringInfo()
    result.CopyFrom(left)
    result.payload = _STRING_SET_CODER.encode(sorted(merged))
    return result


def _combine_bounded_tries(left: Any, right: Any) -> Any:
    merged: BoundedTrieData = _MI.extract_bounded_trie_value(left).combine(
        _MI.extract_bounded_trie_value(right)
    )
    result = bi.metrics_pb2.MonitoringInfo()
    result.CopyFrom(left)
    result.payload = merged.to_proto().SerializeToString()
    return result


def merge_monitoring_infos(infos: Iterable[Any]) -> list[Any]:
    """One monitoring info per metric key, merged by the metric's type."""
    grouped: dict[Any, list[Any]] = collections.defaultdict(list)
    for info in infos:
        grouped[_MI.to_key(info)].append(info)
    merged: list[Any] = []
    for values in grouped.values():
        first = values[0]
        if len(values) == 1:
            merged.append(first)
        elif _MI.is_gauge(first):
            merged.append(functools.reduce(_latest_gauge, values))
        elif _MI.is_string_set(first):
            merged.append(functools.reduce(_union_string_sets, values))
        elif _MI.is_bounded_trie(first):
            merged.append(functools.reduce(_combine_bounded_tries, values))
        else:
            merged.extend(_MI.consolidate(values))
    return merged


def merge_serialized(left: SerializedInfos, right: SerializedInfos) -> SerializedInfos:
    """Merges two lists of serialized monitoring infos into one."""
    if not left:
        return list(right)
    if not right:
        return list(left)
    infos = decode_infos([*left, *right])
    return [info.SerializeToString() for info in merge_monitoring_infos(infos)]


class MonitoringInfosParam(AccumulatorParam):
    """Accumulates serialized Beam monitoring infos, merging as it goes."""

    def zero(self, value: SerializedInfos) -> SerializedInfos:
        """An empty list."""
        return []

    def addInPlace(self, value1: SerializedInfos, value2: SerializedInfos) -> SerializedInfos:  # noqa: N802
        """Merges two lists of infos."""
        return merge_serialized(value1, value2)


# A task merges its bundles' infos whenever this many have piled up.
_MERGE_EVERY = 256


class TaskMetrics:
    """The monitoring infos of one Spark task's bundles, merged as they pile up."""

    def __init__(self) -> None:
        self.infos: list[Any] = []

    def extend(self, infos: Iterable[Any]) -> None:
        """Adds the infos of one bundle."""
        self.infos.extend(infos)
        if len(self.infos) > _MERGE_EVERY:
            self.infos[:] = merge_monitoring_infos(self.infos)


@contextlib.contextmanager
def task_metrics(sink: Any) -> Iterator[TaskMetrics]:
    """Collects a task's metrics and, when the task body ends, adds them to ``sink``.

    ``sink`` is the run's accumulator (None when metrics are not collected).
    """
    collected = TaskMetrics()
    yield collected
    if sink is None or not collected.infos:
        return
    user_metrics = [m for m in collected.infos if bi.is_user_monitoring_info(m)]
    if user_metrics:
        sink.add([m.SerializeToString() for m in merge_monitoring_infos(user_metrics)])


def new_accumulator(spark_context: Any) -> Any:
    """A fresh accumulator for one pipeline run."""
    return spark_context.accumulator([], MonitoringInfosParam())


def decode_infos(serialized: SerializedInfos) -> list[Any]:
    """Monitoring info protos from their serialized form."""
    return [bi.metrics_pb2.MonitoringInfo.FromString(b) for b in serialized]


def pipeline_metrics(infos: list[Any]) -> Any:
    """Beam ``MetricResults`` over user metrics, queried like any runner's."""
    return bi.FnApiMetrics({"": merge_monitoring_infos(infos)}, user_metrics_only=True)
