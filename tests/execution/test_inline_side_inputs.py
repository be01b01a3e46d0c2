"""Side inputs read inside the pipeline's Spark job (``execution.inline_side_inputs``).

``CombineGlobally`` injects its default value with a ``Map`` over ``Create([None])`` that
reads the combined value as a side input. That stage reads its side input from its own
input rows, in the same task as the combine's merge: no collect-and-broadcast job. The
results must be Beam's, empty inputs included; other side inputs keep the broadcast.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import inline_side_inputs
from beam_spark_runner.execution.stage_worker import ELEMENT, KEY
from beam_spark_runner.planning import Plan, build_plan, physical
from beam_spark_runner.rewrites.native_create import NativeCreateOverride
from beam_spark_runner.translators import driver_side_inputs

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _plan(build: object) -> Plan:
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    build(p)  # type: ignore[operator]
    p.replace_all([NativeCreateOverride()])
    proto = p.to_runner_api(default_environment=bi.default_environment())
    return build_plan(bi.prepare_pipeline_proto(proto))


def _inline_stages(plan: Plan) -> list[str]:
    return [
        " ".join(stage.user_transform_names)
        for stage in plan.stages
        if physical.reads_side_inputs_inline(plan, stage)
    ]


def test_combine_globally_default_injection_reads_its_side_input_inline() -> None:
    plan = _plan(lambda p: p | beam.Create([1, 2, 3]) | beam.combiners.Count.Globally())
    assert len(_inline_stages(plan)) == 1
    assert "InjectDefault" in _inline_stages(plan)[0]


@pytest.mark.spark
def test_the_combines_merge_runs_in_the_default_injections_python_worker() -> None:
    import re

    from beam_spark_runner.execution.stage_worker import TaskSinks
    from beam_spark_runner.options import spark_settings
    from beam_spark_runner.spark.session import obtain_session
    from beam_spark_runner.translators import translator_for
    from beam_spark_runner.translators.base import TranslationContext

    plan = _plan(lambda p: p | beam.Create([1, 2, 3]) | beam.combiners.Count.Globally())
    (inline,) = [s for s in plan.stages if physical.reads_side_inputs_inline(plan, s)]
    writer = physical.grouped_side_input_writer(plan, inline)
    assert writer is not None and "Merge" in " ".join(writer.user_transform_names)
    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    context = TranslationContext(spark, plan, "test", 2, TaskSinks(), translator_for)
    frame = context.stage_frame(inline.name)
    plan_text = frame._jdf.queryExecution().logical().toString()  # noqa: SLF001
    # The precombining stage's and the default injection's: the merge has none of its own.
    assert len(re.findall(r"MapInArrow (\w+)\(", plan_text)) == 2


def test_other_side_inputs_keep_the_broadcast() -> None:
    def user_side_input(p: beam.Pipeline) -> None:
        side = p | "Side" >> beam.Create([1, 2])
        p | "Main" >> beam.Create([None]) | beam.Map(lambda _, s: s, beam.pvalue.AsList(side))

    def big_main_input(p: beam.Pipeline) -> None:
        total = p | "Side" >> beam.Create([1, 2]) | beam.CombineGlobally(sum).without_defaults()
        main = p | "Main" >> beam.Create(list(range(physical.INLINE_SIDE_INPUTS_MAX_MAIN_ROWS + 1)))
        main | beam.Map(lambda x, s: x + s, beam.pvalue.AsSingleton(total))

    def combined_read_twice(p: beam.Pipeline) -> None:
        total = p | "Side" >> beam.Create([1, 2]) | beam.CombineGlobally(sum).without_defaults()
        for name in ("A", "B"):
            main = p | f"Main{name}" >> beam.Create([0])
            main | f"Add{name}" >> beam.Map(lambda x, s: x + s, beam.pvalue.AsSingleton(total))
        main | "Other" >> beam.Map(lambda x, s: x, beam.pvalue.AsList(total))

    assert _inline_stages(_plan(user_side_input)) == []
    assert _inline_stages(_plan(big_main_input)) == []
    # A side input read by more than one stage would be computed once per reader.
    assert _inline_stages(_plan(combined_read_twice)) == []


def test_split_rows_separates_main_rows_from_each_side_input() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            KEY: pa.array([None, b"1", b"0", None, b"1"], pa.binary()),
            ELEMENT: pa.array([b"m1", b"s1a", b"s0", b"m2", b"s1b"], pa.binary()),
        }
    )
    main, sides = inline_side_inputs.split_rows([batch], 2)
    assert [row for b in main for row in b.column(ELEMENT).to_pylist()] == [b"m1", b"m2"]
    assert sides == [[b"s0"], [b"s1a", b"s1b"]]


@pytest.mark.spark
@pytest.mark.parametrize("empty", [False, True])
def test_global_combines_give_beams_results_without_a_side_input_job(
    empty: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    broadcast_side_inputs: list[str] = []
    original = driver_side_inputs.side_input_state_entries

    def recording(transform_id: str, *args: object) -> object:
        broadcast_side_inputs.append(transform_id)
        return original(transform_id, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(driver_side_inputs, "side_input_state_entries", recording)
    values = [] if empty else [1, 2, 3, 4]
    p = beam.Pipeline(options=PipelineOptions(SPARK_ARGS))
    nums = p | beam.Create(values).with_output_types(int)
    counted = nums | beam.Map(lambda x: Metrics.counter("test", "seen").inc() or x)
    assert_that(counted | "Sum" >> beam.CombineGlobally(sum), equal_to([sum(values)]), "sum")
    assert_that(counted | beam.combiners.Count.Globally(), equal_to([len(values)]), "count")
    assert_that(
        counted | "Max" >> beam.CombineGlobally(lambda xs: max(xs, default=-1)),
        equal_to([max(values, default=-1)]),
        "max",
    )
    result = p.run()
    result.wait_until_finish()
    seen = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert sum(c.committed for c in seen) == len(values)
    # assert_that reads no side input; the combines' default injections read theirs inline.
    assert broadcast_side_inputs == []
