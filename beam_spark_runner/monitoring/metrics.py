"""Metrics: Beam monitoring infos from every bundle and task, merged on the driver.

Each Spark task merges its bundles' monitoring infos and adds them to a Spark accumulator
under its Beam stage's name, as FnApiRunner keys them (a PCollection between two stages is
counted by both; the two must not be summed). Spark merges only successful attempts'
updates, so the accumulator holds the *committed* metrics; a failed attempt's, partial
bundle included, reach the driver through ``attempts.py``'s side channel, and attempted =
committed + failed attempts. Unlike Beam's ``consolidate`` (sums and distributions only),
gauges keep the latest value and string sets and bounded tries take the union.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from apache_beam.coders import coders
from apache_beam.metrics.cells import (
    BoundedTrieData,
    DistributionData,
    DistributionResult,
    GaugeData,
    GaugeResult,
)
from apache_beam.metrics.metric import MetricResult, MetricResults
from pyspark.accumulators import AccumulatorParam

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.monitoring.failed_attempts import (
    AttemptReportAddress,
    FailedAttempt,
    report_failed_attempt,
)

_LOGGER = logging.getLogger(__name__)

SerializedInfos = list[bytes]
# Beam stage name -> serialized monitoring infos. The pipeline-wide entry is keyed "".
StageInfos = dict[str, SerializedInfos]
PIPELINE_KEY = ""
# Where a task whose stage is not known reports (user metrics only, see task_metrics).
UNKNOWN_STAGE = ""

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
    """One monitoring info per metric key, merged by the metric's type.

    Sums and distributions add up, gauges keep the latest, string sets and bounded tries
    take the union. Of a type Beam defines no merge for, the last value is kept, so that
    merging many tasks' infos never grows without bound.
    """
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
        elif _MI.is_counter(first) or _MI.is_distribution(first):
            merged.extend(_MI.consolidate(values))
        else:
            merged.append(values[-1])
    return merged


def decode_infos(serialized: Iterable[bytes]) -> list[Any]:
    """Monitoring info protos from their serialized form."""
    return [bi.metrics_pb2.MonitoringInfo.FromString(b) for b in serialized]


def _serialize(infos: Iterable[Any]) -> SerializedInfos:
    return [info.SerializeToString() for info in infos]


def merge_serialized(left: SerializedInfos, right: SerializedInfos) -> SerializedInfos:
    """Merges two lists of serialized monitoring infos into one."""
    if not left:
        return list(right)
    if not right:
        return list(left)
    return _serialize(merge_monitoring_infos(decode_infos([*left, *right])))


def merge_stage_infos(left: StageInfos, right: StageInfos) -> StageInfos:
    """Merges two stage -> infos maps, stage by stage."""
    merged = dict(left)
    for stage, infos in right.items():
        merged[stage] = merge_serialized(merged.get(stage, []), infos)
    return merged


class MonitoringInfosParam(AccumulatorParam):
    """Accumulates serialized Beam monitoring infos per stage, merging as it goes."""

    def zero(self, value: StageInfos) -> StageInfos:
        """No stages."""
        return {}

    def addInPlace(self, value1: StageInfos, value2: StageInfos) -> StageInfos:  # noqa: N802
        """Merges two stage -> infos maps."""
        return merge_stage_infos(value1, value2)


@dataclasses.dataclass(frozen=True)
class MetricsSink:
    """Where a task reports its metrics. Pickled into every task's closure.

    ``accumulator``: the run's Spark accumulator (committed metrics).
    ``attempts``: the driver's side channel for failed attempts, or None without one.
    """

    accumulator: Any
    attempts: AttemptReportAddress | None = None


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
def task_metrics(sink: MetricsSink | None, stage: str | None = None) -> Iterator[TaskMetrics]:
    """Collects one task's metrics for the Beam stage named ``stage``.

    When the body ends normally, they are added to the run's accumulator (committed if the
    attempt succeeds). When it raises, they are sent, with the partial metrics of the bundle
    that failed, to the driver as a failed attempt's, and the error propagates unchanged.

    Without a ``stage`` name, system metrics cannot be told apart from those of other
    stages, so only user metrics are reported, under ``UNKNOWN_STAGE``.
    """
    collected = TaskMetrics()
    # Bundles that failed earlier in this process belong to earlier (failed) tasks.
    bi.take_failed_bundle_monitoring_infos()
    try:
        yield collected
    except BaseException:
        collected.extend(bi.take_failed_bundle_monitoring_infos())
        if sink is not None and sink.attempts is not None and collected.infos:
            try:
                infos = _task_infos(collected.infos, stage)
                report_failed_attempt(sink.attempts, stage or UNKNOWN_STAGE, _serialize(infos))
            except Exception:  # noqa: BLE001 - never mask the task's own error
                _LOGGER.warning("Could not report a failed attempt's metrics", exc_info=True)
        raise
    if sink is None or not collected.infos:
        return
    infos = _task_infos(collected.infos, stage)
    if infos:
        sink.accumulator.add({stage or UNKNOWN_STAGE: _serialize(infos)})


def _task_infos(infos: list[Any], stage: str | None) -> list[Any]:
    if stage is None:
        infos = [m for m in infos if bi.is_user_monitoring_info(m)]
    return merge_monitoring_infos(infos)


def new_accumulator(spark_context: Any) -> Any:
    """A fresh accumulator for one pipeline run."""
    return spark_context.accumulator({}, MonitoringInfosParam())


def pipeline_level_infos(fused_stages: int) -> list[Any]:
    """The run's pipeline-wide infos, as FnApiRunner reports them under the stage ''."""
    return [_MI.int64_counter(bi.NUM_FUSED_STAGES_URN, fused_stages)]


@dataclasses.dataclass(frozen=True)
class RunMetrics:
    """A run's monitoring infos per Beam stage: committed, and of failed attempts."""

    committed: dict[str, list[Any]]
    failed_attempts: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    failed_attempt_count: int = 0

    @classmethod
    def collect(
        cls,
        accumulated: StageInfos,
        attempts: Iterable[FailedAttempt],
        pipeline_infos: Iterable[Any] = (),
    ) -> RunMetrics:
        """From the accumulator's value and the failed attempts the driver received."""
        committed = {stage: decode_infos(infos) for stage, infos in accumulated.items()}
        pipeline = list(pipeline_infos)
        if pipeline:
            committed[PIPELINE_KEY] = merge_monitoring_infos(
                [*committed.get(PIPELINE_KEY, []), *pipeline]
            )
        failed: dict[str, list[Any]] = collections.defaultdict(list)
        count = 0
        for attempt in attempts:
            count += 1
            failed[attempt.stage].extend(decode_infos(attempt.infos))
        return cls(
            committed,
            {stage: merge_monitoring_infos(infos) for stage, infos in failed.items()},
            count,
        )

    @property
    def attempted(self) -> dict[str, list[Any]]:
        """Committed plus failed attempts, per stage."""
        stages = [*self.committed, *(s for s in self.failed_attempts if s not in self.committed)]
        return {
            stage: merge_monitoring_infos(
                [*self.committed.get(stage, []), *self.failed_attempts.get(stage, [])]
            )
            for stage in stages
        }


def _identity(category: str) -> Any:
    """What a metric that no committed attempt updated reads as (as in DirectRunner)."""
    if category == MetricResults.COUNTERS:
        return 0
    if category == MetricResults.DISTRIBUTIONS:
        return DistributionResult(DistributionData.identity_element())
    if category == MetricResults.GAUGES:
        return GaugeResult(GaugeData.identity_element())
    if category == MetricResults.STRINGSETS:
        return set()
    return BoundedTrieData()


_CATEGORIES = (
    MetricResults.COUNTERS,
    MetricResults.DISTRIBUTIONS,
    MetricResults.GAUGES,
    MetricResults.STRINGSETS,
    MetricResults.BOUNDED_TRIES,
)


def _results_by_category(
    by_stage: Mapping[str, list[Any]], user_metrics_only: bool
) -> dict[str, dict[Any, Any]]:
    """Per metric category, MetricKey -> result, over all stages (as FnApiMetrics does)."""
    results: dict[str, dict[Any, Any]] = {category: {} for category in _CATEGORIES}
    for infos in by_stage.values():
        for category, values in zip(
            _CATEGORIES, bi.from_monitoring_infos(infos, user_metrics_only), strict=True
        ):
            results[category].update(values)
    return results


class SparkMetrics(MetricResults):
    """Beam ``MetricResults`` of a Spark run, with committed and attempted values.

    ``user_metrics_only=False`` also gives Beam's system metrics (execution times per
    transform, ...), as FnApiRunner's ``monitoring_metrics()`` does.
    """

    def __init__(self, run: RunMetrics, user_metrics_only: bool = True) -> None:
        self._run = run
        self._committed = _results_by_category(run.committed, user_metrics_only)
        self._attempted = _results_by_category(run.attempted, user_metrics_only)

    def query(self, filter: Any = None) -> dict[str, list[MetricResult]]:
        """Metric results matching ``filter``, by category, as every Beam runner gives."""
        results: dict[str, list[MetricResult]] = {}
        for category in _CATEGORIES:
            committed = self._committed[category]
            attempted = self._attempted[category]
            keys = [*committed, *(k for k in attempted if k not in committed)]
            results[category] = [
                MetricResult(
                    key,
                    committed.get(key, _identity(category)),
                    attempted.get(key, committed.get(key)),
                )
                for key in keys
                if self.matches(filter, key)
            ]
        return results

    def monitoring_infos(self) -> list[Any]:
        """The committed monitoring infos of all stages."""
        return [info for infos in self._run.committed.values() for info in infos]


def element_counts(accumulated: StageInfos) -> dict[tuple[str, str], int]:
    """(Beam stage, PCollection id) -> the committed elements the stage counted in it."""
    counts: dict[tuple[str, str], int] = {}
    for stage, serialized in accumulated.items():
        for info in decode_infos(serialized):
            if info.urn == _MI.ELEMENT_COUNT_URN:
                pcollection = info.labels.get(_MI.PCOLLECTION_LABEL, "")
                counts[(stage, pcollection)] = int(_MI.extract_counter_value(info))
    return counts
