"""The streaming query's one source: the roots' rows, micro-batch by micro-batch.

A Python streaming data source (PySpark 4's ``DataSource`` API) whose offsets count
micro-batches. Every trigger it offers one more batch, so every micro-batch runs, with
or without new elements, and carries each root's watermark marker: timers and windows
fire without new data. A batch's offset records the runner's processing time for it, so a
batch recomputed after a failure or a restart sees the same time.

Roots: the Impulse (its element in batch 0, then +inf: bounded sources downstream of it
are read once) and TestStreams (one event per batch, see ``test_stream``; processing time
starts at 0 and moves only by the TestStream's processing-time advances, as DirectRunner's
test clock: Beam's trigger driver compares processing-time timers with window ends, so a
wall-clock start would make every early pane late). Without a TestStream, processing time
is the driver's wall clock when the batch was planned. Spark streams
(``spark_sources``) are roots too, read beside this source: it says -inf for them.

PySpark unpickles the source in fresh driver processes (lookup, planning, offsets), so this
module and what it imports import no Beam (``tests/test_streaming_levels.py``).
"""

from __future__ import annotations

import base64
import dataclasses
import pickle
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from beam_spark_runner.streaming.rows import Row, element_row, marker_rows, routed_type
from beam_spark_runner.streaming.topology import Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, MIN_MICROS, Marker

SOURCE_NAME = "beam_spark_runner"
_PLAN_OPTION = "plan"


@dataclasses.dataclass(frozen=True)
class SourceStep:
    """One micro-batch of a TestStream: elements per output, then watermarks and time."""

    # Root producer id (its buffer id) -> encoded elements.
    elements: tuple[tuple[str, tuple[bytes, ...]], ...]
    # Root producer id -> its watermark once the step is done (microseconds).
    watermarks: tuple[tuple[str, int], ...]
    # How far the runner's processing time moves with this step (microseconds).
    advance: int


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """What the source emits: the roots, their readers, and the TestStreams' steps."""

    topology: Topology
    # The Impulse root's producer id, if the pipeline has one.
    impulse: str | None
    test_streams: tuple[tuple[SourceStep, ...], ...]
    # Roots another source fills (Spark streams): their watermark is not this source's to
    # say, so its markers for them say -inf (they still make every shard run each batch).
    open_roots: frozenset[str] = frozenset()

    def encode(self) -> str:
        """The plan as a data source option (a string)."""
        return base64.b64encode(pickle.dumps(self)).decode()

    @staticmethod
    def decode(option: str) -> SourcePlan:
        """The plan an option holds."""
        plan = pickle.loads(base64.b64decode(option))
        assert isinstance(plan, SourcePlan)
        return plan

    @property
    def batches_with_events(self) -> int:
        """How many batches hold TestStream events; every later batch only says +inf."""
        return max((len(steps) for steps in self.test_streams), default=0)

    def processing_time(self, batch: int, wall_clock: int) -> int:
        """The runner's processing time in ``batch`` (microseconds)."""
        if not self.test_streams:
            return wall_clock
        return max(sum(step.advance for step in steps[: batch + 1]) for steps in self.test_streams)

    def rows(self, batch: int, wall_clock: int) -> Iterator[Row]:
        """The rows of micro-batch ``batch``: elements, then one marker per root reader."""
        topology = self.topology
        now = self.processing_time(batch, wall_clock)
        watermarks: dict[str, int] = {}
        if self.impulse is not None:
            if batch == 0:
                # Here, in a task (Beam already imported): the module imports no Beam.
                from beam_spark_runner.beam_internals import ENCODED_IMPULSE_VALUE

                for target in topology.roots[self.impulse]:
                    yield element_row(topology, target, None, ENCODED_IMPULSE_VALUE)
            watermarks[self.impulse] = MAX_MICROS
        for steps in self.test_streams:
            if batch < len(steps):
                step = steps[batch]
                for producer, elements in step.elements:
                    for target in topology.roots[producer]:
                        for element in elements:
                            yield element_row(topology, target, None, element)
                watermarks.update(step.watermarks)
            # After its last event a TestStream's outputs are at +inf (the default below).
        for producer, targets in topology.roots.items():
            default = MIN_MICROS if producer in self.open_roots else MAX_MICROS
            marker = Marker(producer, watermarks.get(producer, default), now)
            for target in targets:
                yield from marker_rows(topology, target, marker)


class RunnerSource(DataSource):  # type: ignore[misc]
    """The data source the streaming query reads its roots from."""

    @classmethod
    def name(cls) -> str:
        """The format name the query reads."""
        return SOURCE_NAME

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
