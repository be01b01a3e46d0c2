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
import re
from typing import TYPE_CHECKING, Any

from beam_spark_runner.errors import SparkRunnerError
from beam_spark_runner.spark import internals as spark_internals
from beam_spark_runner.spark.compat import has_row_state, has_state_processor
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
# The ``state`` entry of a checkpoint whose levels ran on PySpark 3.5's
# ``applyInPandasWithState`` (``spark.group_state``).
GROUP_STATE = "group-state"
# The entry naming the shuffle partitions the levels' shards were placed over: absent in a
# checkpoint written before placement, whose shards resume each in its own slot.
PLACED_OVER = "placed_over_partitions"


class CheckpointMismatchError(SparkRunnerError, ValueError):
    """The checkpoint was written by a different pipeline graph than the one starting."""


def fingerprint(topology: Topology, partitions: int | None = None) -> dict[str, Any]:
    """What a restart must find unchanged: the nodes in order, the shards, the roots.

    And the form of Spark's stateful operator the levels run on, where it is not rows, and
    the shuffle partitions the levels' shards were placed over (``placement``), if they were.
    """
    state = operator_state()
    return {
        **({} if state is None else {"state": state}),
        **({} if partitions is None else {PLACED_OVER: partitions}),
        "format": _FORMAT,
        "shards": topology.shards,
        "levels": topology.levels,
        "roots": sorted(topology.roots),
        "nodes": [[n.index, n.identity, n.kind, n.stateful, n.step] for n in topology.nodes],
    }


# Beam's ids of pipeline components end in a counter of the components made before them
# ("ref_PCollection_PCollection_22"), and a lambda's label names its line ("<lambda at
# core.py:4094>"): neither says what a node is, and both shift with an added transform or
# another Beam version. Fingerprints are compared without them.
_COMPONENT_COUNTER = re.compile(r"(ref_[A-Za-z0-9_-]*?)_\d+(?=[/+]|$)")
_LAMBDA_LINE = re.compile(r"(<lambda at [^:>]*):\d+>")
# A node's transforms, in its identity (``query.stage_identity``).
_TRANSFORM_SEPARATOR = "+"
# How many transforms a difference names before it says how many more there are.
_NAMED_AT_MOST = 8


def _comparable(name: str) -> str:
    """``name`` without Beam's component counters and lambdas' line numbers."""
    return _LAMBDA_LINE.sub(r"\1>", _COMPONENT_COUNTER.sub(r"\1", name))


def _comparable_nodes(fingerprint: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (index, sorted(_comparable(n) for n in identity.split(_TRANSFORM_SEPARATOR)), *rest)
        for index, identity, *rest in fingerprint.get("nodes", [])
    ]


def _user_transforms(fingerprint: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """The pipeline's own transforms in a fingerprint's stages, by comparable name.

    Each as recorded, and whether its node is stateful. A fused stage's identity is its
    transforms' names; Beam's internal ones (``ref_...``, the reads and writes of buffers
    between stages) are left out, and group nodes, which the stages around them name.
    """
    transforms: dict[str, tuple[str, bool]] = {}
    for _, identity, kind, stateful, _ in fingerprint.get("nodes", []):
        if kind != "stage":
            continue
        for name in identity.split(_TRANSFORM_SEPARATOR):
            if name and not name.startswith("ref_"):
                transforms[_comparable(name)] = (name, bool(stateful))
    return transforms


def _outermost_new(names: dict[str, str], others: set[str]) -> list[str]:
    """Each of ``names`` as its outermost composite that none of ``others`` is in.

    ``names`` maps comparable names to names as recorded (which the result gives);
    ``others`` holds comparable names.
    """
    enclosing = {
        "/".join(parts[:end])
        for parts in (name.split("/") for name in others)
        for end in range(1, len(parts) + 1)
    }
    outermost = set()
    for name, recorded in names.items():
        parts = name.split("/")
        end = next(
            (e for e in range(1, len(parts) + 1) if "/".join(parts[:e]) not in enclosing),
            len(parts),
        )
        outermost.add("/".join(recorded.split("/")[:end]))
    return sorted(outermost)


def _named(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_NAMED_AT_MOST])
    more = len(names) - _NAMED_AT_MOST
    return f"{shown} and {more} more" if more > 0 else shown


def transform_changes(found: dict[str, Any], expected: dict[str, Any]) -> str:
    """The pipeline's transforms added, removed or changed between two fingerprints.

    A composite added or removed whole is named once, as the pipeline names it; a
    transform changed is one that runs stateful in one and stateless in the other.
    """
    old, new = _user_transforms(found), _user_transforms(expected)
    added = _outermost_new({n: new[n][0] for n in new.keys() - old.keys()}, set(old))
    removed = _outermost_new({n: old[n][0] for n in old.keys() - new.keys()}, set(new))
    both = sorted(new.keys() & old.keys())
    stateful = [new[n][0] for n in both if new[n][1] and not old[n][1]]
    stateless = [new[n][0] for n in both if old[n][1] and not new[n][1]]
    detail = []
    if added:
        detail.append(f"added: {_named(added)}")
    if removed:
        detail.append(f"removed: {_named(removed)}")
    if stateful:
        detail.append(f"changed: {_named(stateful)} (stateful now)")
    if stateless:
        detail.append(f"changed: {_named(stateless)} (stateless now)")
    if not detail:
        return "the same transforms, fused or ordered otherwise"
    return "; ".join(detail)


def differences(found: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What differs between a checkpoint's fingerprint and this pipeline's, in words.

    Beam's component counters and lambdas' line numbers are not compared (``_comparable``).
    """
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
    found_roots = sorted(_comparable(root) for root in found.get("roots", []))
    if found_roots != sorted(_comparable(root) for root in expected["roots"]):
        out.append(
            f"sources: the checkpoint has {found.get('roots')}, this run {expected['roots']}"
        )
    if _comparable_nodes(found) != _comparable_nodes(expected):
        out.append(f"transforms: {transform_changes(found, expected)}")
    return out


def operator_state() -> str | None:
    """The ``state`` entry this PySpark's levels record (``None``: on rows, none)."""
    if has_row_state():
        return None
    return PANDAS_STATE if has_state_processor() else GROUP_STATE


def _operator(recorded: dict[str, Any]) -> str:
    if recorded.get("state") == PANDAS_STATE:
        return "transformWithStateInPandas (PySpark 4.0)"
    if recorded.get("state") == GROUP_STATE:
        return "applyInPandasWithState (PySpark 3.5)"
    return "transformWithState on rows (PySpark 4.1 or newer)"


def check_checkpoint(
    spark: SparkSession, location: str, topology: Topology, partitions: int | None = None
) -> int | None:
    """Refuses ``location`` if another graph wrote it; records this graph if it is new.

    Returns the shuffle partitions to place the levels' shards over: ``partitions`` for a
    new checkpoint (recorded with the graph), the recorded ones on a restart (None for a
    checkpoint written before placement: every shard in its own slot).
    """
    expected = fingerprint(topology, partitions)
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
        placed_over = found.get(PLACED_OVER)
        return None if placed_over is None else int(placed_over)
    if fs.exists(jvm.org.apache.hadoop.fs.Path(location, "offsets")):
        _LOGGER.warning(
            "The streaming checkpoint at %s has no %s (written by an older runner): resuming "
            "without checking that it belongs to this pipeline",
            location,
            PLAN_FILE,
        )
        # Its state is keyed as before placement.
        expected.pop(PLACED_OVER, None)
        partitions = None
    out = fs.create(path, True)
    try:
        out.write(bytearray(json.dumps(expected, indent=1).encode("utf-8")))
    finally:
        out.close()
    return partitions
