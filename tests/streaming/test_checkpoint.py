"""A named checkpoint records its pipeline graph; a restart with another graph is refused."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from beam_spark_runner.spark.compat import STREAMING_SPARK, pyspark_version
from beam_spark_runner.streaming.checkpoint import (
    PLAN_FILE,
    CheckpointMismatchError,
    check_checkpoint,
)
from beam_spark_runner.streaming.topology import GROUP, STAGE, NodeSpec, Topology, build_topology

SCRIPT = Path(__file__).resolve().parent.parent / "plan_fingerprint_script.py"


def _topology(middle: str = "count", shards: int = 2) -> Topology:
    return build_topology(
        [
            NodeSpec("read", STAGE, False, (("root", "impulse"),), (((GROUP, "g"),),)),
            NodeSpec("g", GROUP, True, ((STAGE, "read"),), (((STAGE, middle),),)),
            NodeSpec(middle, STAGE, False, ((GROUP, "g"),), ()),
        ],
        shards=shards,
    )


def test_the_first_start_records_the_graph_and_a_restart_with_it_resumes(
    spark_session: Any, tmp_path: Path
) -> None:
    check_checkpoint(spark_session, str(tmp_path), _topology())
    recorded = json.loads((tmp_path / PLAN_FILE).read_text())
    assert [node[1] for node in recorded["nodes"]] == ["read", "g", "count"]
    assert recorded["shards"] == 2
    check_checkpoint(spark_session, str(tmp_path), _topology())  # the same graph: no error


def test_a_changed_stage_is_refused_naming_it(spark_session: Any, tmp_path: Path) -> None:
    check_checkpoint(spark_session, str(tmp_path), _topology())
    with pytest.raises(CheckpointMismatchError, match="new: total; gone: count") as error:
        check_checkpoint(spark_session, str(tmp_path), _topology(middle="total"))
    assert "--spark_checkpoint_location" in str(error.value)


def test_another_parallelism_is_refused(spark_session: Any, tmp_path: Path) -> None:
    check_checkpoint(spark_session, str(tmp_path), _topology(shards=2))
    with pytest.raises(CheckpointMismatchError, match="shards: the checkpoint has 2, this run 3"):
        check_checkpoint(spark_session, str(tmp_path), _topology(shards=3))


def test_a_checkpoint_of_an_earlier_runner_version_is_refused(
    spark_session: Any, tmp_path: Path
) -> None:
    """Format 2 checkpoints hold the Python data source's offsets, which this one cannot read."""
    check_checkpoint(spark_session, str(tmp_path), _topology())
    recorded = json.loads((tmp_path / PLAN_FILE).read_text())
    (tmp_path / PLAN_FILE).write_text(json.dumps({**recorded, "format": 2}))
    (tmp_path / f".{PLAN_FILE}.crc").unlink()  # Hadoop's checksum of the file as written
    with pytest.raises(CheckpointMismatchError, match="format 2, this one in 3"):
        check_checkpoint(spark_session, str(tmp_path), _topology())


def test_a_checkpoint_of_the_other_stateful_operator_form_is_refused(
    spark_session: Any, tmp_path: Path
) -> None:
    """PySpark 4.0's levels run on transformWithStateInPandas, 4.1+'s on rows: Spark resumes
    neither's state as the other, so a checkpoint moved between them is refused, naming both."""
    check_checkpoint(spark_session, str(tmp_path), _topology())
    recorded = json.loads((tmp_path / PLAN_FILE).read_text())
    other = dict(recorded)
    if other.pop("state", None) is None:
        other["state"] = "pandas"
    (tmp_path / PLAN_FILE).write_text(json.dumps(other))
    (tmp_path / f".{PLAN_FILE}.crc").unlink()
    with pytest.raises(CheckpointMismatchError, match="transformWithStateInPandas") as error:
        check_checkpoint(spark_session, str(tmp_path), _topology())
    assert "transformWithState on rows" in str(error.value)
    assert "the PySpark line that wrote it" in str(error.value)


@pytest.mark.spark
@pytest.mark.skipif(
    pyspark_version() < STREAMING_SPARK, reason="the query module needs PySpark 4.0+"
)
@pytest.mark.parametrize(
    ("sink", "processes"), [("text", 3), pytest.param("files", 6, marks=pytest.mark.slow)]
)
def test_the_streaming_plan_is_the_same_in_every_process(
    run_python: Callable[..., subprocess.CompletedProcess[str]], sink: str, processes: int
) -> None:
    """Hash seeds and protobuf's map order differ between a run and its restart: the plan
    must not depend on them. It did: a protobuf map gave a stage's side inputs another order
    in each process, and fileio.WriteToFiles's fused stage its parts (a third of processes
    here named it otherwise, and the restart test was refused its own checkpoint)."""
    plans = set()
    for seed in range(1, processes + 1):
        result = run_python([str(SCRIPT), sink], env={"PYTHONHASHSEED": str(seed)}, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        plans.add(result.stdout.strip().splitlines()[-1])
    assert len(plans) == 1
