"""pytest plugin: every Beam pipeline the tests build runs on SparkStructuredRunner.

Beam's TestStream tests build their pipelines with ``TestPipeline(options=...)`` or name
a runner outright, so ``--test-pipeline-options`` cannot reach them. This plugin makes
``Pipeline.__init__`` pick SparkStructuredRunner on ``local[2]`` whatever the test asked
for, the rest of the options unchanged. Used by :mod:`validates_runner.teststream` (as a
``-p`` plugin, for every test) and by ``validates_runner/conftest.py`` (for the tests in
its ``FORCED_ONTO_SPARK``).
"""

from __future__ import annotations

from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.pipeline import Pipeline

from beam_spark_runner.options import SparkRunnerOptions

RUNNER = "SparkStructuredRunner"
MASTER = "local[2]"

_beam_init = Pipeline.__init__


def on_spark_with(**spark_options: Any) -> Any:
    """A ``Pipeline.__init__`` running every pipeline on SparkStructuredRunner.

    ``spark_options`` are SparkRunnerOptions set on top, e.g.
    ``spark_state_backed_iterables=True``.
    """

    def init(
        self: Pipeline,
        runner: Any = None,
        options: PipelineOptions | None = None,
        argv: list[str] | None = None,
        display_data: dict[str, Any] | None = None,
    ) -> None:
        del runner  # whatever the test named, the pipeline runs on ours
        if options is None:
            options = PipelineOptions(argv or [])
        options.view_as(StandardOptions).runner = RUNNER
        spark = options.view_as(SparkRunnerOptions)
        spark.spark_master = MASTER
        for name, value in spark_options.items():
            setattr(spark, name, value)
        _beam_init(self, runner=RUNNER, options=options, display_data=display_data)

    return init


on_spark = on_spark_with()


def pytest_configure(config: Any) -> None:
    """As a ``-p`` plugin: every pipeline of the session runs on SparkStructuredRunner."""
    del config
    Pipeline.__init__ = on_spark  # type: ignore[method-assign]
