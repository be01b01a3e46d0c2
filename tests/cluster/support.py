"""Helpers for the cluster tests: driver processes, reports, and checks.

Pipelines run in driver processes of their own (``run_logged``), never in pytest's: the
runner keeps one SparkSession per process, other tests in pytest's process use an
embedded local[2] session, and a driver's JVM must start with the cluster's environment
(SPARK_LOCAL_IP, PYSPARK_PYTHON), which a JVM already running in pytest's process, started
by another test, would not have. A separate process also cannot leak a session, executors
or a stuck job into the rest of the test run, and is killed as a whole on timeout.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLUSTER_SCRIPT = REPO / "scripts" / "standalone_cluster.sh"
DRIVER = HERE / "driver.py"
LOOPBACK = "127.0.0.1"

# Executors run user code with this interpreter: it has Beam, pyarrow and the runner.
PYTHON = sys.executable

CLUSTER_START_TIMEOUT = 240
# Generous: they only stop a hung driver (e.g. no executor ever granted). On a quiet
# 2-core machine the drivers take well under a minute each.
DRIVER_TIMEOUT = 420

# Short-lived JVMs on a 2-core machine: C1 only and the serial collector halve the CPU
# time of a driver or executor JVM here (no C2 compiler or parallel GC threads).
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Settings of every test driver's session: no web UI (no port to bind), lean JVMs.
COMMON_SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
}

# Two 1-core executors per application on the 2-core worker, so that shuffles and
# broadcasts cross executor JVMs; 2 x 768m fits the worker's 2g.
STANDALONE_SPARK_CONF = {
    **COMMON_SPARK_CONF,
    "spark.executor.cores": "1",
    "spark.executor.memory": "768m",
}

EXECUTOR_JVM = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def require_java() -> None:
    """Skips the test when no usable Java runtime is installed."""
    from beam_spark_runner.errors import JavaNotFoundError
    from beam_spark_runner.spark.java import check_java, required_java_major

    try:
        check_java(required_java_major())
    except JavaNotFoundError as error:
        pytest.skip(f"cluster tests need Java: {error}")


def driver_env(**extra: str) -> dict[str, str]:
    """The environment of a driver process that talks to a loopback cluster."""
    env = dict(os.environ)
    # Never let a child attach to a JVM gateway this process might have started.
    for name in (
        "PYSPARK_GATEWAY_PORT",
        "PYSPARK_GATEWAY_SECRET",
        "PYSPARK_SUBMIT_ARGS",
        "SPARK_CONF_DIR",
    ):
        env.pop(name, None)
    env.update(
        SPARK_HOME=spark_home(),
        SPARK_LOCAL_IP=LOOPBACK,
        PYSPARK_PYTHON=PYTHON,
        PYSPARK_DRIVER_PYTHON=PYTHON,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def spark_conf_args(conf: dict[str, str]) -> list[str]:
    return [arg for key, value in conf.items() for arg in ("--spark_conf", f"{key}={value}")]


@dataclasses.dataclass
class DriverRun:
    """A finished driver process: exit code, wall time, log, and its JSON report."""

    command: list[str]
    returncode: int
    seconds: float
    log: Path
    report_path: Path | None

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    @property
    def report(self) -> dict[str, Any]:
        if self.report_path is None or not self.report_path.exists():
            pytest.fail(
                f"driver wrote no report (exit {self.returncode}, {self.seconds:.0f} s): "
                f"{' '.join(self.command)}\n--- log tail ({self.log}) ---\n{self.log_tail()}"
            )
        return json.loads(self.report_path.read_text())

    def entry(self, name: str) -> dict[str, Any]:
        """One pipeline's report; fails the test with its error and the log if it failed."""
        entry = self.report.get(name)
        if entry is None:
            pytest.fail(f"no report for {name}\n--- log tail ---\n{self.log_tail()}")
        if not entry.get("ok"):
            pytest.fail(
                f"pipeline {name} failed: {entry.get('error')}\n{entry.get('traceback', '')}"
                f"\n--- driver log tail ({self.log}) ---\n{self.log_tail()}"
            )
        return entry


class LoggedProcess:
    """A driver process started in its own process group, its output in a log file."""

    def __init__(
        self,
        command: Sequence[str],
        log: Path,
        env: dict[str, str],
        report: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.command = list(command)
        self.log = log
        self.report = report
        self.started = time.monotonic()
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )

    def kill(self) -> None:
        """Kills the process group, if still running."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group we created, only
            self.process.wait()

    def wait(self, timeout: float = DRIVER_TIMEOUT) -> DriverRun:
        """Waits for the process; on timeout (or Ctrl-C) kills its whole process group."""
        try:
            remaining = max(1.0, timeout - (time.monotonic() - self.started))
            returncode = self.process.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            self.kill()
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-60:])
            pytest.fail(
                f"timed out after {timeout} s: {' '.join(self.command)}\n"
                f"--- log tail ({self.log}) ---\n{tail}"
            )
        finally:
            self.kill()
        return DriverRun(
            self.command, returncode, time.monotonic() - self.started, self.log, self.report
        )


def run_logged(
    command: Sequence[str],
    log: Path,
    env: dict[str, str],
    timeout: float = DRIVER_TIMEOUT,
    report: Path | None = None,
    cwd: Path | None = None,
) -> DriverRun:
    """Runs ``command`` to completion (see :class:`LoggedProcess`)."""
    return LoggedProcess(command, log, env, report=report, cwd=cwd).wait(timeout)


@dataclasses.dataclass(frozen=True)
class StandaloneCluster:
    master_url: str
    webui_url: str
    directory: Path

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, active and completed applications)."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=10) as response:
            return json.load(response)

    def application_ids(self) -> set[str]:
        state = self.state()
        return {app["id"] for key in ("activeapps", "completedapps") for app in state.get(key, [])}


def write_words(path: Path, size: int, seed: int = 7) -> Path:
    """Deterministic text of about ``size`` bytes with a Zipf-like word distribution."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = [
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)
    ]
    weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]
    written = 0
    with open(path, "w") as out:
        while written < size:
            words = rng.choices(vocabulary, weights, k=rng.randint(1, 14))
            line = " ".join(words).capitalize() + ("." if rng.random() < 0.3 else "") + "\n"
            out.write(line)
            written += len(line)
    return path


def read_counts(prefix: Path) -> dict[str, int]:
    """The ``word: count`` lines of all of WriteToText's shards under ``prefix``."""
    shards = sorted(prefix.parent.glob(prefix.name + "-*-of-*"))
    assert shards, f"no output shards {prefix}-*-of-*"
    counts: dict[str, int] = {}
    for shard in shards:
        for line in shard.read_text().splitlines():
            word, _, count = line.rpartition(": ")
            assert word not in counts, f"{word!r} written twice"
            counts[word] = int(count)
    return counts


def assert_ran_on_executors(entry: dict[str, Any], elements: int | None = None) -> None:
    """User code ran in Python workers of executor JVMs, never in the driver's JVM."""
    jvms: dict[str, int] = entry["jvms"]
    assert jvms, f"no JVM evidence recorded: {entry}"
    not_executors = [jvm for jvm in jvms if not jvm.startswith(EXECUTOR_JVM + ":")]
    assert not not_executors, f"user code ran outside executors: {jvms}"
    if elements is not None:
        assert sum(jvms.values()) == elements, jvms
