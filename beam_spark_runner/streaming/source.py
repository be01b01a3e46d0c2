"""The streaming query's one source: the roots' rows, micro-batch by micro-batch.

A Python streaming data source (PySpark 4's ``DataSource`` API) whose offsets count
micro-batches. Every trigger it offers one more batch, so every micro-batch runs, with
or without new elements, and carries each root's watermark marker: timers and windows
fire without new data. A batch's offset records the runner's processing time for it, so a
batch recomputed after a failure or a restart sees the same time.

What each batch holds (roots, elements, markers, processing time) is the
``source_plan.SourcePlan`` the query passes as an option.

PySpark creates and unpickles the source in fresh driver processes (planning, offsets), so this
module and what it imports import no Beam (``tests/test_streaming_levels.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from beam_spark_runner.streaming.driver_processes import quiet_daemon_child, quiet_source_runner
from beam_spark_runner.streaming.rows import routed_type
from beam_spark_runner.streaming.source_plan import SourcePlan

SOURCE_NAME = "beam_spark_runner"
_PLAN_OPTION = "plan"


class RunnerSource(DataSource):  # type: ignore[misc]
    """The data source the streaming query reads its roots from."""

    @classmethod
    def name(cls) -> str:
        """The format name the query reads."""
        return SOURCE_NAME

    def __init__(self, options: dict[str, str]) -> None:
        """Created in the worker that plans the query's source: quiet once it idles.

        See ``driver_processes``: a traceback on the driver's console a minute after the
        query starts, or when the session stops.
        """
        super().__init__(options)
        quiet_daemon_child()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled; quiet when its process or worker ends on a closed socket.

        In the process serving the query's offsets: 30 lines of tracebacks on the driver's
        console at the end of every query; in a planning worker, a traceback once it idles
        (see ``driver_processes``).
        """
        self.__dict__.update(state)
        quiet_source_runner()
        quiet_daemon_child()

    def schema(self) -> Any:
        """The routed rows' schema."""
        return routed_type()

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 - PySpark's name
        """A reader over the plan the query passed as an option."""
        return _Reader(SourcePlan.decode(self.options[_PLAN_OPTION]))


class _Reader(DataSourceStreamReader):  # type: ignore[misc]
    def __init__(self, plan: SourcePlan) -> None:
        self.plan = plan

    def initialOffset(self) -> dict:  # noqa: N802 - PySpark's name
        return {"batch": 0, "time": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802 - PySpark's name
        # One more batch every trigger; its processing time fixed now, for any rerun.
        return {"batch": start["batch"] + 1, "time": time.time_ns() // 1000}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [
            InputPartition((batch, end["time"])) for batch in range(start["batch"], end["batch"])
        ]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        batch, wall_clock = partition.value
        yield from self.plan.rows(batch, wall_clock)

    def commit(self, end: dict) -> None:
        pass


def source_options(plan: SourcePlan) -> dict[str, str]:
    """The options the query's ``readStream`` passes to the source."""
    return {_PLAN_OPTION: plan.encode()}
