"""Task retries on a Spark standalone cluster: executors in JVMs of their own report their
failed attempts' metrics to the driver over the network (``attempts.py``).

Runs ``retries_driver.py`` (a clean run, then one whose tasks fail on their first attempt)
against the session's standalone master + worker, with ``spark.task.maxFailures=2``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .retries_driver import check_retried_run
from .support import (
    HERE,
    PYTHON,
    STANDALONE_SPARK_CONF,
    StandaloneCluster,
    driver_env,
    run_logged,
    spark_conf_args,
)

pytestmark = pytest.mark.cluster

RETRIES_DRIVER = HERE / "retries_driver.py"


def test_retried_tasks_on_standalone_cluster(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    command = [
        PYTHON,
        str(RETRIES_DRIVER),
        f"--output-dir={tmp_path}",
        f"--report={report}",
        "--runner=SparkStructuredRunner",
        f"--spark_master={standalone_cluster.master_url}",
        *spark_conf_args({**STANDALONE_SPARK_CONF, "spark.task.maxFailures": "2"}),
    ]
    run = run_logged(command, tmp_path / "driver.log", driver_env(), report=report, cwd=tmp_path)
    assert run.returncode == 0, run.log_tail()
    result = json.loads(report.read_text())
    assert result["retried"]["spark_master"] == standalone_cluster.master_url
    check_retried_run(result)
