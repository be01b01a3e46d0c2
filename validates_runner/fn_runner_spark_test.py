"""Beam's ``FnApiRunnerTest`` suites, run on SparkStructuredRunner.

The Beam classes are subclassed, never copied: only ``create_pipeline`` is overridden, as
Beam's own ``flink_runner_test.py`` and ``spark_runner_test.py`` do, plus one override per
test that cannot pass yet, each skipped with the capability it is missing (see
``reasons.py``). The Beam classes are reached through their module, so pytest does not
collect them a second time on the FnApiRunner.

Pipelines use ``--test-pipeline-options`` when given (the runner in it is ignored), else
``--spark_master=local[2]``. All tests of a pytest process share one SparkSession: the runner
keeps the session it created for the whole process.
"""

from __future__ import annotations

import shlex
import unittest

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import fn_runner_test
from apache_beam.testing import test_pipeline

from beam_spark_runner import SparkStructuredRunner
from beam_spark_runner.spark.compat import STREAMING_SPARK, pyspark_version
from validates_runner.reasons import (
    RUNNER_SPLITS,
    STREAMING_SPARK_NEEDED,
)

DEFAULT_PIPELINE_ARGS = ["--spark_master=local[2]"]


def spark_pipeline_args() -> list[str]:
    """The pipeline arguments: ``--test-pipeline-options`` if given, else local[2]."""
    # Through the module: a TestPipeline name here would make pytest try to collect it.
    options = test_pipeline.TestPipeline.pytest_test_pipeline_options
    return shlex.split(options) if options else list(DEFAULT_PIPELINE_ARGS)


def spark_pipeline(is_drain: bool = False) -> beam.Pipeline:
    """A pipeline on SparkStructuredRunner; ``is_drain`` as in ``FnApiRunner(is_drain=...)``."""
    args = spark_pipeline_args() + (["--spark_drain"] if is_drain else [])
    return beam.Pipeline(runner=SparkStructuredRunner(), options=PipelineOptions(args))


# FnApiRunnerTest's tests whose pipelines read an unbounded source: they stream.
STREAMING_TESTS = (
    "test_pardo_et_timer_with_no_firing",
    "test_pardo_et_timer_with_no_reset",
    "test_pardo_et_timer_with_no_reset_and_no_clear",
    "test_sliding_windows",
    "test_unbounded_source_read",
)


class SparkStructuredRunnerTest(fn_runner_test.FnApiRunnerTest):
    """Beam's FnApiRunnerTest on Spark."""

    def create_pipeline(self, is_drain: bool = False) -> beam.Pipeline:
        return spark_pipeline(is_drain)


if pyspark_version() < STREAMING_SPARK:
    for _name in STREAMING_TESTS:
        if hasattr(fn_runner_test.FnApiRunnerTest, _name):
            _skipped = unittest.skip(STREAMING_SPARK_NEEDED)(
                getattr(fn_runner_test.FnApiRunnerTest, _name)
            )
            setattr(SparkStructuredRunnerTest, _name, _skipped)


class SparkStructuredRunnerMetricsTest(fn_runner_test.FnApiRunnerMetricsTest):
    """Beam's FnApiRunnerMetricsTest on Spark: system metrics per stage and PCollection."""

    def create_pipeline(self) -> beam.Pipeline:
        return spark_pipeline()


@unittest.skip(RUNNER_SPLITS)
class SparkStructuredRunnerSplitTest(fn_runner_test.FnApiRunnerSplitTest):
    """Beam's FnApiRunnerSplitTest on Spark."""

    def create_pipeline(self, is_drain: bool = False) -> beam.Pipeline:
        return spark_pipeline()


class SparkStateBackedCoderTest(fn_runner_test.FnApiBasedStateBackedCoderTest):
    """Beam's it_validatesrunner GBK test, which hard-wires the FnApiRunner, on Spark.

    Upstream runs it on ``FnApiRunner(use_state_iterables=True)``; the same switch here is
    ``--spark_state_backed_iterables``.
    """

    def create_pipeline(self) -> beam.Pipeline:
        return beam.Pipeline(
            runner=SparkStructuredRunner(),
            options=PipelineOptions([*spark_pipeline_args(), "--spark_state_backed_iterables"]),
        )


if __name__ == "__main__":
    unittest.main()
