"""A stateful level: one ``transformWithState`` processor for all stateful nodes of a level.

Spark groups the level's input by (target, shard) and calls ``handleInputRows`` once per
group with that micro-batch's rows. Rows addressed to a later step pass through unchanged;
a shard runs on the skeleton of ``shard_run``, as its kind: a GroupByKey's
``group_panes.GroupShard``, a stateful DoFn's ``stateful.StatefulShard``, an unbounded
splittable DoFn's ``splittable.SplittableShard`` (``SplittableSideInputShard`` where it
reads streamed side inputs), a stage with side inputs' ``side_inputs.SideInputShard``, a
stateful DoFn's with streamed side inputs ``stateful_side_inputs.StatefulSideInputShard``,
each with its state cached in the worker and its changes logged in the state store
(``state_cache``): a header value per shard, and a base and log of changes beside it. What a
shard buffers for a later batch (a GroupByKey's values until their window's on-time pane,
a stage's main elements until its side inputs are ready) is appended to a list beside it
(``chunk_lists``), read only in the batch it is due. Its rows out are packed (``rows.packed``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from beam_spark_runner.execution.grouping import GroupSpec
from beam_spark_runner.execution.stage_worker import StageSpec, TaskSinks, recording
from beam_spark_runner.spark.internals import pickle_by_value
from beam_spark_runner.streaming import state_cache
from beam_spark_runner.streaming.chunk_lists import ListStateChunks
from beam_spark_runner.streaming.group_panes import GroupShard, streaming_grouper
from beam_spark_runner.streaming.level_shell import LevelShell
from beam_spark_runner.streaming.rows import Row, packed, routed_row
from beam_spark_runner.streaming.shard_run import ShardRun
from beam_spark_runner.streaming.side_input_state import ListStateWaitingStore
from beam_spark_runner.streaming.side_inputs import SideInputShard, SideInputStageSpec
from beam_spark_runner.streaming.splittable import (
    PACKED_SHARE,
    SplittableShard,
    SplittableSideInputShard,
)
from beam_spark_runner.streaming.stateful import StatefulShard
from beam_spark_runner.streaming.stateful_side_inputs import StatefulSideInputShard
from beam_spark_runner.streaming.topology import Topology


class Level:
    """One stateful level: what its ``transformWithState`` does with a group's rows.

    PySpark pickles a ``level_shell.LevelShell`` holding it (see there why); the shell
    declares the state variables and hands them to ``bind``.
    """

    def __init__(
        self,
        topology: Topology,
        groups: dict[int, GroupSpec],
        stages: dict[int, StageSpec],
        splittable: dict[int, StageSpec],
        with_side_inputs: dict[int, SideInputStageSpec],
        sinks: TaskSinks,
    ) -> None:
        self.topology = topology
        self.groups = groups
        self.stages = stages
        self.splittable = splittable
        self.with_side_inputs = with_side_inputs
        self.sinks = sinks
        self._runs = {*groups, *stages, *splittable, *with_side_inputs}
        # This run of the level, naming its shards in a worker's cache (``state_cache``).
        self.run_id = uuid.uuid4().hex
        self._state: Any = None
        self._log: Any = None
        self._waiting: ListStateWaitingStore | None = None
        self._chunks: ListStateChunks | None = None

    def processor(self) -> LevelShell:
        """What ``transformWithState`` takes: a shell with this level pickled."""
        waiting = bool(self.with_side_inputs or self.groups)
        return LevelShell(pickle_by_value(self), waiting=waiting)

    def bind(self, shard: Any, waiting: Any, log: Any) -> None:
        """Takes the state variables ``LevelShell.init`` declared.

        A shard's encoded state, and, where the level has GroupByKeys or stages with side
        inputs, the list of what its shards buffer (each (node, shard) has its own), and
        its shards' base and change log (``state_cache``).
        """
        self._state = shard
        self._log = log
        if self.with_side_inputs or self.groups:
            assert waiting is not None, "a level that buffers elements needs its waiting list"
            self._waiting = ListStateWaitingStore(waiting)
            self._chunks = ListStateChunks(waiting)

    def run(self, key: Any, rows: Iterator[Any]) -> Iterator[Any]:
        """Runs one (node, shard) for one micro-batch, or passes its rows on.

        ``key`` is the group's (target, slot): the slot is the shard, or the shard plus a
        multiple of the shards where ``placement`` moved it to another partition.
        """
        target, shard = int(key[0]), int(key[1]) % self.topology.shards
        if target not in self._runs:
            yield from rows  # addressed to a later step
            return
        with recording(self.sinks):
            out = self._run_shard(target, shard, rows)
        make_row = routed_row()
        for row in packed(out, self.topology):
            yield make_row(*row)

    def _run_shard(self, target: int, shard: int, rows: Iterator[Any]) -> list[Row]:
        """One stateful (node, shard) for one micro-batch: its rows out; its state updated."""
        assert self._log is not None, "a stateful level needs its log state"
        run = self._shard_run(target)
        assert isinstance(run, (GroupShard, StatefulShard, SplittableShard, SideInputShard))
        splittable = isinstance(run, (SplittableShard, SplittableSideInputShard))
        return state_cache.run_logged(
            run,
            run,
            self._state,
            self._log,
            (self.run_id, target, shard),
            self.topology,
            self.topology.nodes[target],
            rows,
            PACKED_SHARE if splittable else None,
        )

    def _shard_run(self, target: int) -> ShardRun[Any, Any]:
        """The run of one micro-batch of a shard of ``target``, of its kind."""
        if target in self.groups:
            return GroupShard(streaming_grouper(self.groups[target]), self._chunks)
        if target in self.with_side_inputs:
            assert self._waiting is not None  # declared in init with the side-input stages
            if target in self.stages:
                return StatefulSideInputShard(
                    self.with_side_inputs[target], self.sinks, self._waiting
                )
            if target in self.splittable:
                return SplittableSideInputShard(
                    self.with_side_inputs[target], self.sinks, self._waiting
                )
            return SideInputShard(self.with_side_inputs[target], self.sinks, self._waiting)
        if target in self.stages:
            return StatefulShard(self.stages[target], self.sinks)
        return SplittableShard(self.splittable[target], self.sinks)
