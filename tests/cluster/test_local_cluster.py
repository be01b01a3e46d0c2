"""Smoke test on ``local-cluster[2,1,1024]``: two executor JVMs that the driver launches
itself (an in-process master and worker), no cluster script needed. It needs SPARK_HOME
to point at Spark's ``bin`` and ``jars``, which the pyspark wheel provides.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import (
    COMMON_SPARK_CONF,
    DRIVER,
    PYTHON,
    assert_ran_on_executors,
    driver_env,
    require_java,
    run_logged,
    spark_conf_args,
)

pytestmark = pytest.mark.cluster

MASTER = "local-cluster[2,1,1024]"
NUMBERS = 10_000  # driver.py's metrics pipeline counts range(NUMBERS)


def test_metrics_pipeline_on_local_cluster(local_cluster_spark_home: Path, tmp_path: Path) -> None:
    require_java()
    report = tmp_path / "report.json"
    run = run_logged(
        [
            PYTHON,
            str(DRIVER),
            "metrics",
            f"--report={report}",
            "--runner=SparkStructuredRunner",
            f"--spark_master={MASTER}",
            *spark_conf_args(COMMON_SPARK_CONF),
        ],
        tmp_path / "driver.log",
        driver_env(SPARK_HOME=str(local_cluster_spark_home)),
        report=report,
        cwd=tmp_path,
    )
    entry = run.entry("metrics")
    assert run.returncode == 0, run.log_tail()
    assert entry["spark_master"] == MASTER
    assert entry["spark_application_id"].startswith("app-")
    assert entry["counters"]["elements"]["committed"] == NUMBERS
    assert entry["counters"]["multiples_of_7"]["committed"] == len(range(0, NUMBERS, 7))
    assert_ran_on_executors(entry, elements=NUMBERS)
    # Executor work directories went to the linked SPARK_HOME, not into the virtualenv.
    assert list((local_cluster_spark_home / "work").glob("app-*"))
