"""What a stateful level's ``transformWithState`` pickles: a processor that imports no Beam.

At a query's start PySpark unpickles each ``transformWithState`` processor on the driver,
in a fresh process, only to learn its state variables (its "pre-init"); unpickling
``levels.Level`` there would import Beam and the runner's executor. ``LevelShell`` is
pickled instead: it declares the state variables itself and holds the level pickled,
unpickled in a task at its first group, where Beam is already imported. This module imports
PySpark and ``driver_processes`` (the standard library) only; keep it that way
(``tests/streaming/test_levels.py`` checks it in a fresh interpreter).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

from beam_spark_runner.spark.stateful_rows import StatefulProcessor, StatefulProcessorHandle
from beam_spark_runner.streaming.driver_processes import quiet_pre_init

# The state variables of a shard: its encoded state (one value), and, in a level with a
# GroupByKey or a stage with side inputs, what the shard buffers for a later batch (values
# waiting for their window, main elements waiting for side inputs: chunk_lists), and in a
# level with a GroupByKey, a stateful DoFn or a splittable DoFn its state's base and change
# log (``state_cache``).
SHARD_STATE = "shard"
WAITING_STATE = "waiting"
# Every shard's base and change log (``state_cache``); its value holds a token.
LOG_STATE = "log"


class LevelShell(StatefulProcessor):  # type: ignore[misc]
    """The ``transformWithState`` processor of one stateful level, its level pickled."""

    def __init__(self, level: bytes, waiting: bool) -> None:
        # ``levels.Level``, pickled (cloudpickle: it may hold functions by value).
        self.level = level
        # Whether the level keeps waiting elements (it has GroupByKeys or stages with side
        # inputs).
        self.waiting = waiting
        self._states: tuple[Any, Any, Any] = (None, None, None)
        self._level: Any = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled; in a pre-init process, that process's prints are silenced.

        See ``driver_processes``: four lines per level and query on the driver's console.
        """
        self.__dict__.update(state)
        quiet_pre_init()

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declares the state variables (all the pre-init needs)."""
        from pyspark.sql.types import BinaryType, StructField, StructType

        shard = handle.getValueState(SHARD_STATE, StructType([StructField("state", BinaryType())]))
        waiting = None
        if self.waiting:
            fields = [StructField("needs", BinaryType()), StructField("chunk", BinaryType())]
            waiting = handle.getListState(WAITING_STATE, StructType(fields))
        log = handle.getListState(LOG_STATE, StructType([StructField("entry", BinaryType())]))
        self._states = (shard, waiting, log)

    def handleInputRows(  # noqa: N802 - PySpark's name
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[Any]:
        """The level's rows out for one (target, shard) group (``levels.Level.run``)."""
        if self._level is None:
            self._level = pickle.loads(self.level)
            self._level.bind(*self._states)
        return self._level.run(key, rows)  # type: ignore[no-any-return]

    def close(self) -> None:
        """Nothing to release."""
