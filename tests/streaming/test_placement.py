"""A level's shards spread over the shuffle partitions (Spark started by the marked tests only)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.placement import (
    level_slots,
    partition_of,
    placed,
    spark_hash,
)
from beam_spark_runner.streaming.topology import GROUP, STAGE, NodeSpec, Topology, build_topology


def _topology(groups: int = 2, shards: int = 2) -> Topology:
    """A read, then ``groups`` GroupByKeys side by side at level 1, each read by a stage."""
    specs = [
        NodeSpec(
            "read",
            STAGE,
            False,
            (("root", "impulse"),),
            tuple(((GROUP, f"g{i}"),) for i in range(groups)),
        )
    ]
    for i in range(groups):
        specs.append(NodeSpec(f"g{i}", GROUP, True, ((STAGE, "read"),), (((STAGE, f"s{i}"),),)))
        specs.append(NodeSpec(f"s{i}", STAGE, False, ((GROUP, f"g{i}"),), ()))
    return build_topology(specs, shards=shards)


def test_spark_hash_is_sparks_hash_of_int_columns() -> None:
    # Spark: SELECT hash(1), hash(0), hash(2, 1)
    assert spark_hash(1) == -559580957
    assert spark_hash(0) == 933211791
    assert partition_of(2, 0, 2) == partition_of(2, 1, 2)  # the collision placement undoes


@pytest.mark.parametrize("groups,shards,partitions", [(1, 2, 2), (2, 2, 2), (3, 4, 4), (2, 3, 2)])
def test_a_levels_shards_spread_evenly_over_the_partitions(
    groups: int, shards: int, partitions: int
) -> None:
    topology = _topology(groups, shards)
    slots = level_slots(topology, 1, partitions)
    assert sorted(slots) == sorted(
        (node.index, shard) for node in topology.stateful_in(1) for shard in range(shards)
    )
    load = [0] * partitions
    for (node, shard), slot in slots.items():
        assert slot % shards == shard
        load[partition_of(node, slot, partitions)] += 1
    assert max(load) - min(load) <= 1, load


def test_a_colliding_node_is_moved_and_a_spread_one_is_not() -> None:
    """Node 1's two shards: without placement both on partition 1 of 2 (one task runs
    both); with it, one on each."""
    topology = _topology(groups=1)
    (node,) = topology.stateful_in(1)
    before = {partition_of(node.index, shard, 2) for shard in range(2)}
    slots = level_slots(topology, 1, 2)
    after = {partition_of(node.index, slots[(node.index, s)], 2) for s in range(2)}
    assert after == {0, 1}
    if len(before) == 2:
        assert slots == {(node.index, 0): 0, (node.index, 1): 1}


@pytest.mark.spark
def test_spark_places_the_groups_where_the_slots_say(spark_session: Any) -> None:
    from pyspark.sql import functions as F

    partitions = 3
    pairs = list(itertools.product(range(6), range(8)))
    frame = spark_session.createDataFrame(pairs, f"{routed.TARGET} int, {routed.SHARD} int")
    hashed = frame.select(
        routed.TARGET,
        routed.SHARD,
        F.hash(routed.TARGET, routed.SHARD).alias("h"),
        F.pmod(F.hash(routed.TARGET, routed.SHARD), F.lit(partitions)).alias("p"),
    )
    for row in hashed.collect():
        assert spark_hash(row[0], row[1]) == row.h
        assert partition_of(row[0], row[1], partitions) == row.p
    moved = placed(frame, {(1, 0): 4, (1, 1): 1, (2, 1): 3})
    assert sorted(tuple(row) for row in moved.collect()) == sorted(
        {(1, 0): (1, 4), (2, 1): (2, 3)}.get(pair, pair) for pair in pairs
    )
    assert dict(moved.dtypes)[routed.SHARD] == "int"
