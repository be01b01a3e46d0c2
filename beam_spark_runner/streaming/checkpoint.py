"""A named checkpoint and the pipeline it belongs to: a restart must run the same graph.

Spark's checkpoint holds the query's offsets, commits and state, and the state is keyed by
(node index, shard): restarted with a changed pipeline (a stage added, removed or
reordered) or another number of shards, the query would read one node's state as
another's. So the runner writes the graph's fingerprint next to Spark's files on the first
start (``beam-plan.json``), and a restart with a graph that does not match is refused
before the query starts, saying what changed. The file is read and written through
Hadoop's file system, so any checkpoint location Spark accepts (HDFS, object stores) works.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from beam_spark_runner.errors import SparkRunnerError
from beam_spark_runner.spark import internals as spark_internals
from beam_spark_runner.spark.compat import has_row_state
from beam_spark_runner.streaming.topology import Topology

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOGGER = logging.getLogger(__name__)

PLAN_FILE = "beam-plan.json"
# 2: nodes by identity (their sorted transforms), not by Beam's stage name.
# 3: the query's source is Spark's ``rate-micro-batch`` (its offsets are not the Python data
#    source's of formats 1 and 2).
_FORMAT = 3
# The ``state`` entry of a checkpoint whose levels ran on PySpark 4.0's
# ``transformWithStateInPandas``: Spark resumes a stateful operator only as the one that
# wrote it, so such a checkpoint and one on rows (4.1+, no entry) do not restore each other.
PANDAS_STATE = "pandas"


class CheckpointMismatchError(SparkRunnerError, ValueError):
    """The checkpoint was written by a different pipeline graph than the one starting."""


def fingerprint(topology: Topology) -> dict[str, Any]:
    """What a restart must find unchanged: the nodes in order, the shards, the roots.

    And the form of Spark's stateful operator the levels run on, where it is not rows.
    """
    state = {} if has_row_state() else {"state": PANDAS_STATE}
    return {
        **state,
        "format": _FORMAT,
        "shards": topology.shards,
        "levels": topology.levels,
        "roots": sorted(topology.roots),
        "nodes": [[n.index, n.identity, n.kind, n.stateful, n.step] for n in topology.nodes],
    }


def differences(found: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's fingerprint and this pipeline's, in words."""
    out = []
    if found.get("format") != expected["format"]:
        return [
            f"it was written by a runner version that records the graph in format "
            f"{found.get('format')}, this one in {expected['format']} (restart it with the "
            "runner version that wrote it)"
        ]
    if found.get("state") != expected.get("state"):
        return [
            f"its stateful levels ran on {_operator(found)}, this PySpark's on "
            f"{_operator(expected)}, and Spark resumes a stateful operator only as the one that "
            "wrote it (restart it with the PySpark line that wrote it)"
        ]
    if found.get("shards") != expected["shards"]:
        out.append(
            f"shards: the checkpoint has {found.get('shards')}, this run "
            f"{expected['shards']} (the parallelism: --spark_default_parallelism or the "
            "cluster's cores)"
        )
    if found.get("roots") != expected["roots"]:
        out.append(
            f"sources: the checkpoint has {found.get('roots')}, this run {expected['roots']}"
        )
    found_nodes = [tuple(n) for n in found.get("nodes", [])]
    expected_nodes = [tuple(n) for n in expected["nodes"]]
    if found_nodes != expected_nodes:
        names = {n[1] for n in expected_nodes}
        old_names = {n[1] for n in found_nodes}
        added = sorted(names - old_names)
        removed = sorted(old_names - names)
        detail = []
        if added:
            detail.append(f"new: {', '.join(added)}")
        if removed:
            detail.append(f"gone: {', '.join(removed)}")
        if not detail:
            detail.append("the same stages in another order or arrangement")
        out.append("stages: " + "; ".join(detail))
    return out


def _operator(recorded: dict[str, Any]) -> str:
    if recorded.get("state") == PANDAS_STATE:
        return "transformWithStateInPandas (PySpark 4.0)"
    return "transformWithState on rows (PySpark 4.1 or newer)"


def check_checkpoint(spark: SparkSession, location: str, topology: Topology) -> None:
    """Refuses ``location`` if another graph wrote it; records this graph if it is new."""
    expected = fingerprint(topology)
    jvm = spark_internals.session_jvm(spark)
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(location, PLAN_FILE)
    fs = path.getFileSystem(spark_internals.hadoop_configuration(spark))
    if fs.exists(path):
        stream = fs.open(path)
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        found = json.loads(text)
        changed = differences(found, expected)
        if changed:
            raise CheckpointMismatchError(
                f"The streaming checkpoint at {location} belongs to a different pipeline "
                f"graph than this one ({'; '.join(changed)}). Restoring its state into this "
                "graph would give one stage another's state. Restart with the pipeline and "
                "parallelism that wrote the checkpoint, or start from an empty "
                "--spark_checkpoint_location (the new query then starts from its sources' "
                "beginning)."
            )
        _LOGGER.info("Resuming the streaming query from its checkpoint at %s", location)
        return
    if fs.exists(jvm.org.apache.hadoop.fs.Path(location, "offsets")):
        _LOGGER.warning(
            "The streaming checkpoint at %s has no %s (written by an older runner): resuming "
            "without checking that it belongs to this pipeline",
            location,
            PLAN_FILE,
        )
    out = fs.create(path, True)
    try:
        out.write(bytearray(json.dumps(expected, indent=1).encode("utf-8")))
    finally:
        out.close()
