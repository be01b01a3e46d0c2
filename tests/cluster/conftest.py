"""Fixtures for tests against multi-process Spark clusters (``pytest -m cluster``).

* ``standalone_cluster``: a Spark standalone master and one worker (2 cores, 2g) on
  127.0.0.1, started from the pyspark wheel by ``scripts/standalone_cluster.sh`` once for
  the session and always stopped at its end, even when tests fail or are interrupted.
* ``local_cluster_spark_home``: a SPARK_HOME for ``local-cluster[...]`` masters.
* ``words_file`` / ``small_words_file``: generated text for word counts.

Pipelines run in driver processes of their own (see ``support.run_logged``), never in
pytest's; see ``driver.py``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import (
    CLUSTER_SCRIPT,
    CLUSTER_START_TIMEOUT,
    LOOPBACK,
    PYTHON,
    StandaloneCluster,
    driver_env,
    require_java,
    spark_home,
    write_words,
)


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone master + worker on 127.0.0.1 for the session; always stopped after."""
    require_java()
    directory = tmp_path_factory.mktemp("standalone-cluster")
    # OWNER_PID: the script's watchdog stops the cluster should this process be killed
    # before the finally below can run.
    env = driver_env(CLUSTER_DIR=str(directory), PYTHON=PYTHON, OWNER_PID=str(os.getpid()))
    try:
        started = subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "start"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLUSTER_START_TIMEOUT,
            check=False,
        )
        if started.returncode != 0:
            pytest.fail(
                f"could not start the standalone cluster (exit {started.returncode}):\n"
                f"{started.stderr}\nlogs in {directory}"
            )
        settings = dict(
            line.split("=", 1)
            for line in (directory / "cluster.env").read_text().splitlines()
            if "=" in line
        )
        master_url = started.stdout.strip().splitlines()[-1]
        assert master_url == settings["MASTER_URL"]
        assert master_url.startswith(f"spark://{LOOPBACK}:")
        yield StandaloneCluster(master_url, settings["MASTER_WEBUI_URL"], directory)
    finally:
        subprocess.run(
            ["bash", str(CLUSTER_SCRIPT), "stop"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
            check=False,
        )


@pytest.fixture(scope="session")
def local_cluster_spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SPARK_HOME for local-cluster masters: the wheel's bin, jars and sbin, linked.

    local-cluster workers launch executors with ``$SPARK_HOME/bin`` and ``jars`` and put
    executor work directories in ``$SPARK_HOME/work``; a linked home keeps those out of
    the virtualenv's pyspark package.
    """
    home = tmp_path_factory.mktemp("spark-home")
    for name in ("bin", "jars", "sbin"):
        (home / name).symlink_to(Path(spark_home()) / name, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def words_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 2 MB of text."""
    return write_words(tmp_path_factory.mktemp("words") / "words.txt", 2_000_000)


@pytest.fixture(scope="session")
def small_words_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 200 KB of text."""
    return write_words(tmp_path_factory.mktemp("small-words") / "words.txt", 200_000, seed=11)
