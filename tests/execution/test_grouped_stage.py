"""A GroupByKey grouped in the one stateless stage that reads it (``execution.grouped_stage``).

Counted on the translated DataFrames: each ``mapInArrow`` is a Python worker per task.
"""

from __future__ import annotations

import re
import typing

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import TaskSinks
from beam_spark_runner.options import spark_settings
from beam_spark_runner.planning import BufferKind, build_plan
from beam_spark_runner.planning.physical import groups_in_stage, has_one_key
from beam_spark_runner.spark.session import obtain_session
from beam_spark_runner.translators import translator_for
from beam_spark_runner.translators.base import TranslationContext
from beam_spark_runner.translators.group_by_key import grouped_as_read, sorted_by_key

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _python_passes(p: beam.Pipeline) -> tuple[int, int]:
    """The deepest stage's count of ``mapInArrow`` nodes, and the number of stages."""
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    context = TranslationContext(spark, build_plan(proto), "test", 2, TaskSinks(), translator_for)
    stage_frames = [context.stage_frame(stage.name) for stage in context.plan.stages]
    # A stage's plan holds the mapInArrow nodes of the stages before it: count each
    # node once, by the Python function it runs (named after the stage or the GroupByKey).
    passes = {
        name
        for frame in stage_frames
        for name in re.findall(
            r"MapInArrow (\w+)\(",
            frame._jdf.queryExecution().logical().toString(),  # noqa: SLF001
        )
    }
    return len(passes), len(stage_frames)


def _keyed(p: beam.Pipeline) -> beam.PCollection:
    return p | beam.Create([(k % 3, k) for k in range(30)])


@pytest.mark.spark
def test_group_by_key_runs_in_its_only_readers_python_worker() -> None:
    p = beam.Pipeline()
    _ = _keyed(p) | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sum(vs)))
    # Every pass is a stage's: the grouping runs in its reader's (one more before).
    passes, stages = _python_passes(p)
    assert passes == stages


@pytest.mark.spark
def test_group_by_key_also_read_as_side_input() -> None:
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    grouped = _keyed(p) | beam.GroupByKey()
    sums = grouped | beam.MapTuple(lambda k, vs: (k, sum(vs)))
    keys = (
        p
        | "Other" >> beam.Create([1, 2])
        | beam.Map(lambda x, g: (x, sorted(k for k, _ in g)), beam.pvalue.AsList(grouped))
    )
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    plan = build_plan(proto)
    # The stage reading the GroupByKey writes the grouped PCollection for the side input:
    # grouping still runs once, in that stage.
    assert sum(groups_in_stage(plan, stage) for stage in plan.stages) == 1
    assert_that(sums, equal_to([(k, sum(range(k, 30, 3))) for k in range(3)]), label="sums")
    assert_that(keys, equal_to([(1, [0, 1, 2]), (2, [0, 1, 2])]), label="keys")
    p.run().wait_until_finish()


@pytest.mark.spark
def test_grouped_in_stage_output() -> None:
    # More keys than a bundle holds, some spanning Arrow batches of the sorted input.
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    sums = (
        p
        | beam.Create(range(4))
        | beam.FlatMap(lambda seed: ((i % 25_000, i) for i in range(seed, 100_000, 4)))
        | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, sorted(typing.cast(typing.Iterable[int], vs))))
    )
    assert_that(sums, equal_to([(k, [k + 25_000 * j for j in range(4)]) for k in range(25_000)]))
    p.run().wait_until_finish()


def _group_partitions(p: beam.Pipeline) -> list[tuple[bool, int]]:
    """(has_one_key, partitions of the shuffled input) of each GroupByKey's buffer."""
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    context = TranslationContext(spark, build_plan(proto), "test", 2, TaskSinks(), translator_for)
    return [
        (has_one_key(buffer, context.plan), sorted_by_key(buffer, context).rdd.getNumPartitions())
        for buffer in context.plan.buffers.values()
        if buffer.kind == BufferKind.GROUP
    ]


@pytest.mark.spark
def test_a_global_combine_merges_in_one_partition() -> None:
    # CombineGlobally keys every element with None: hashed over both cores, one partition
    # would hold them all and the other be a task starting a Python worker for nothing.
    p = beam.Pipeline()
    _ = p | beam.Create(range(10)) | beam.FlatMap(lambda x: [x, x]) | beam.CombineGlobally(sum)
    assert _group_partitions(p) == [(True, 1)]
    p = beam.Pipeline()
    _ = p | beam.Create(range(10)) | beam.combiners.Count.Globally().without_defaults()
    assert _group_partitions(p) == [(True, 1)]
    p = beam.Pipeline()
    _ = _keyed(p) | beam.CombinePerKey(sum)
    assert _group_partitions(p) == [(False, 2)]
    # A user's own None keys: the runner does not know them in advance.
    p = beam.Pipeline()
    _ = p | beam.Create([(None, 1), (None, 2)]) | beam.GroupByKey()
    assert _group_partitions(p) == [(False, 2)]


@pytest.mark.spark
def test_global_combines_in_one_partition_give_beams_results() -> None:
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    numbers = p | beam.Create(range(1, 101)) | beam.FlatMap(lambda x: [x, -x, x])
    empty = p | "Empty" >> beam.Create([]).with_output_types(int)
    windowed = (
        p
        | "Timed" >> beam.Create(range(20))
        | beam.Map(lambda x: beam.window.TimestampedValue(x, x))
        | beam.WindowInto(beam.window.FixedWindows(5))
    )
    assert_that(numbers | "Sum" >> beam.CombineGlobally(sum), equal_to([5050]), label="sum")
    assert_that(numbers | beam.combiners.Count.Globally(), equal_to([300]), label="count")
    assert_that(empty | "EmptySum" >> beam.CombineGlobally(sum), equal_to([0]), label="empty")
    assert_that(
        windowed | "WindowedSum" >> beam.CombineGlobally(sum).without_defaults(),
        equal_to([sum(range(i, i + 5)) for i in range(0, 20, 5)]),
        label="windowed",
    )
    p.run().wait_until_finish()


class _Opaque:
    """A user type: its coder (pickling) is read as opaque bytes by grouping."""

    def __init__(self, n: int) -> None:
        self.n = n


def _grouping_read_as(values: typing.Callable[[int], object]) -> list[bool]:
    p = beam.Pipeline()
    _ = (
        p
        | beam.Create(range(6))
        | beam.Map(lambda i: (i % 2, values(i)))
        | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(list(vs))))
    )
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    plan = build_plan(proto)
    return [
        grouped_as_read(plan.buffers[stage.input_buffer_id], plan)
        for stage in plan.stages
        if groups_in_stage(plan, stage)
    ]


def test_groups_reach_the_stage_as_windowed_values_only_where_decoded_alike() -> None:
    """Grouping reads user types as opaque bytes: those groups go encoded, for the stage."""
    assert _grouping_read_as(lambda i: i) == [True]
    assert _grouping_read_as(_Opaque) == [False]
