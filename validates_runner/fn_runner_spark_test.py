"""Beam's ``FnApiRunnerTest`` suite run on SparkStructuredRunner."""

from __future__ import annotations

import unittest
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner_test

from beam_spark_runner import SparkStructuredRunner

SPARK_PIPELINE_ARGS = ["--spark_master=local[2]"]


def _spark_pipeline() -> beam.Pipeline:
    return beam.Pipeline(
        runner=SparkStructuredRunner(), options=PipelineOptions(SPARK_PIPELINE_ARGS)
    )


class SparkStructuredRunnerTest(fn_runner_test.FnApiRunnerTest):
    """Beam's FnApiRunner tests on Spark."""

    def create_pipeline(self, is_drain: bool = False) -> beam.Pipeline:
        return _spark_pipeline()


class SparkStructuredRunnerMetricsTest(fn_runner_test.FnApiRunnerMetricsTest):
    """Beam's FnApiRunner metrics tests on Spark."""

    def create_pipeline(self) -> beam.Pipeline:
        return _spark_pipeline()


if __name__ == "__main__":
    unittest.main()


__all__: list[Any] = []
