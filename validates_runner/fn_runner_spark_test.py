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
from validates_runner.reasons import (
    DRAIN,
    FNAPI_RESULT_INTERNALS,
    RUNNER_SPLITS,
    STATE_BACKED_ITERABLES,
    STREAMING,
)

DEFAULT_PIPELINE_ARGS = ["--spark_master=local[2]"]


def spark_pipeline_args() -> list[str]:
    """The pipeline arguments: ``--test-pipeline-options`` if given, else local[2]."""
    # Through the module: a TestPipeline name here would make pytest try to collect it.
    options = test_pipeline.TestPipeline.pytest_test_pipeline_options
    return shlex.split(options) if options else list(DEFAULT_PIPELINE_ARGS)


def spark_pipeline() -> beam.Pipeline:
    """A pipeline on SparkStructuredRunner."""
    return beam.Pipeline(
        runner=SparkStructuredRunner(), options=PipelineOptions(spark_pipeline_args())
    )


class SparkStructuredRunnerTest(fn_runner_test.FnApiRunnerTest):
    """Beam's FnApiRunnerTest on Spark."""

    def create_pipeline(self, is_drain: bool = False) -> beam.Pipeline:
        return spark_pipeline()

    # Streaming: unbounded PCollections and draining.

    # The three event-time timer tests read a PeriodicImpulse (unbounded); Beam skips them
    # on FnApiRunner too (apache/beam#35168).
    @unittest.skip(f"{STREAMING} (PeriodicImpulse)")
    def test_pardo_et_timer_with_no_firing(self) -> None:
        super().test_pardo_et_timer_with_no_firing()

    @unittest.skip(f"{STREAMING} (PeriodicImpulse)")
    def test_pardo_et_timer_with_no_reset(self) -> None:
        super().test_pardo_et_timer_with_no_reset()

    @unittest.skip(f"{STREAMING} (PeriodicImpulse)")
    def test_pardo_et_timer_with_no_reset_and_no_clear(self) -> None:
        super().test_pardo_et_timer_with_no_reset_and_no_clear()

    @unittest.skip(STREAMING)
    def test_unbounded_source_read(self) -> None:
        super().test_unbounded_source_read()

    @unittest.skip(f"{STREAMING} (PeriodicImpulse)")
    def test_sliding_windows(self) -> None:
        super().test_sliding_windows()

    @unittest.skip(DRAIN)
    def test_sdf_default_truncate_when_unbounded(self) -> None:
        super().test_sdf_default_truncate_when_unbounded()

    @unittest.skip(DRAIN)
    def test_sdf_with_truncate(self) -> None:
        super().test_sdf_with_truncate()


class SparkStructuredRunnerMetricsTest(fn_runner_test.FnApiRunnerMetricsTest):
    """Beam's FnApiRunnerMetricsTest on Spark."""

    def create_pipeline(self) -> beam.Pipeline:
        return spark_pipeline()

    @unittest.skip(FNAPI_RESULT_INTERNALS)
    def test_element_count_metrics(self) -> None:
        super().test_element_count_metrics()

    @unittest.skip(FNAPI_RESULT_INTERNALS)
    def test_non_user_metrics(self) -> None:
        super().test_non_user_metrics()

    @unittest.skip(FNAPI_RESULT_INTERNALS)
    def test_progress_metrics(self) -> None:  # type: ignore[override]
        super().test_progress_metrics()


@unittest.skip(RUNNER_SPLITS)
class SparkStructuredRunnerSplitTest(fn_runner_test.FnApiRunnerSplitTest):
    """Beam's FnApiRunnerSplitTest on Spark."""

    def create_pipeline(self, is_drain: bool = False) -> beam.Pipeline:
        return spark_pipeline()


class SparkStateBackedCoderTest(fn_runner_test.FnApiBasedStateBackedCoderTest):
    """Beam's it_validatesrunner GBK test, which hard-wires the FnApiRunner, on Spark."""

    def create_pipeline(self) -> beam.Pipeline:
        return spark_pipeline()

    @unittest.skip(STATE_BACKED_ITERABLES)
    def test_gbk_many_values(self) -> None:
        super().test_gbk_many_values()


if __name__ == "__main__":
    unittest.main()
