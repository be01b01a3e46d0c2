"""A named checkpoint records its pipeline graph; a restart with another graph is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner.options import spark_settings
from beam_spark_runner.session import obtain_session
from beam_spark_runner.streaming.checkpoint import (
    PLAN_FILE,
    CheckpointMismatchError,
    check_checkpoint,
)
from beam_spark_runner.streaming.topology import GROUP, STAGE, NodeSpec, Topology, build_topology

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _topology(middle: str = "count", shards: int = 2) -> Topology:
    return build_topology(
        [
            NodeSpec("read", STAGE, False, (("root", "impulse"),), (((GROUP, "g"),),)),
            NodeSpec("g", GROUP, True, ((STAGE, "read"),), (((STAGE, middle),),)),
            NodeSpec(middle, STAGE, False, ((GROUP, "g"),), ()),
        ],
        shards=shards,
    )


@pytest.fixture(scope="module")
def spark() -> Any:
    session, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    return session


def test_the_first_start_records_the_graph_and_a_restart_with_it_resumes(
    spark: Any, tmp_path: Path
) -> None:
    check_checkpoint(spark, str(tmp_path), _topology())
    recorded = json.loads((tmp_path / PLAN_FILE).read_text())
    assert [node[1] for node in recorded["nodes"]] == ["read", "g", "count"]
    assert recorded["shards"] == 2
    check_checkpoint(spark, str(tmp_path), _topology())  # the same graph: no error


def test_a_changed_stage_is_refused_naming_it(spark: Any, tmp_path: Path) -> None:
    check_checkpoint(spark, str(tmp_path), _topology())
    with pytest.raises(CheckpointMismatchError, match="new: total; gone: count") as error:
        check_checkpoint(spark, str(tmp_path), _topology(middle="total"))
    assert "--spark_checkpoint_location" in str(error.value)


def test_another_parallelism_is_refused(spark: Any, tmp_path: Path) -> None:
    check_checkpoint(spark, str(tmp_path), _topology(shards=2))
    with pytest.raises(CheckpointMismatchError, match="shards: the checkpoint has 2, this run 3"):
        check_checkpoint(spark, str(tmp_path), _topology(shards=3))
