"""What PySpark pickles for a stateful level, and what the query's driver processes import.

PySpark unpickles each ``transformWithState`` processor in a fresh driver process at a
query's start (its pre-init): it may not import Beam (about 1.5-1.9 s per process), so its
module is checked in a fresh interpreter.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark import cloudpickle

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip("streaming needs PySpark 3.5+", allow_module_level=True)

from beam_spark_runner.streaming.level_shell import (  # noqa: E402
    LOG_STATE,
    SHARD_STATE,
    WAITING_STATE,
    LevelShell,
)


def test_the_module_a_pre_init_unpickles_imports_no_beam(run_python: Any) -> None:
    code = (
        "import sys\n"
        "import beam_spark_runner.streaming.level_shell\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'))\n"
    )
    completed = run_python(["-c", code])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


class _Handle:
    """A ``StatefulProcessorHandle`` recording the state variables declared."""

    def __init__(self) -> None:
        self.declared: list[tuple[str, str, list[str]]] = []

    def getValueState(self, name: str, schema: Any) -> str:  # noqa: N802 - PySpark's name
        self.declared.append(("value", name, schema.fieldNames()))
        return f"value:{name}"

    def getListState(self, name: str, schema: Any) -> str:  # noqa: N802 - PySpark's name
        self.declared.append(("list", name, schema.fieldNames()))
        return f"list:{name}"


class _Level:
    """Stands for ``levels.Level``: records what it was bound to and echoes its rows."""

    unpickled = 0

    def __init__(self) -> None:
        self.bound: tuple[Any, ...] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).unpickled += 1
        self.__dict__.update(state)

    def bind(self, shard: Any, waiting: Any, log: Any) -> None:
        self.bound = (shard, waiting, log)

    def run(self, key: Any, rows: Iterator[Any]) -> Iterator[Any]:
        for row in rows:
            yield key, row, self.bound


def _shell_after_pickling(waiting: bool) -> LevelShell:
    shell = LevelShell(cloudpickle.dumps(_Level()), waiting=waiting)
    restored = pickle.loads(cloudpickle.dumps(shell))
    assert isinstance(restored, LevelShell)
    return restored


def test_the_shell_declares_the_state_variables_and_unpickles_the_level_once() -> None:
    _Level.unpickled = 0
    shell = _shell_after_pickling(waiting=True)
    handle = _Handle()
    shell.init(handle)
    assert handle.declared == [
        ("value", SHARD_STATE, ["state"]),
        ("list", WAITING_STATE, ["needs", "chunk"]),
        ("list", LOG_STATE, ["entry"]),
    ]
    assert _Level.unpickled == 0  # the pre-init declares, and unpickles nothing
    bound = (f"value:{SHARD_STATE}", f"list:{WAITING_STATE}", f"list:{LOG_STATE}")
    assert list(shell.handleInputRows((1, 0), iter(["a", "b"]), None)) == [
        ((1, 0), "a", bound),
        ((1, 0), "b", bound),
    ]
    assert list(shell.handleInputRows((2, 1), iter(["c"]), None)) == [((2, 1), "c", bound)]
    assert _Level.unpickled == 1


def test_a_level_without_side_inputs_has_no_waiting_list() -> None:
    shell = _shell_after_pickling(waiting=False)
    handle = _Handle()
    shell.init(handle)
    assert handle.declared == [("value", SHARD_STATE, ["state"]), ("list", LOG_STATE, ["entry"])]
    assert list(shell.handleInputRows((1, 0), iter(["a"]), None)) == [
        ((1, 0), "a", (f"value:{SHARD_STATE}", None, f"list:{LOG_STATE}"))
    ]


def test_a_level_reads_the_shard_back_from_its_groups_slot(monkeypatch: Any) -> None:
    """``placement`` may give a shard's rows the slot shard + k * shards: the level runs
    that shard, and passes on the rows of a target it does not run, untouched."""
    from beam_spark_runner.execution.stage_worker import NO_SINKS
    from beam_spark_runner.streaming.levels import Level
    from beam_spark_runner.streaming.topology import GROUP, STAGE, NodeSpec, build_topology

    topology = build_topology(
        [
            NodeSpec("read", STAGE, False, (("root", "impulse"),), (((GROUP, "g"),),)),
            NodeSpec("g", GROUP, True, ((STAGE, "read"),), (((STAGE, "count"),),)),
            NodeSpec("count", STAGE, False, ((GROUP, "g"),), ()),
        ],
        shards=3,
    )
    group = topology.node_of("g", GROUP).index
    level = Level(topology, {group: None}, {}, {}, {}, NO_SINKS)  # type: ignore[dict-item]
    ran: list[tuple[int, int]] = []
    monkeypatch.setattr(
        level, "_run_shard", lambda target, shard, rows: ran.append((target, shard)) or []
    )
    for slot in (1, 4, 7, 2):
        assert list(level.run((group, slot), iter([]))) == []
    assert ran == [(group, 1), (group, 1), (group, 1), (group, 2)]
    passing = [("row",)]
    assert list(level.run((topology.node_of("count").index, 5), iter(passing))) == passing
