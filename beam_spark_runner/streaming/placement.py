"""Which shuffle partition, and so which task, runs each stateful shard of a level.

A level groups its rows by (target, shard), and Spark places a group on the shuffle
partition ``pmod(hash(target, shard), partitions)``: two shards of one node can land on
one partition, whose one task then runs both, one after the other, while another task has
nothing to do. So before a level, each row addressed to one of its shards gets a *slot*
in place of its shard: ``shard + k * shards``, with ``k`` (0 or more) chosen on the driver
so that the level's shards spread evenly over the partitions. The level reads the shard
back as the slot modulo the shards (``levels``). Spark keys a level's state by the group,
so a restart must place as the first start did: the checkpoint records the partitions
(``checkpoint``), and one written before placement resumes with every slot its shard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.topology import Topology

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_MASK = 0xFFFFFFFF
# Spark's hash expression (Murmur3 x86 32-bit) starts from this seed.
_SPARK_HASH_SEED = 42
# How far a shard's slot is searched for a partition with fewer shards than the others.
_MAX_STEPS = 64


def _rotate_left(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _hash_int(value: int, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (a 32-bit int column), unsigned."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotate_left(k1, 15) * 0x1B873593 & _MASK
    h1 = _rotate_left(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    return h1 ^ (h1 >> 16)


def spark_hash(*values: int) -> int:
    """Spark's ``hash(...)`` of int columns (as ``F.hash`` gives it: signed 32-bit)."""
    hashed = _SPARK_HASH_SEED
    for value in values:
        hashed = _hash_int(value, hashed)
    return hashed - (1 << 32) if hashed & 0x80000000 else hashed


def partition_of(target: int, slot: int, partitions: int) -> int:
    """The shuffle partition Spark gives the group (target, slot) of a level."""
    return spark_hash(target, slot) % partitions


def level_slots(topology: Topology, step: int, partitions: int) -> dict[tuple[int, int], int]:
    """Each shard of level ``step``'s nodes, (node, shard), to its slot.

    In node and shard order, each takes the first slot on a partition holding the fewest
    of the level's shards so far; a shard whose own number is such a slot keeps it.
    """
    shards = topology.shards
    load = [0] * partitions
    slots: dict[tuple[int, int], int] = {}
    for node in topology.stateful_in(step):
        for shard in range(shards):
            fewest = min(load)
            candidates = (shard + k * shards for k in range(_MAX_STEPS))
            slot = next(
                (s for s in candidates if load[partition_of(node.index, s, partitions)] == fewest),
                shard,
            )
            load[partition_of(node.index, slot, partitions)] += 1
            slots[(node.index, shard)] = slot
    return slots


def placed(frame: DataFrame, slots: dict[tuple[int, int], int]) -> DataFrame:
    """``frame`` with each row's shard its slot, for the rows of a moved shard."""
    from pyspark.sql import functions as F

    moved = {address: slot for address, slot in slots.items() if address[1] != slot}
    if not moved:
        return frame
    target, shard = F.col(routed.TARGET), F.col(routed.SHARD)
    slot = None
    for (node, number), to in sorted(moved.items()):
        matches = (target == node) & (shard == number)
        slot = (F.when if slot is None else slot.when)(matches, F.lit(to))
    assert slot is not None
    return frame.withColumn(routed.SHARD, slot.otherwise(shard).cast("int"))
