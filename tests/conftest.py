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

# The test process's driver JVM exited; reported once, by the test during which it did.
_driver_exit_reported: list[str] = []


@pytest.fixture(autouse=True)
def _driver_jvm_lives_on() -> Iterator[None]:
    """Fails the test during which this process's Spark driver JVM exited, saying how.

    Every later Spark test then fails in ``obtain_session`` with the same description;
    this names the test the JVM ended in (it may have passed before the JVM ended).
    """
    yield
    if "pyspark" not in sys.modules or _driver_exit_reported:
        return
    from beam_spark_runner import driver_jvm

    ended = driver_jvm.how_it_ended()
    if ended is not None:
        _driver_exit_reported.append(ended)
        pytest.fail(f"During this test: {ended}")


@pytest.fixture(scope="session")
def spark_session() -> Any:
    """The test process's one local[2] SparkSession, as the runner obtains it."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_spark_runner.options import spark_settings
    from beam_spark_runner.session import obtain_session

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
