"""What a streaming run refuses before Spark starts, on the unfused pipeline (no Spark)."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.streaming.check import check_streaming_pipeline
from tests.unbounded_side_reader import UnboundedPrimitive


def test_an_unbounded_source_that_is_no_splittable_dofn_is_refused_naming_it() -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    _ = pipeline | beam.Create([1]) | "Unbounded" >> UnboundedPrimitive()
    proto = bi.prepare_pipeline_proto(
        pipeline.to_runner_api(default_environment=bi.default_environment())
    )
    with pytest.raises(UnsupportedFeatureError, match="'Unbounded'.*is not a splittable DoFn"):
        check_streaming_pipeline(proto)
