"""Planning for a streaming run (no Spark)."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import TimestampCombiner

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import build_plan
from beam_spark_runner.streaming import check

PRECOMBINE = bi.common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn


def _urns(combiner: str, streaming: bool) -> set[str]:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    _ = (
        pipeline
        | ScriptedStream().add_elements([("k", 1)])
        | beam.Map(lambda kv: kv).with_output_types(tuple[str, int])
        | beam.WindowInto(window.FixedWindows(10), timestamp_combiner=combiner)
        | beam.CombinePerKey(sum)
    )
    pipeline.visit(bi.group_by_key_input_visitor(True))
    plan = build_plan(
        pipeline.to_runner_api(default_environment=bi.default_environment()), streaming=streaming
    )
    return {t.spec.urn for s in plan.stages for t in s.descriptor.transforms.values()}


@pytest.mark.parametrize(
    "combiner", [TimestampCombiner.OUTPUT_AT_EARLIEST, TimestampCombiner.OUTPUT_AT_LATEST]
)
def test_a_combine_holding_at_its_elements_is_not_lifted_in_streaming(combiner: str) -> None:
    # Beam's precombine would fold late elements' timestamps into the watermark hold.
    assert PRECOMBINE not in _urns(combiner, streaming=True)
    assert PRECOMBINE in _urns(combiner, streaming=False)


def test_an_end_of_window_combine_is_lifted_in_streaming() -> None:
    assert PRECOMBINE in _urns(TimestampCombiner.OUTPUT_AT_EOW, streaming=True)


def _plan(build: Any, streaming: bool = True) -> Any:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    build(pipeline)
    pipeline.visit(bi.group_by_key_input_visitor(True))
    return build_plan(
        pipeline.to_runner_api(default_environment=bi.default_environment()), streaming=streaming
    )


def _slowly_updating(pipeline: beam.Pipeline) -> None:
    side = pipeline | "Side" >> PeriodicImpulse(0, 20, 5, apply_windowing=True)
    _ = (
        pipeline
        | "Main" >> PeriodicImpulse(0, 20, 1)
        | "Windows" >> beam.WindowInto(window.FixedWindows(5))
        | "Read" >> beam.Map(lambda at, s: (at, s), s=beam.pvalue.AsSingleton(side))
        | "After" >> beam.Map(lambda pair: pair)
    )


def test_a_side_input_reader_does_not_fuse_into_an_unbounded_splittable_dofns_stage() -> None:
    plan = _plan(_slowly_updating)
    (reader,) = [s for s in plan.stages if s.side_inputs]
    assert reader.user_transform_names[0] == "Read"
    assert "After" in reader.user_transform_names
    assert not check.is_unbounded_splittable(reader)
    # The splittable DoFn's stage keeps the windowing the reader's input needs.
    (writer,) = [s for s in plan.stages if "Windows" in s.user_transform_names]
    assert check.is_unbounded_splittable(writer)
    # A batch run fuses as Beam does.
    (fused,) = [s for s in _plan(_slowly_updating, streaming=False).stages if s.side_inputs]
    assert "Windows" in fused.user_transform_names
