"""``beam.Create`` held by the runner (``native_create``): no Spark job of its own.

A Create that Beam would reshuffle becomes rows of a ``create:`` buffer read by the stage
that decodes them; its elements must be Beam's (values, timestamps, windows, panes) and
must still be spread over every core.
"""

from __future__ import annotations

import threading
import typing

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import TaskSinks
from beam_spark_runner.options import spark_settings
from beam_spark_runner.planning import (
    CREATE_URN,
    Plan,
    build_plan,
    decode_create_payload,
    encode_create_payload,
)
from beam_spark_runner.rewrites.native_create import NativeCreateOverride
from beam_spark_runner.spark import compat as spark_compat
from beam_spark_runner.spark.session import obtain_session
from beam_spark_runner.translators import translator_for
from beam_spark_runner.translators.base import TranslationContext

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _input_kinds(create: beam.PTransform) -> list[str]:
    """The kinds of the planned stages' input buffers, after the runner's override."""
    p = beam.Pipeline()
    _ = p | create | beam.Map(str)
    p.replace_all([NativeCreateOverride()])
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    return [
        "impulse"
        if stage.input_buffer_id == bi.IMPULSE_BUFFER
        else bi.split_buffer_id(stage.input_buffer_id)[0]
        for stage in build_plan(proto).stages
    ]


class _ListCreate(beam.Create):  # type: ignore[misc]
    """A subclass: it may expand differently, so the runner leaves it alone."""


def test_only_reshuffling_creates_are_held_by_the_runner() -> None:
    # Beam's own expansion: impulse stage, Reshuffle, then the decoding stage.
    assert _input_kinds(beam.Create([1, 2, 3])) == ["create"]
    # No Reshuffle in Beam's expansion: nothing to save, Beam's expansion stays.
    assert _input_kinds(beam.Create([1])) == ["impulse"]
    assert _input_kinds(beam.Create([1, 2], reshuffle=False)) == ["impulse"]
    assert _input_kinds(_ListCreate([1, 2, 3])) == ["impulse", "reshuffle"]
    assert CREATE_URN.startswith("beam:runner:spark:")


def test_payload_round_trip() -> None:
    values = [b"", b"a", bytes(range(256)) * 3]
    assert decode_create_payload(encode_create_payload(values)) == values
    assert decode_create_payload(encode_create_payload([])) == []


_VALUES: list[typing.Any] = [1, "two", (3, b"\x00four"), {"five": [5.0]}, None, 2**70]


def _described(p: beam.Pipeline) -> beam.PCollection:
    def describe(
        value: typing.Any,
        timestamp: typing.Any = beam.DoFn.TimestampParam,
        window: typing.Any = beam.DoFn.WindowParam,
        pane: typing.Any = beam.DoFn.PaneInfoParam,
    ) -> tuple[str, str, str, str]:
        return repr(value), repr(timestamp), repr(window), repr(pane)

    return p | beam.Create(_VALUES) | beam.Map(describe)


@pytest.mark.spark
def test_elements_are_beams() -> None:
    expected = [
        (repr(value), repr(MIN_TIMESTAMP), repr(GlobalWindow()), repr(PANE_INFO_UNKNOWN))
        for value in _VALUES
    ]
    with beam.Pipeline(runner=FnApiRunner()) as reference:  # Beam's own expansion
        assert_that(_described(reference), equal_to(expected))
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    assert_that(_described(p), equal_to(expected))
    p.run().wait_until_finish()


@pytest.mark.spark
def test_elements_are_spread_over_every_core() -> None:
    # Without its Reshuffle, a Create's few values must still be read by one task per
    # core: they are a pipeline's seeds, and the stage after them does the work.
    partitions = Metrics.string_set("test", "create_partitions")

    def note_partition(value: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        partitions.add(str(context.partitionId() if context else -1))
        return value

    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    out = p | beam.Create(range(4)) | beam.Map(note_partition)
    assert_that(out, equal_to(list(range(4))))
    result = p.run()
    result.wait_until_finish()
    sets = result.metrics().query(MetricsFilter().with_name("create_partitions"))["string_sets"]
    # Partition ids, not task counts: the stage may read a union (assert_that's Flatten),
    # which numbers the Create's two partitions after the union's others.
    assert len(sets[0].committed) == 2, f"Create's elements read in {sets[0].committed} only"


@pytest.mark.spark
def test_literal_rows_cost_the_same_py4j_calls_whatever_their_number() -> None:
    # A literal column per value made ~9 Py4J round trips each: a Create of 1 000 values
    # took ~9 000 to translate.
    import py4j.clientserver

    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    context = TranslationContext(spark, _empty_plan(), "test", 2, TaskSinks(), translator_for)
    sent = []
    original = py4j.clientserver.ClientServerConnection.send_command

    def counting(self: typing.Any, command: str, *args: typing.Any, **kwargs: typing.Any) -> str:
        if threading.current_thread() is threading.main_thread():
            sent.append(command)
        return original(self, command, *args, **kwargs)

    calls = []
    for count in (2, 1000):
        sent.clear()
        py4j.clientserver.ClientServerConnection.send_command = counting  # type: ignore[method-assign]
        try:
            frame = context.literal_rows([b"%d" % i for i in range(count)])
        finally:
            py4j.clientserver.ClientServerConnection.send_command = original  # type: ignore[method-assign]
        calls.append(len(sent))
        rows = frame.collect()
        assert [bytes(row[1]) for row in rows] == [b"%d" % i for i in range(count)]
        assert frame.rdd.getNumPartitions() == 2
    assert calls[0] == calls[1], f"Py4J calls for 2 and 1000 rows: {calls}"


@pytest.mark.spark
@pytest.mark.skipif(
    spark_compat.pyspark_version() < (4, 0), reason="PySpark 3.5 takes no Arrow table"
)
@pytest.mark.parametrize(("count", "parallelism"), [(16, 2), (16, 1), (1, 2)])
def test_literal_rows_need_no_python_worker(count: int, parallelism: int) -> None:
    # An RDD of Python rows is converted by a Python worker per task (two more processes
    # of ~200 MiB each on local[2]); an Arrow table becomes a scan of local rows in the JVM.
    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    context = TranslationContext(
        spark, _empty_plan(), "test", parallelism, TaskSinks(), translator_for
    )
    frame = context.literal_rows([b"%d" % i for i in range(count)])
    plan = frame._jdf.queryExecution().executedPlan().toString()  # noqa: SLF001
    assert "LocalTableScan" in plan and "ExistingRDD" not in plan, plan
    assert frame.rdd.getNumPartitions() == min(count, parallelism)
    assert sorted(bytes(row[1]) for row in frame.collect()) == sorted(
        b"%d" % i for i in range(count)
    )


def _empty_plan() -> Plan:
    return Plan([], {}, bi.beam_runner_api_pb2.Components(), {}, {})


@pytest.mark.spark
def test_create_root_keeps_beams_step_name_in_metrics() -> None:
    # Beam's FnApiRunner reports the execution times of a Create's root under
    # 'Create/Impulse' (its Impulse, read from the impulse buffer); so does the runner's
    # Create, whose read keeps that name (Beam's test_non_user_metrics checks it).
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    _ = p | beam.Create(["a", "zzz"]) | "MyStep" >> beam.FlatMap(lambda x: None)
    result = p.run()
    result.wait_until_finish()
    steps = {
        counter.key.step
        for counter in result.monitoring_metrics().query()["counters"]
        if counter.key.metric.name.endswith("start_bundle_msecs:v1")
    }
    assert {"Create/Impulse", "MyStep"} <= steps, steps
