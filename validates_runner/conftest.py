"""Pytest plugin standing in for Beam's own ``sdks/python/conftest.py``.

Beam's wheel ships its test modules but not the conftest that registers
``--test-pipeline-options`` and hands it to :class:`TestPipeline`. This module does that,
and registers the markers Beam's tests use. It is loaded automatically for tests in this
directory and explicitly (``-p validates_runner.conftest``) for Beam's modules collected
with ``--pyargs``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from validates_runner import force_runner
from validates_runner.reasons import PUBSUB_STREAMING

# The options Beam's ``it_validatesrunner`` tests run with by default (see README.md).
DEFAULT_TEST_PIPELINE_OPTIONS = "--runner=SparkStructuredRunner --spark_master=local[2]"

# Markers found in the installed apache_beam's tests (Beam declares them in its pytest.ini,
# which the wheel does not ship either).
BEAM_MARKERS: dict[str, str] = {
    "it_validatesrunner": "Beam integration test validating a runner",
    "it_validatescontainer": "Beam integration test validating an SDK container",
    "it_postcommit": "Beam post-commit integration test",
    "examples_postcommit": "Beam examples post-commit test",
    "no_xdist": "must not run under pytest-xdist",
    "no_sickbay_batch": "Beam: not in the batch sickbay",
    "no_sickbay_streaming": "Beam: not in the streaming sickbay",
    "sickbay_dataflow": "Beam: known to fail on Dataflow",
    "sickbay_direct": "Beam: known to fail on the direct runner",
    "sickbay_flink": "Beam: known to fail on Flink",
    "sickbay_spark": "Beam: known to fail on Beam's Java Spark runner",
    "timeout": "Beam: per-test timeout (needs pytest-timeout)",
    "spannerio_it": "Beam Spanner IO integration test",
    "require_docker_in_docker": "needs docker in docker",
    "anthropic_postcommit": "Beam post-commit test",
    "gemini_postcommit": "Beam post-commit test",
    "vertex_ai_postcommit": "Beam post-commit test",
    "xlang_sql_expansion_service": "needs the SQL expansion service",
    "xlang_wrapper_generation": "needs cross-language wrapper generation",
    "uses_dill": "needs dill",
    "uses_feast": "needs feast",
    "uses_gcp_java_expansion_service": "needs the GCP Java expansion service",
    "uses_io_java_expansion_service": "needs the IO Java expansion service",
    "uses_java_expansion_service": "needs a Java expansion service",
    "uses_messaging_java_expansion_service": "needs the messaging Java expansion service",
    "uses_mock_api": "needs a mock API server",
    "uses_onnx": "needs onnx",
    "uses_pyarrow": "needs pyarrow",
    "uses_python_expansion_service": "needs a Python expansion service",
    "uses_pytorch": "needs pytorch",
    "uses_sklearn": "needs scikit-learn",
    "uses_tensorflow": "needs tensorflow",
    "uses_tensorrt": "needs tensorrt",
    "uses_testcontainer": "needs testcontainers",
    "uses_tf": "needs tensorflow",
    "uses_tft": "needs tensorflow-transform",
    "uses_transform_service": "needs the transform service",
    "uses_transformers": "needs transformers",
    "uses_xgboost": "needs xgboost",
}


# Beam tests (``module::Class::test``) that cannot pass on SparkStructuredRunner yet, with the
# missing capability. Each was run and seen to fail for that reason.
SKIPS: dict[str, str] = {
    "apache_beam.runners.dataflow.dataflow_exercise_streaming_metrics_pipeline_test"
    "::ExerciseStreamingMetricsPipelineTest"
    "::test_streaming_pipeline_returns_expected_user_metrics_fnapi_it": PUBSUB_STREAMING,
}

# Beam tests (``module::Class``) that build their pipelines with a runner or options of
# their own, dropping --test-pipeline-options: every pipeline they build is forced onto this
# runner (validates_runner/force_runner.py), with these SparkRunnerOptions, so they test it.
FORCED_ONTO_SPARK: dict[str, dict[str, Any]] = {
    # TestPipeline(options=PipelineOptions(streaming=True)) with a TestStream.
    "apache_beam.transforms.combiners_test::TimestampCombinerTest": {},
    # FnApiRunner(use_state_iterables=True); the same switch here.
    "apache_beam.runners.portability.fn_api_runner.fn_runner_test"
    "::FnApiBasedStateBackedCoderTest": {"spark_state_backed_iterables": True},
}

# junitxml properties (read by report.py): the test's ``module::Class::test`` key and each
# runner the test ran a pipeline on.
KEY_PROPERTY = "test_key"
RUNNER_PROPERTY = "pipeline_runner"


def item_key(item: pytest.Item) -> str:
    """``module::Class::test`` of a collected test, independent of where Beam is installed."""
    module = getattr(item, "module", None)
    name = module.__name__ if module is not None else item.path.stem
    return f"{name}::{item.nodeid.split('::', 1)[1]}" if "::" in item.nodeid else name


def pytest_addoption(parser: pytest.Parser) -> None:
    """Registers ``--test-pipeline-options`` as Beam's conftest does."""
    parser.addoption(
        "--test-pipeline-options",
        action="store",
        default=None,
        help=(
            "Pipeline options for Beam's TestPipeline, e.g. "
            f"'{DEFAULT_TEST_PIPELINE_OPTIONS}'. Tests may ignore some or all of them."
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    """Registers Beam's markers and passes the test pipeline options to TestPipeline."""
    for name, description in BEAM_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    # Beam's test modules import TestPipeline, TestStream and the like at module level.
    config.addinivalue_line("filterwarnings", "ignore::pytest.PytestCollectionWarning")
    from apache_beam.testing.test_pipeline import TestPipeline

    options: Any = config.getoption("test_pipeline_options", default=None)
    TestPipeline.pytest_test_pipeline_options = options


def skip_reason(key: str) -> str | None:
    """Why the test ``key`` is skipped on this runner, or None to run it."""
    return SKIPS.get(key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips tests needing a missing capability."""
    for item in items:
        key = item_key(item)
        item.user_properties.append((KEY_PROPERTY, key))
        reason = skip_reason(key)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _record_pipeline_runners(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Records which runner each pipeline of the test ran on, as a junitxml property."""
    from apache_beam.pipeline import Pipeline

    runners: set[str] = set()
    original_run = Pipeline.run

    def run(self: Pipeline, *args: Any, **kwargs: Any) -> Any:
        runners.add(type(self.runner).__name__)
        return original_run(self, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "run", run)
    key = item_key(request.node)
    for prefix, spark_options in FORCED_ONTO_SPARK.items():
        if key == prefix or key.startswith(prefix + "::"):
            monkeypatch.setattr(Pipeline, "__init__", force_runner.on_spark_with(**spark_options))
    yield
    for runner in sorted(runners):
        request.node.user_properties.append((RUNNER_PROPERTY, runner))
