"""Task retries: a pipeline whose tasks fail once gives a clean run's output and metrics.

``tests/cluster/retries_driver.py`` runs the pipeline clean, then with DoFns raising on the
first attempt of every Spark task, in a driver process of its own: a local master retries a
failed task only when its master string says so (``local[N,F]``: F attempts per task; plain
``local[N]`` allows one and ignores ``spark.task.maxFailures``), and this pytest process
keeps a ``local[2]`` session for the other tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.retries_driver import check_retried_run

DRIVER = Path(__file__).resolve().parent.parent / "cluster" / "retries_driver.py"
RETRYING_MASTER = "local[2,2]"


@pytest.mark.spark
@pytest.mark.slow
def test_failed_attempts_are_retried_exactly_once(
    tmp_path: Path, run_python: Callable[..., Any]
) -> None:
    report = tmp_path / "report.json"
    finished = run_python(
        [
            str(DRIVER),
            f"--output-dir={tmp_path}",
            f"--report={report}",
            "--runner=SparkStructuredRunner",
            f"--spark_master={RETRYING_MASTER}",
        ],
        timeout=480,
        cwd=tmp_path,
    )
    assert finished.returncode == 0, finished.stderr[-5000:]
    run = json.loads(report.read_text())
    assert run["retried"]["spark_master"] == RETRYING_MASTER
    check_retried_run(run)
