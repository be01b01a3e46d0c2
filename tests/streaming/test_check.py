"""What a streaming run refuses before Spark starts, on the fused plan (no Spark)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import userstate, window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning import Plan, build_plan
from beam_spark_runner.streaming.check import check_streaming_plan
from tests.unbounded_side_reader import UnboundedWithSide


def _plan(build: Callable[[beam.Pipeline], Any]) -> Plan:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    build(pipeline)
    pipeline.visit(bi.group_by_key_input_visitor(True))
    return build_plan(
        pipeline.to_runner_api(default_environment=bi.default_environment()), streaming=True
    )


class _Seen(beam.DoFn):  # type: ignore[misc]
    SEEN = userstate.BagStateSpec("seen", VarIntCoder())

    def process(self, kv: Any, side: Any, seen: Any = beam.DoFn.StateParam(SEEN)) -> Any:
        seen.add(1)
        yield kv[1], side


def _ticks(pipeline: beam.Pipeline, name: str) -> Any:
    return (
        pipeline
        | name >> PeriodicImpulse(0, 10, 1)
        | f"{name}Windows" >> beam.WindowInto(window.FixedWindows(5))
    )


def test_a_stateful_dofn_reading_a_streamed_side_input_streams() -> None:
    def build(pipeline: beam.Pipeline) -> None:
        side = beam.pvalue.AsSingleton(_ticks(pipeline, "Side"))
        _ = (
            _ticks(pipeline, "Main")
            | beam.Map(lambda at: ("k", at))
            | "Stateful" >> beam.ParDo(_Seen(), side)
        )

    check_streaming_plan(_plan(build))


def test_an_unbounded_splittable_dofn_reading_a_streamed_side_input_is_refused() -> None:
    def build(pipeline: beam.Pipeline) -> None:
        side = beam.pvalue.AsSingleton(_ticks(pipeline, "Side"))
        _ = _ticks(pipeline, "Main") | "Unbounded" >> beam.ParDo(UnboundedWithSide(), side)

    with pytest.raises(UnsupportedFeatureError, match="runs an unbounded splittable DoFn"):
        check_streaming_plan(_plan(build))
