"""Side inputs computed from literal rows on the driver, without a Spark job of their own."""

from __future__ import annotations

import logging
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import PipelineExecutionError
from beam_spark_runner.planning import Plan, build_plan, physical
from beam_spark_runner.planning.physical import driver_stage
from beam_spark_runner.rewrites.native_create import NativeCreateOverride
from beam_spark_runner.translators import driver_side_inputs
from tests.conftest import SPARK_TEST_MASTER

WEIGHTS = Metrics.counter("driver_side_inputs_test", "weights")
# What _Weigh's lifecycle methods saw, in this (the driver's) process.
LIFECYCLE: list[str] = []


class _Weigh(beam.DoFn):  # type: ignore[misc]
    def setup(self) -> None:
        LIFECYCLE.append("setup")

    def process(self, key: int) -> Any:
        yield _weight(key)

    def teardown(self) -> None:
        LIFECYCLE.append("teardown")


def _weight(key: int) -> tuple[int, int]:
    WEIGHTS.inc()
    return (key, key % 7 + 1)


def _plan(pipeline: beam.Pipeline) -> Plan:
    pipeline.replace_all([NativeCreateOverride()])
    proto = pipeline.to_runner_api(default_environment=bi.default_environment())
    return build_plan(bi.prepare_pipeline_proto(proto))


def _side_buffer(plan: Plan) -> bytes:
    (reader,) = [s for s in plan.stages if s.side_inputs]
    return reader.side_inputs[0].buffer_id


def _lookup(pipeline: beam.Pipeline, table: beam.PCollection) -> beam.PCollection:
    return (
        pipeline
        | "Main" >> beam.Create([1, 2, 3])
        | "Look up" >> beam.Map(lambda k, d: d[k] * 10, d=beam.pvalue.AsDict(table))
    )


def test_a_table_from_a_create_is_computed_on_the_driver() -> None:
    pipeline = beam.Pipeline()
    table = pipeline | "Keys" >> beam.Create(list(range(100))) | "Weigh" >> beam.Map(_weight)
    _lookup(pipeline, table)
    plan = _plan(pipeline)
    stage = driver_stage(plan, _side_buffer(plan))
    assert stage is not None and "Weigh" in plan.stage(stage).display_name


def _chain(pipeline: beam.Pipeline, length: int) -> list[beam.PCollection]:
    """Lookups, each built from a literal row and the lookups before it."""
    tables: list[beam.PCollection] = []
    for k in range(length):
        tables.append(
            pipeline
            | f"Root{k}" >> beam.Create([None])
            | f"Level{k}"
            >> beam.Map(
                lambda _, *before, k=k: (k, sum(len(t) for t in before)),
                *[beam.pvalue.AsList(t) for t in tables],
            )
        )
    return tables


def test_a_chain_of_tables_from_literals_is_computed_on_the_driver() -> None:
    pipeline = beam.Pipeline()
    tables = _chain(pipeline, 4)
    _lookup(pipeline, tables[-1] | "Pairs" >> beam.Map(lambda kv: kv))
    plan = _plan(pipeline)
    (reader,) = [s for s in plan.stages if "Look up" in s.display_name]
    stage = driver_stage(plan, reader.side_inputs[0].buffer_id)
    assert stage is not None and "Level3" in plan.stage(stage).display_name
    # One link that needs a job (a grouping) keeps the job for what reads it.
    pipeline = beam.Pipeline()
    grouped = pipeline | "Pairs" >> beam.Create([(1, 2)]) | beam.GroupByKey()
    root = pipeline | "Root" >> beam.Create([None])
    table = root | "Level" >> beam.Map(lambda _, g: (1, len(g)), beam.pvalue.AsList(grouped))
    _lookup(pipeline, table)
    plan = _plan(pipeline)
    (reader,) = [s for s in plan.stages if "Look up" in s.display_name]
    assert driver_stage(plan, reader.side_inputs[0].buffer_id) is None


@pytest.mark.spark
def test_a_chain_computed_on_the_driver_gives_the_jobs_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="beam_spark_runner.translators.driver_side_inputs")
    pipeline = beam.Pipeline(options=_options())
    tables = _chain(pipeline, 4)  # level k saw the k one-element levels before it
    looked_up = (
        pipeline
        | "Keys" >> beam.Create([3])
        | "Look up" >> beam.Map(lambda k, d: (k, d[k]), d=beam.pvalue.AsDict(tables[-1]))
    )
    assert_that(looked_up, equal_to([(3, 3)]))
    pipeline.run().wait_until_finish()
    # Every level on the driver, each once, the earlier ones first.
    computed = [line for line in caplog.messages if "computed on the driver" in line]
    assert [[k for k in range(4) if f"Level{k}" in line] for line in computed] == [
        [0],
        [1],
        [2],
        [3],
    ]


def _table_also_grouped(pipeline: beam.Pipeline) -> tuple[beam.PCollection, beam.PCollection]:
    """A table read as a side input and, grouped, as main input too; and the grouping."""
    table = pipeline | "Keys" >> beam.Create(list(range(100))) | "Weigh" >> beam.ParDo(_Weigh())
    sizes = (
        table
        | "By weight" >> beam.Map(lambda kv: (kv[1], kv[0]))
        | "Group" >> beam.GroupByKey()
        | "Sizes" >> beam.MapTuple(lambda weight, keys: (weight, len(keys)))
    )
    return table, sizes


def test_a_table_also_read_as_main_input_is_computed_on_the_driver_in_batch_only() -> None:
    # Its rows written on the driver are its main readers' input: its user code runs once.
    pipeline = beam.Pipeline()
    table, _ = _table_also_grouped(pipeline)
    _lookup(pipeline, table)
    plan = _plan(pipeline)
    stage = driver_stage(plan, _side_buffer(plan))
    assert stage is not None and "Weigh" in plan.stage(stage).display_name
    assert stage in physical.driver_stages(plan)
    # A streaming query would run the stage again for its main readers.
    proto = pipeline.to_runner_api(default_environment=bi.default_environment())
    streaming = build_plan(bi.prepare_pipeline_proto(proto), streaming=True)
    assert driver_stage(streaming, _side_buffer(streaming)) is None


def _run_table_also_grouped(caplog: pytest.LogCaptureFixture) -> int:
    """Runs the table read as a side input and as main input; its user code's committed count."""
    caplog.set_level(logging.INFO, logger="beam_spark_runner.translators.driver_side_inputs")
    pipeline = beam.Pipeline(options=_options())
    table, sizes = _table_also_grouped(pipeline)
    assert_that(_lookup(pipeline, table), equal_to([20, 30, 40]), label="Looked up")
    weights = [(w, len([k for k in range(100) if k % 7 + 1 == w])) for w in range(1, 8)]
    assert_that(sizes, equal_to(weights))
    result = pipeline.run()
    result.wait_until_finish()
    (counter,) = result.metrics().query(MetricsFilter().with_name("weights"))["counters"]
    return int(counter.committed)


@pytest.mark.spark
def test_a_table_also_read_as_main_input_runs_once_on_the_driver(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert _run_table_also_grouped(caplog) == 100
    assert "from 100 literal row(s)" in caplog.text
    assert "its rows read as main input too" in caplog.text


@pytest.mark.spark
def test_a_table_too_large_to_keep_on_the_driver_runs_on_spark(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_side_inputs, "DRIVER_OUTPUT_MAX_BYTES", 64)
    # The driver's run stopped, as a failed attempt: committed once, by the Spark job.
    assert _run_table_also_grouped(caplog) == 100
    assert "writes over 64 bytes for main inputs: it runs on Spark" in caplog.text
    assert "computed on the driver" not in caplog.text


def test_a_table_from_a_file_or_a_grouping_keeps_its_job(tmp_path: Any) -> None:
    (tmp_path / "keys.txt").write_text("1\n2\n3\n")
    pipeline = beam.Pipeline()
    table = (
        pipeline
        | beam.io.ReadFromText(str(tmp_path / "keys.txt"))
        | "Weigh" >> beam.Map(lambda line: _weight(int(line)))
    )
    _lookup(pipeline, table)
    plan = _plan(pipeline)
    assert driver_stage(plan, _side_buffer(plan)) is None
    pipeline = beam.Pipeline()
    table = pipeline | "Pairs" >> beam.Create([(1, 2), (1, 3)]) | beam.CombinePerKey(sum)
    _lookup(pipeline, table)
    plan = _plan(pipeline)
    assert driver_stage(plan, _side_buffer(plan)) is None


def test_a_large_create_keeps_its_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(physical, "DRIVER_SIDE_INPUT_MAX_ROWS", 99)
    pipeline = beam.Pipeline()
    table = pipeline | "Keys" >> beam.Create(list(range(100))) | "Weigh" >> beam.Map(_weight)
    _lookup(pipeline, table)
    plan = _plan(pipeline)
    assert driver_stage(plan, _side_buffer(plan)) is None


def _options() -> PipelineOptions:
    return PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}"]
    )


@pytest.mark.spark
def test_the_driver_computes_it_once_with_its_metrics(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="beam_spark_runner.translators.driver_side_inputs")
    LIFECYCLE.clear()
    pipeline = beam.Pipeline(options=_options())
    table = pipeline | "Keys" >> beam.Create(list(range(100))) | "Weigh" >> beam.ParDo(_Weigh())
    assert_that(_lookup(pipeline, table), equal_to([20, 30, 40]))
    result = pipeline.run()
    result.wait_until_finish()
    assert "computed on the driver from 100 literal row(s)" in caplog.text
    # In this process, and torn down once done, not when the process exits.
    assert LIFECYCLE == ["setup", "teardown"]
    (counter,) = result.metrics().query(MetricsFilter().with_name("weights"))["counters"]
    assert counter.committed == 100  # once: not again in the pipeline's Spark job
    assert "Weigh" in counter.key.step


@pytest.mark.spark
def test_a_failure_on_the_driver_names_the_stage_and_the_users_error() -> None:
    def broken(key: int) -> tuple[int, int]:
        raise ValueError(f"no weight for {key}")

    pipeline = beam.Pipeline(options=_options())
    table = pipeline | "Keys" >> beam.Create([1, 2]) | "Weigh" >> beam.Map(broken)
    _lookup(pipeline, table)
    with pytest.raises(PipelineExecutionError, match=r"(?s)Weigh.*no weight for 1") as error:
        pipeline.run().wait_until_finish()
    assert error.value.stage_name is not None and "Weigh" in error.value.stage_name
