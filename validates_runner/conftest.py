"""Pytest plugin standing in for Beam's own ``sdks/python/conftest.py``.

Beam's wheel ships its test modules but not the conftest that registers
``--test-pipeline-options`` and hands it to :class:`TestPipeline`. This module does that,
and registers the markers Beam's tests use. It is loaded automatically for tests in this
directory and explicitly (``-p validates_runner.conftest``) for Beam's modules collected
with ``--pyargs``.
"""

from __future__ import annotations

from typing import Any

import pytest

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
    from apache_beam.testing.test_pipeline import TestPipeline

    options: Any = config.getoption("test_pipeline_options", default=None)
    TestPipeline.pytest_test_pipeline_options = options
