"""A query's stateful levels, and the routers between them, in one group (PySpark 3.5).

PySpark 3.5's one stateful operator, ``applyInPandasWithState``, is allowed once per
streaming query, so a pipeline of several levels cannot chain one per level. There the
levels 1..L and the routers between them run inside that one operator, in a single group:
each micro-batch, one task takes every row the first router sends on, runs level 1's
(target, shard) groups in order, passes their rows through router 1's stages, then level 2,
and so on, as the chained query would, and returns the rows for router L and the sink.
Each (target, shard) keeps its own state cells (``group_state.CellsHandle.scoped``), all
in the group's one ``GroupState``. The stateful part of such a query thus runs in one task
(parallelism 1) and rewrites all its state each micro-batch; its semantics are the
chained query's, a level's markers reaching the next level in the same micro-batch.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from beam_spark_runner.spark.stateful_operator import stateful_operator
from beam_spark_runner.spark.stateful_rows import StatefulProcessor
from beam_spark_runner.streaming.rows import routed_row, routed_type, to_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_LOGGER = logging.getLogger(__name__)

# A router's body: routed Arrow batches in, routed Arrow batches out.
RouterBody = Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]
# The one group's key column, after the routed columns.
CHAIN = "chain"


def chained_frame(
    frame: DataFrame, levels: list[Any], routers: list[RouterBody | None]
) -> DataFrame:
    """``frame`` through ``levels``, ``routers[i]`` after level i + 1, in one group."""
    from pyspark.sql import functions as F  # noqa: N812 - PySpark's convention

    _LOGGER.warning(
        "The pipeline's %d stateful levels run in one task per micro-batch: this PySpark "
        "allows one applyInPandasWithState per streaming query. PySpark 4.0 or newer runs "
        "each level as its own operator, in parallel.",
        len(levels),
    )
    return stateful_operator(
        frame.withColumn(CHAIN, F.lit(0)), [CHAIN], LevelChain(levels, routers), routed_type()
    )


class LevelChain(StatefulProcessor):  # type: ignore[misc]
    """Levels' processors (``level_shell.LevelShell``) and routers run one after the other."""

    def __init__(self, levels: list[Any], routers: list[RouterBody | None]) -> None:
        assert len(routers) == len(levels) - 1, "a router (or None) between two levels"
        self.levels = levels
        self.routers = routers
        self._handle: Any = None

    def init(self, handle: Any) -> None:
        """Every level declares its states; each (target, shard) scopes them when it runs."""
        self._handle = handle
        for level in self.levels:
            level.init(handle)

    def handleInputRows(  # noqa: N802 - PySpark's name
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[Any]:
        """The micro-batch's rows through every level and router in between."""
        make_row = routed_row()
        current = [make_row(*row[:-1]) for row in rows]  # without the group's column
        for number, level in enumerate(self.levels):
            current = self._run_level(level, current)
            router = self.routers[number] if number < len(self.routers) else None
            if router is not None:
                current = _through_router(router, current)
        return iter(current)

    def close(self) -> None:
        """Nothing to release."""

    def _run_level(self, level: Any, rows: list[Any]) -> list[Any]:
        """Each (target, shard) of ``rows`` through ``level``, in order, with its own state."""
        groups: dict[tuple[int, int], list[Any]] = collections.defaultdict(list)
        for row in rows:
            groups[(int(row[0]), int(row[1]))].append(row)
        out: list[Any] = []
        for group in sorted(groups):
            self._handle.scoped(group)
            out.extend(level.handleInputRows(group, iter(groups[group]), None))
        return out


def _through_router(router: RouterBody, rows: list[Any]) -> list[Any]:
    """``rows`` through a router's body, as the ``mapInArrow`` running it would pass them."""
    if not rows:
        return []
    make_row = routed_row()
    out: list[Any] = []
    for batch in router([to_batch(rows)]):
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        out.extend(make_row(*values) for values in zip(*columns, strict=True))
    return out
