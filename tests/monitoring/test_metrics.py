"""Metrics: per-stage accumulation, committed vs attempted, and the failed-attempt channel."""

from __future__ import annotations

import socket
import time
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics import monitoring_infos as mi
from apache_beam.metrics.cells import DistributionData
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner.monitoring import metrics as m
from beam_spark_runner.monitoring.failed_attempts import (
    AttemptCollector,
    AttemptReportAddress,
    FailedAttempt,
    report_failed_attempt,
)


def element_count(pcollection: str, value: int) -> Any:
    return mi.int64_counter(mi.ELEMENT_COUNT_URN, value, pcollection=pcollection)


def user_counter(step: str, name: str, value: int) -> Any:
    return mi.int64_user_counter("ns", name, value, ptransform=step)


def serialized(*infos: Any) -> list[bytes]:
    return [info.SerializeToString() for info in infos]


def counter_values(infos: list[Any]) -> dict[tuple[str, ...], int]:
    return {
        tuple(sorted(info.labels.values())): mi.extract_counter_value(info)
        for info in infos
        if mi.is_counter(info)
    }


class FakeAccumulator:
    def __init__(self) -> None:
        self.added: list[m.StageInfos] = []

    def add(self, value: m.StageInfos) -> None:
        self.added.append(value)


@pytest.fixture
def collector() -> Any:
    with AttemptCollector("127.0.0.1", "127.0.0.1") as started:
        yield started


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- accumulation -----------------------------------------------------------------------


def test_accumulator_keeps_stages_apart_and_sums_within_one() -> None:
    param = m.MonitoringInfosParam()
    value = param.zero({})
    # A PCollection written by stage A and read by stage B is counted by both.
    value = param.addInPlace(value, {"A": serialized(element_count("pc", 3))})
    value = param.addInPlace(value, {"B": serialized(element_count("pc", 3))})
    value = param.addInPlace(value, {"A": serialized(element_count("pc", 4))})
    assert sorted(value) == ["A", "B"]
    assert counter_values(m.decode_infos(value["A"])) == {("pc",): 7}
    assert counter_values(m.decode_infos(value["B"])) == {("pc",): 3}


def test_merge_keeps_one_value_of_types_beam_cannot_merge() -> None:
    first = mi.create_monitoring_info("beam:metric:test:v1", "beam:metrics:test_type:v1", b"1", {})
    last = mi.create_monitoring_info("beam:metric:test:v1", "beam:metrics:test_type:v1", b"2", {})
    assert [info.payload for info in m.merge_monitoring_infos([first, last])] == [b"2"]


# --- the failed-attempt channel ---------------------------------------------------------


def test_failed_attempt_reaches_the_collector(collector: AttemptCollector) -> None:
    infos = serialized(user_counter("MyStep", "calls", 5))
    assert report_failed_attempt(collector.address, "stage-1", infos)
    (attempt,) = collector.attempts
    assert (attempt.stage, attempt.partition, attempt.attempt) == ("stage-1", -1, -1)
    assert attempt.infos == infos


def test_collector_rejects_reports_without_the_runs_token(collector: AttemptCollector) -> None:
    address = collector.address
    forged = AttemptReportAddress(address.host, address.port, b"x" * len(address.token))
    assert not report_failed_attempt(forged, "stage-1", serialized(user_counter("S", "c", 1)))
    assert collector.attempts == []


def test_collector_ignores_garbage_and_keeps_serving(collector: AttemptCollector) -> None:
    with socket.create_connection((collector.address.host, collector.address.port)) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert sock.recv(1) == b""
    assert report_failed_attempt(collector.address, "s", serialized(user_counter("S", "c", 1)))
    assert len(collector.attempts) == 1


def test_a_closed_collector_stops_listening_at_once() -> None:
    collector = AttemptCollector("127.0.0.1", "127.0.0.1")
    assert report_failed_attempt(collector.address, "s", serialized(user_counter("S", "c", 1)))
    listening = collector._thread  # noqa: SLF001 - the thread close() must end
    collector.close()
    # Woken by close(), not by a poll: the thread has ended by the time close() returns.
    assert not listening.is_alive()
    with pytest.raises(OSError):
        socket.create_connection((collector.address.host, collector.address.port), timeout=2)
    collector.close()  # twice: nothing more


def test_report_to_an_unreachable_driver_gives_up() -> None:
    address = AttemptReportAddress("127.0.0.1", closed_port(), b"t" * 16)
    started = time.monotonic()
    assert not report_failed_attempt(address, "s", [], timeout=2)
    assert time.monotonic() - started < 5


# --- task_metrics -------------------------------------------------------------------------


def test_task_commits_its_metrics_when_its_body_ends(collector: AttemptCollector) -> None:
    accumulator = FakeAccumulator()
    sink = m.MetricsSink(accumulator, collector.address)
    with m.task_metrics(sink, "stage-1") as task:
        task.extend([user_counter("MyStep", "calls", 2), element_count("pc", 2)])
        task.extend([user_counter("MyStep", "calls", 3), element_count("pc", 3)])
    ((stage, infos),) = [item for added in accumulator.added for item in added.items()]
    assert stage == "stage-1"
    assert counter_values(m.decode_infos(infos)) == {("pc",): 5, ("MyStep", "calls", "ns"): 5}
    assert collector.attempts == []


def test_failed_task_reports_an_attempt_and_keeps_its_error(
    collector: AttemptCollector,
) -> None:
    accumulator = FakeAccumulator()
    sink = m.MetricsSink(accumulator, collector.address)
    with pytest.raises(KeyError, match="the task's own error"):
        with m.task_metrics(sink, "stage-1") as task:
            task.extend([user_counter("MyStep", "calls", 4)])
            raise KeyError("the task's own error")
    assert accumulator.added == []
    (attempt,) = collector.attempts
    assert attempt.stage == "stage-1"
    assert counter_values(m.decode_infos(attempt.infos)) == {("MyStep", "calls", "ns"): 4}


def test_unreachable_driver_does_not_mask_the_tasks_error() -> None:
    sink = m.MetricsSink(FakeAccumulator(), AttemptReportAddress("127.0.0.1", closed_port(), b""))
    with pytest.raises(ZeroDivisionError):
        with m.task_metrics(sink, "stage-1") as task:
            task.extend([user_counter("MyStep", "calls", 1)])
            _ = 1 / 0


def test_task_without_a_stage_name_reports_user_metrics_only() -> None:
    accumulator = FakeAccumulator()
    with m.task_metrics(m.MetricsSink(accumulator)) as task:
        task.extend([user_counter("MyStep", "calls", 1), element_count("pc", 1)])
    ((stage, infos),) = accumulator.added[0].items()
    assert stage == m.UNKNOWN_STAGE
    assert counter_values(m.decode_infos(infos)) == {("MyStep", "calls", "ns"): 1}


# --- results ------------------------------------------------------------------------------


def test_results_have_committed_and_attempted_values() -> None:
    distribution = mi.int64_user_distribution(
        "ns", "sizes", DistributionData(10, 2, 4, 6), ptransform="MyStep"
    )
    run = m.RunMetrics.collect(
        {"stage-1": serialized(user_counter("MyStep", "calls", 5), distribution)},
        [
            FailedAttempt("stage-1", 0, 0, serialized(user_counter("MyStep", "calls", 2))),
            FailedAttempt("stage-1", 1, 0, serialized(user_counter("MyStep", "only_failed", 3))),
        ],
        m.pipeline_level_infos(1),
    )
    assert run.failed_attempt_count == 2
    results = m.SparkMetrics(run).query()
    counters = {r.key.metric.name: (r.committed, r.attempted) for r in results["counters"]}
    assert counters == {"calls": (5, 7), "only_failed": (0, 3)}
    (sizes,) = results["distributions"]
    assert (sizes.committed.count, sizes.committed.sum) == (2, 10)
    assert sizes.attempted == sizes.committed
    filtered = m.SparkMetrics(run).query(MetricsFilter().with_name("only_failed"))
    assert [r.key.metric.name for r in filtered["counters"]] == ["only_failed"]
    # The pipeline-level counter is a system metric: not among user metrics.
    assert all(r.key.step == "MyStep" for r in results["counters"])
    assert any(info.urn.startswith("internal:") for info in m.SparkMetrics(run).monitoring_infos())


# --- a pipeline on Spark ------------------------------------------------------------------


def test_system_metrics_per_stage(beam_options: list[str]) -> None:
    class Double(beam.DoFn):
        def setup(self) -> None:
            self.calls = Metrics.counter("test", "double_calls")

        def process(self, element: int) -> Any:
            self.calls.inc()
            yield element * 2

    elements = 50
    pipeline = beam.Pipeline(options=PipelineOptions(beam_options))
    _ = (
        pipeline
        | beam.Create(range(elements))
        | "Double" >> beam.ParDo(Double())
        | "Key" >> beam.Map(lambda x: (x % 3, x))
        | beam.GroupByKey()
        | "Count" >> beam.MapTuple(lambda key, values: (key, len(values)))
    )
    result = pipeline.run()
    result.wait_until_finish()

    proto = pipeline.to_runner_api()
    transforms = {t.unique_name: t for t in proto.components.transforms.values()}
    doubled = next(iter(transforms["Double"].outputs.values()))
    counted = next(iter(transforms["Count"].outputs.values()))

    by_stage = result.monitoring_infos_by_stage()
    stages = [stage for stage in by_stage if stage]
    assert len(stages) >= 2, by_stage.keys()
    (fused,) = [i for i in by_stage[""] if i.urn.startswith("internal:")]
    assert mi.extract_counter_value(fused) == len(stages)

    def counts(pcollection: str) -> list[int]:
        return [
            mi.extract_counter_value(info)
            for info in result.monitoring_infos()
            if info.urn == mi.ELEMENT_COUNT_URN
            and info.labels.get(mi.PCOLLECTION_LABEL) == pcollection
        ]

    assert counts(doubled) == [elements]
    assert counts(counted) == [3]

    system = result.monitoring_metrics().query()["counters"]
    total_msecs = [
        r for r in system if r.key.step == "Double" and r.key.metric.name.endswith("total_msecs:v1")
    ]
    assert len(total_msecs) == 1 and total_msecs[0].committed >= 0

    user = result.metrics().query()["counters"]
    assert [(r.key.metric.name, r.committed, r.attempted) for r in user] == [
        ("double_calls", elements, elements)
    ]
    assert result.failed_attempts == 0
