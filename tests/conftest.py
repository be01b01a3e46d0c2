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
