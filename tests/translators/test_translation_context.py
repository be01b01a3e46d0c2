"""``TranslationContext``: how a stage's output rows become the DataFrames others read."""

from __future__ import annotations

import types
from typing import Any

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import TaskSinks
from beam_spark_runner.options import spark_settings
from beam_spark_runner.spark.session import obtain_session
from beam_spark_runner.translators import translator_for
from beam_spark_runner.translators.base import TranslationContext, stage_output_type

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _context(outputs: int) -> tuple[TranslationContext, Any]:
    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    stage = types.SimpleNamespace(outputs=[object()] * outputs)
    plan: Any = types.SimpleNamespace(
        buffers={}, components=bi.beam_runner_api_pb2.Components(), stage=lambda name: stage
    )
    context = TranslationContext(spark, plan, "test", 2, TaskSinks(), translator_for)
    rows = spark.createDataFrame(
        [(index, None, b"out%d" % index) for index in range(outputs)], stage_output_type()
    )
    context._stage_frames["Stage"] = rows  # noqa: SLF001 - the stage's translated output
    return context, rows


@pytest.mark.spark
def test_an_output_of_several_is_its_tags_rows() -> None:
    context, _ = _context(outputs=3)
    for index in range(3):
        frame = context.output_frame("Stage", index)
        assert [bytes(row.element) for row in frame.collect()] == [b"out%d" % index]
    (buffer_rows,) = context.writer_frames(
        types.SimpleNamespace(writers=[("Stage", 1)])  # type: ignore[arg-type]
    )
    assert buffer_rows.columns == ["key", "element"]
    assert [bytes(row.element) for row in buffer_rows.collect()] == [b"out1"]


@pytest.mark.spark
def test_a_stages_only_output_is_read_without_a_filter() -> None:
    # A stage with one output writes nothing else: filtering its tag cost the driver an
    # analysis of the plan (~12 ms) per stage.
    context, rows = _context(outputs=1)
    assert context.output_frame("Stage", 0) is rows


@pytest.mark.spark
def test_a_session_builds_its_impulse_frame_once() -> None:
    from beam_spark_runner.translators.impulse import impulse_frame

    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    frame = impulse_frame(spark)
    assert impulse_frame(spark) is frame  # every later run reads the same DataFrame
    assert [(row.key, bytes(row.element)) for row in frame.collect()] == [
        (None, bi.ENCODED_IMPULSE_VALUE)
    ]
    assert frame.rdd.getNumPartitions() == 1


@pytest.mark.spark
def test_small_literal_rows_are_made_once_per_session_and_content(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from beam_spark_runner.translators import base

    context, _ = _context(outputs=1)
    later, _ = _context(outputs=1)  # another run's context, in the same session
    rows = context.literal_rows([b"a", b"b", b"c"])
    assert later.literal_rows([b"a", b"b", b"c"]) is rows
    assert sorted(bytes(row.element) for row in rows.collect()) == [b"a", b"b", b"c"]
    assert later.literal_rows([b"a", b"b"]) is not rows  # other content
    later.parallelism = 1
    single = later.literal_rows([b"a", b"b", b"c"])  # other partitions
    assert single is not rows and single.rdd.getNumPartitions() == 1
    # Large rows are made anew each time.
    big = [b"x" * (base._REMEMBERED_LITERAL_BYTES + 1)]
    assert context.literal_rows(big) is not context.literal_rows(big)
    # The most recent few are kept.
    monkeypatch.setattr(base, "_REMEMBERED_LITERALS", 2)
    base._LITERALS.pop(context.spark, None)
    one, two = context.literal_rows([b"1"]), context.literal_rows([b"2"])
    assert context.literal_rows([b"1"]) is one  # used again: the most recent now
    context.literal_rows([b"3"])  # the third: the least recently used (two) goes
    assert context.literal_rows([b"1"]) is one
    assert context.literal_rows([b"2"]) is not two
