"""pytest plugin: every Beam pipeline the tests build runs on SparkStructuredRunner.

Beam's TestStream tests build their pipelines with ``TestPipeline(options=...)`` or name
a runner outright, so ``--test-pipeline-options`` cannot reach them. This plugin makes
``Pipeline.__init__`` pick SparkStructuredRunner on ``local[2]`` whatever the test asked
for, the rest of the options unchanged. Used by :mod:`validates_runner.teststream` (as a
``-p`` plugin, for every test) and by ``validates_runner/conftest.py`` (for the tests in
its ``FORCED_ONTO_SPARK``). As a plugin it also records, per test, how many pipelines ran
on SparkStructuredRunner and how many it refused before Spark started (junitxml
properties ``spark_pipelines_ran`` and ``spark_pipelines_refused``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.pipeline import Pipeline

from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.options import SparkRunnerOptions
from beam_spark_runner.runner import SparkStructuredRunner

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


# junitxml properties: pipelines of the test that ran on SparkStructuredRunner (a batch
# job or a streaming query started, whatever its outcome), and that it refused.
RAN_PROPERTY = "spark_pipelines_ran"
REFUSED_PROPERTY = "spark_pipelines_refused"
# The test's id, ``module.Class::test``, wherever Beam is installed (junitxml's classname
# depends on the path from pytest's rootdir).
TEST_ID_PROPERTY = "beam_test_id"
RAN, REFUSED = "ran", "refused"

# Pipelines of the running test, by outcome.
pipelines: Counter[str] = Counter()

_run_pipeline = SparkStructuredRunner.run_pipeline


def counted_run_pipeline(self: SparkStructuredRunner, pipeline: Any, options: Any) -> Any:
    """``SparkStructuredRunner.run_pipeline``, counting each run in ``pipelines``."""
    try:
        result = _run_pipeline(self, pipeline, options)
    except UnsupportedFeatureError:
        pipelines[REFUSED] += 1
        raise
    except BaseException:
        pipelines[RAN] += 1  # refusals come before Spark: anything else failed on it
        raise
    pipelines[RAN] += 1
    return result


def pytest_configure(config: Any) -> None:
    """As a ``-p`` plugin: every pipeline of the session runs on SparkStructuredRunner."""
    del config
    Pipeline.__init__ = on_spark  # type: ignore[method-assign]
    SparkStructuredRunner.run_pipeline = counted_run_pipeline  # type: ignore[method-assign]


def beam_test_id(item: Any) -> str:
    """``module.Class::test`` (``module::test`` outside a class) of a collected test."""
    module = getattr(item, "module", None)
    name = module.__name__ if module is not None else item.path.stem
    cls = getattr(item, "cls", None)
    return f"{name}.{cls.__name__}::{item.name}" if cls is not None else f"{name}::{item.name}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """Counts the test's pipelines from zero."""
    del item
    pipelines.clear()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Records the test's pipelines once its fixtures are torn down (its report follows)."""
    yield
    item.user_properties.append((TEST_ID_PROPERTY, beam_test_id(item)))
    item.user_properties.append((RAN_PROPERTY, str(pipelines[RAN])))
    item.user_properties.append((REFUSED_PROPERTY, str(pipelines[REFUSED])))
