"""Shared fixtures for the runner's tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

# Spark with two cores: exercises more than one partition, and stays light on a laptop.
SPARK_TEST_MASTER = "local[2]"

# `make quick`: the tests that start no Spark. A test that starts a JVM anyway fails there,
# naming the marker it lacks.
QUICK = os.environ.get("BEAM_SPARK_QUICK_TESTS") == "1"
# Fixtures that give a test a Spark session or run its pipelines on Spark.
_SPARK_FIXTURES = frozenset({"spark_session", "beam_options"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks ``spark`` the tests that use a Spark fixture (the others mark themselves)."""
    for item in items:
        if _SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(autouse=True, scope="session")
def _no_spark_in_quick_tests() -> Iterator[None]:
    """In ``make quick``, starting a Spark driver JVM fails the test that does it."""
    if not QUICK:
        yield
        return
    from pyspark import SparkContext

    # Where SparkContext looks launch_gateway up (pyspark.core.context on 4.x).
    context_module = sys.modules[SparkContext.__module__]

    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail(
            "This test starts Spark, so `make quick` should not run it: mark it "
            "`pytest.mark.spark` (or its module, with `pytestmark`)."
        )

    launch = context_module.launch_gateway
    context_module.launch_gateway = refuse
    try:
        yield
    finally:
        context_module.launch_gateway = launch


# How each driver JVM of the test process that exited ended; each reported once.
_driver_exits_reported: set[str] = set()


@pytest.fixture(autouse=True)
def _driver_jvm_lives_on() -> Iterator[None]:
    """Fails the test during which this process's Spark driver JVM exited, saying how.

    The next Spark test starts a new JVM (``session.obtain_session``); this names the test
    the old one ended in (it may have passed before the JVM ended).
    """
    yield
    if "pyspark" not in sys.modules:
        return
    from beam_spark_runner.spark import driver_jvm

    ended = driver_jvm.how_it_ended()
    if ended is not None and ended not in _driver_exits_reported:
        _driver_exits_reported.add(ended)
        pytest.fail(f"During this test: {ended}")


@pytest.fixture(scope="session")
def spark_session() -> Any:
    """The test process's one local[2] SparkSession, as the runner obtains it."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_spark_runner.options import spark_settings
    from beam_spark_runner.spark.session import obtain_session

    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}"]
    )
    session, _ = obtain_session(spark_settings(options))
    return session


@pytest.fixture
def beam_options() -> list[str]:
    """Pipeline arguments that run on SparkStructuredRunner with a small local Spark."""
    return ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}"]


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs ``python args...`` in a fresh interpreter (this venv's), capturing its output.

    ``env`` entries are added to (or, when None, removed from) a copy of this process's
    environment. A fresh interpreter is what start-up behaviour and CLI tests need.
    """

    def run(
        args: Sequence[str],
        env: dict[str, str | None] | None = None,
        timeout: float = 120,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        environment = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
            else:
                environment[key] = value
        return subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environment,
            cwd=cwd,
            check=False,
        )

    return run
