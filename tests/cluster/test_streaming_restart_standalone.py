"""Exactly once across restarts on a standalone cluster (long: ``make restart-test``).

As ``tests/streaming/test_restart.py``, with the query's tasks and state stores in the
cluster's executors: the driver is SIGKILLed during its sink's commit, mid-batch and after
a commit, restarted from its checkpoint each time, and must write exactly the files of an
uninterrupted (DirectRunner) run.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from .restarts import (
    AFTER_COMMIT,
    MID_BATCH,
    SINK_COMMIT,
    STREAMING_DRIVER,
    run_with_kills,
    written,
)
from .support import PYTHON, STANDALONE_SPARK_CONF, StandaloneCluster, driver_env, spark_conf_args

pytestmark = [pytest.mark.cluster, pytest.mark.restart]

SECONDS = 240  # see tests/streaming/test_restart.py


def _command(output: Path, start: float, runner: list[str]) -> list[str]:
    return [
        PYTHON,
        str(STREAMING_DRIVER),
        f"--output-dir={output}",
        f"--start={start}",
        f"--seconds={SECONDS}",
        *runner,
    ]


def test_a_killed_and_restarted_query_on_a_cluster_writes_the_uninterrupted_output(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    start = float(int(time.time()) // 5 * 5 - 5)
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    direct_log = tmp_path / "direct.log"
    with direct_log.open("wb") as log:
        direct = subprocess.Popen(
            _command(reference, start, ["--runner=DirectRunner"]),
            env=driver_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    output = tmp_path / "restarted"
    output.mkdir()
    checkpoint = tmp_path / "checkpoint"
    events = run_with_kills(
        _command(
            output,
            start,
            [
                "--runner=SparkStructuredRunner",
                f"--spark_master={standalone_cluster.master_url}",
                *spark_conf_args(STANDALONE_SPARK_CONF),
                f"--spark_checkpoint_location={checkpoint}",
            ],
        ),
        checkpoint,
        output,
        [SINK_COMMIT, MID_BATCH, AFTER_COMMIT],
        tmp_path,
        driver_env(),
    )
    print("\n".join(events))
    assert direct.wait(timeout=600) == 0, direct_log.read_text()[-3000:]
    expected = written(reference)
    assert len(expected) >= SECONDS // 5
    assert written(output) == expected
