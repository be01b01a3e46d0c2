"""Side inputs read in the same Spark job as the stage that reads them.

A stage whose main input is a few literal rows (an Impulse, a small ``Create``, as in
``CombineGlobally``'s default value) and that reads side inputs would otherwise need a Spark
job per side input. Instead the translator unions the side inputs' rows into the stage's
input in one partition, each keyed by its side input's index (main rows have a null key);
the task builds the side inputs' state entries as the driver would
(``side_inputs.side_input_state_entries``), then runs the main rows. Where the only side
input is written by a stage that groups its own input (``grouped_stage``), that stage runs
in the same worker too (:class:`GroupedWriter`), its input the task's keyed rows.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.grouped_stage import run_grouped_stage
from beam_spark_runner.execution.grouping import GroupSpec
from beam_spark_runner.execution.side_inputs import side_input_state_entries
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    KEY,
    NO_SINKS,
    StageSpec,
    TaskSinks,
    run_stage,
)

_LOGGER = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InlineSideInput:
    """One side input of the stage, read from the stage's own input rows."""

    transform_id: str
    tag: str
    access_pattern_urn: str
    # The runner-safe windowed value coder of the side input's elements, by id in
    # ``coder_components`` (a serialized ``Components`` holding just the coders it needs).
    coder_id: str
    coder_components: bytes


@dataclasses.dataclass(frozen=True)
class GroupedWriter:
    """The stage writing the only side input, run first in the same task over its groups."""

    group: GroupSpec
    stage: StageSpec
    as_values: bool


@dataclasses.dataclass(frozen=True)
class LoadedSideInputs:
    """State entries in place of a broadcast: ``StageWorker`` reads ``.value``."""

    value: list[tuple[bytes, bytes]]


def side_input_marker(index: int) -> bytes:
    """The key-column value that marks a row as an element of side input ``index``."""
    return b"%d" % index


def _value_coder(side_input: InlineSideInput) -> Any:
    components = bi.beam_runner_api_pb2.Components.FromString(side_input.coder_components)
    return bi.PipelineContext(components).coders[side_input.coder_id]


def _main_and_keyed_rows(
    batches: Iterable[pa.RecordBatch],
) -> tuple[list[pa.RecordBatch], list[pa.RecordBatch]]:
    """(the main rows: a null key, the other rows) of a task's input batches."""
    main: list[pa.RecordBatch] = []
    keyed: list[pa.RecordBatch] = []
    for batch in batches:
        is_main = pc.is_null(batch.column(KEY))
        main_rows, keyed_rows = batch.filter(is_main), batch.filter(pc.invert(is_main))
        if main_rows.num_rows:
            main.append(main_rows)
        if keyed_rows.num_rows:
            keyed.append(keyed_rows)
    return main, keyed


def split_rows(
    batches: Iterable[pa.RecordBatch], side_input_count: int
) -> tuple[list[pa.RecordBatch], list[list[bytes]]]:
    """(main input batches, each side input's encoded elements) of a task's input."""
    main, keyed = _main_and_keyed_rows(batches)
    sides: list[list[bytes]] = [[] for _ in range(side_input_count)]
    for rows in keyed:
        for marker, element in zip(
            rows.column(KEY).to_pylist(), rows.column(ELEMENT).to_pylist(), strict=True
        ):
            sides[int(marker)].append(element)
    return main, sides


def run_stage_with_inline_side_inputs(
    spec: StageSpec,
    side_inputs: tuple[InlineSideInput, ...],
    batches: Iterable[pa.RecordBatch],
    sinks: TaskSinks = NO_SINKS,
    writer: GroupedWriter | None = None,
) -> Iterator[pa.RecordBatch]:
    """The body of the stage's ``mapInArrow``: side inputs first, then the main rows.

    With a ``writer``, the rows with a key are the writer's key-sorted input, and what it
    outputs is the one side input's elements.
    """
    if writer is None:
        main, elements = split_rows(batches, len(side_inputs))
    else:
        main, elements = _run_writer(writer, batches, sinks)
    entries: list[tuple[bytes, bytes]] = []
    for side_input, side_elements in zip(side_inputs, elements, strict=True):
        entries.extend(
            side_input_state_entries(
                side_input.transform_id,
                side_input.tag,
                side_input.access_pattern_urn,
                side_elements,
                _value_coder(side_input),
            )
        )
    _LOGGER.debug(
        "Stage %s: %d side input(s) read inline, %d state entries",
        spec.display_name,
        len(side_inputs),
        len(entries),
    )
    loaded = dataclasses.replace(spec, side_input_state=LoadedSideInputs(entries))
    yield from run_stage(loaded, main, sinks)


def _run_writer(
    writer: GroupedWriter, batches: Iterable[pa.RecordBatch], sinks: TaskSinks
) -> tuple[list[pa.RecordBatch], list[list[bytes]]]:
    """(main input batches, [the writer's output elements]) of a task's input."""
    main, grouped = _main_and_keyed_rows(batches)
    elements: list[bytes] = []
    for output in run_grouped_stage(
        writer.group, writer.stage, grouped, sinks, as_values=writer.as_values
    ):
        elements.extend(output.column(ELEMENT).to_pylist())
    return main, [elements]
