"""A streaming pipeline on a Spark standalone cluster gives DirectRunner's output.

The query's stateful levels run in the executors' Python workers (other JVMs and
processes than the driver), with their state in the executors' state stores.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

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

STREAMING_DRIVER = HERE / "streaming_driver.py"


def _written(directory: Path) -> dict[str, list[str]]:
    return {p.name: sorted(p.read_text().splitlines()) for p in sorted(directory.iterdir())}


def test_unbounded_pipeline_on_standalone_cluster_matches_direct_runner(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # Started 5 s before a 5 s boundary: part of the sequence is due at once, the rest is
    # deferred by the splittable DoFn; the files do not depend on when the run starts.
    start = float(int(time.time()) // 5 * 5 - 5)
    outputs = {}
    for name, runner_args in {
        "direct": ["--runner=DirectRunner"],
        "cluster": [
            "--runner=SparkStructuredRunner",
            f"--spark_master={standalone_cluster.master_url}",
            *spark_conf_args(STANDALONE_SPARK_CONF),
        ],
    }.items():
        directory = tmp_path / name
        directory.mkdir()
        command = [
            PYTHON,
            str(STREAMING_DRIVER),
            f"--output-dir={directory}",
            f"--start={start}",
            *runner_args,
        ]
        run = run_logged(command, tmp_path / f"{name}.log", driver_env(), cwd=tmp_path)
        assert run.returncode == 0, run.log_tail()
        outputs[name] = _written(directory)
    assert len(outputs["direct"]) == 2
    assert outputs["cluster"] == outputs["direct"]
