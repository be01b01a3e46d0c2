"""What the streaming query's source emits, micro-batch by micro-batch (no Spark here).

Roots: the Impulse (its element in batch 0, then +inf), TestStreams (one event per batch,
see ``test_stream``) and Spark streams (``spark_sources``, read beside the source, which
says -inf for them). With a TestStream, processing time starts at 0 and moves only by its
processing-time advances, as DirectRunner's test clock does (a wall-clock start would make
every early pane late); without one, it is the driver's wall clock when the batch is planned.

Built on the driver and pickled with ``source``'s ``mapInArrow`` function; imports neither
Beam nor Spark.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from beam_spark_runner.streaming.rows import Row, element_row, marker_rows, packed
from beam_spark_runner.streaming.topology import Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, MIN_MICROS, Marker


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
        """The rows of micro-batch ``batch``: elements, then one marker per root reader.

        The elements travel packed (``rows.packed``), as a router's or a level's do: a
        stage with side inputs reads its main elements as a framed run.
        """
        topology = self.topology
        now = self.processing_time(batch, wall_clock)
        watermarks: dict[str, int] = {}
        elements: list[Row] = []
        if self.impulse is not None:
            if batch == 0:
                # Here, in a task (Beam already imported): the module imports no Beam.
                from beam_spark_runner.beam_internals import ENCODED_IMPULSE_VALUE

                for target in topology.roots[self.impulse]:
                    elements.append(element_row(topology, target, None, ENCODED_IMPULSE_VALUE))
            watermarks[self.impulse] = MAX_MICROS
        for steps in self.test_streams:
            if batch < len(steps):
                step = steps[batch]
                for producer, produced in step.elements:
                    for target in topology.roots[producer]:
                        elements.extend(
                            element_row(topology, target, None, element) for element in produced
                        )
                watermarks.update(step.watermarks)
        yield from packed(elements, topology)
        # After its last event a TestStream's outputs are at +inf (the default below).
        for producer, targets in topology.roots.items():
            default = MIN_MICROS if producer in self.open_roots else MAX_MICROS
            marker = Marker(producer, watermarks.get(producer, default), now)
            for target in targets:
                yield from marker_rows(topology, target, marker)
