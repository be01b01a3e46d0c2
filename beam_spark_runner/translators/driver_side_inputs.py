"""Side inputs: computed from literal rows on the driver, or collected; then broadcast.

A side input is collected to the driver and broadcast (:func:`broadcast_side_inputs`), a
Spark job of its own even when all it reads is a few values the driver holds already (a
``Create(table) | Map(...)`` read ``AsDict``). The stages ``planning.physical`` marks as
running on the driver are computed here instead, in the driver process, by the same code
a Spark task runs (``execution.stage_worker.run_stage``), with the same metrics, warnings
and logs. In batch, what such a stage writes may also be read as main input: its rows
become its output DataFrame, so its user code runs once. Such rows stay on the driver only
up to ``DRIVER_OUTPUT_MAX_BYTES``: beyond that the driver stops, and the stage runs on Spark
as any other (what ran on the driver counts as a failed attempt, as a retried task does).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.side_inputs import side_input_state_entries
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    KEY,
    TAG,
    run_stage,
    tear_down_stage_workers,
)
from beam_spark_runner.planning import BufferKind, Plan, PlannedStage
from beam_spark_runner.planning.physical import DRIVER_SIDE_INPUT_MAX_ROWS
from beam_spark_runner.spark.compat import InlineValue
from beam_spark_runner.translators.create import create_elements
from beam_spark_runner.translators.stage_spec import stage_spec

if TYPE_CHECKING:
    from beam_spark_runner.translators.base import TranslationContext

_LOGGER = logging.getLogger(__name__)

# At most this many bytes of the rows a stage computed on the driver writes for main inputs.
DRIVER_OUTPUT_MAX_BYTES = 32 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class DriverRows:
    """What a stage computed on the driver wrote: its output rows, as a task writes them."""

    tags: list[int]
    keys: list[bytes | None]
    elements: list[bytes]

    def of_output(self, index: int) -> list[bytes]:
        """The elements of the stage's output ``index``."""
        return [e for t, e in zip(self.tags, self.elements, strict=True) if t == index]


def literal_elements(
    plan: Plan, buffer_id: bytes, context: TranslationContext
) -> list[bytes] | None:
    """The encoded elements of a buffer the driver holds, or None where it holds none.

    An Impulse, a runner-held ``Create``, or what stages computed on the driver wrote to it.
    """
    buffer = plan.buffers[buffer_id]
    if buffer.kind == BufferKind.IMPULSE:
        return [bi.ENCODED_IMPULSE_VALUE]
    if buffer.kind == BufferKind.CREATE:
        return create_elements(buffer.name, context)
    elements: list[bytes] = []
    for writer, index in buffer.writers:
        rows = driver_rows(writer, context)
        if rows is None:
            return None
        elements.extend(rows.of_output(index))
    return elements


def side_input_elements(buffer_id: bytes, context: TranslationContext) -> list[bytes] | None:
    """A side input's elements computed on the driver, or None where its job computes them."""
    plan = context.plan
    name = plan.physical.driver_writers.get(buffer_id)
    if name is None:
        return None
    rows = driver_rows(name, context)
    return None if rows is None else rows.of_output(plan.buffers[buffer_id].writers[0][1])


def driver_rows(stage_name: str, context: TranslationContext) -> DriverRows | None:
    """The rows the stage wrote on the driver, computing them the first time.

    None where it cannot run there after all (its input or its main-read output too large,
    an input the driver does not hold): the stage then runs on Spark, and a side input it
    writes is collected by a job.
    """
    if stage_name not in context.driver_runs:
        context.driver_runs[stage_name] = _compute_on_driver(stage_name, context)
    return context.driver_runs[stage_name]


def _compute_on_driver(stage_name: str, context: TranslationContext) -> DriverRows | None:
    """Runs the stage on the driver; what it wrote, or None where it stopped (see above).

    Its side inputs are computed first, on the driver too, and handed to it as a task gets
    them, their state entries in the stage's spec.
    """
    plan = context.plan
    stage = plan.stage(stage_name)
    rows = literal_elements(plan, stage.input_buffer_id, context)
    if rows is None or len(rows) > DRIVER_SIDE_INPUT_MAX_ROWS:
        return None
    main_read = {
        index
        for index, output in enumerate(stage.outputs)
        if plan.buffers[output.buffer_id].main_readers
    }
    # The driver's own __main__ is the live one: no saved main session to restore into it.
    spec = stage_spec(stage, context, broadcast_side_inputs(stage, context, inline=True))
    spec = dataclasses.replace(
        spec, environment=dataclasses.replace(spec.environment, main_session=None)
    )
    started = time.monotonic()
    batch = pa.RecordBatch.from_arrays(
        [pa.nulls(len(rows), pa.binary()), pa.array(rows, pa.binary())], names=[KEY, ELEMENT]
    )
    written = DriverRows([], [], [])
    kept_bytes = 0
    outputs = run_stage(spec, [batch], context.sinks)
    try:
        for output in outputs:
            tags = output.column(TAG).to_pylist()
            elements = output.column(ELEMENT).to_pylist()
            kept_bytes += sum(len(e) for t, e in zip(tags, elements, strict=True) if t in main_read)
            if kept_bytes > DRIVER_OUTPUT_MAX_BYTES:
                _LOGGER.info(
                    "Stage %s writes over %d bytes for main inputs: it runs on Spark",
                    stage.display_name,
                    DRIVER_OUTPUT_MAX_BYTES,
                )
                return None
            written.tags.extend(tags)
            written.keys.extend(output.column(KEY).to_pylist())
            written.elements.extend(elements)
    finally:
        # Stopped early, the run ends as a failed attempt does (its metrics as attempted).
        close = getattr(outputs, "close", None)  # a generator's
        if close is not None:
            close()
        # Its DoFns are done: their teardown runs now, not when the driver exits.
        tear_down_stage_workers()
    _LOGGER.info(
        "Stage %s computed on the driver from %d literal row(s) in %.3f s%s",
        stage.display_name,
        len(rows),
        time.monotonic() - started,
        " (its rows read as main input too)" if main_read else "",
    )
    return written


def broadcast_side_inputs(
    node: PlannedStage, context: TranslationContext, inline: bool = False
) -> object | None:
    """The stage's side inputs, collected (one Spark job each) and broadcast as state entries.

    None for a stage without side inputs. Batch stages read them so; in a streaming run, so
    do stages whose side inputs are all bounded (``streaming.bounded_side_inputs``), with
    ``inline`` for stateful ones: the entries travel with the stage
    (``spark_compat.InlineValue``), as ``transformWithState`` workers load no broadcasts.
    """
    if not node.side_inputs:
        return None
    plan = context.plan
    entries: list[tuple[bytes, bytes]] = []
    for side_input in node.side_inputs:
        elements = context.side_input_elements.get(side_input.buffer_id)
        if elements is None:
            elements = side_input_elements(side_input.buffer_id, context)
            if elements is None:
                frame = context.buffer_frame(side_input.buffer_id)
                context.spark.sparkContext.setJobDescription(
                    f"Beam side input {side_input.pcollection_id} (for {node.display_name})"
                )
                elements = [bytes(row[0]) for row in frame.select(ELEMENT).collect()]
            context.side_input_elements[side_input.buffer_id] = elements
        data_channel_coder = plan.data_channel_coders[side_input.pcollection_id]
        value_coder = context.pipeline_context.coders[plan.safe_coders[data_channel_coder]]
        entries.extend(
            side_input_state_entries(
                side_input.transform_id,
                side_input.tag,
                side_input.access_pattern_urn,
                elements,
                value_coder,
            )
        )
    _LOGGER.info(
        "Stage %s: %d side input(s), %d state entries broadcast",
        node.display_name,
        len(node.side_inputs),
        len(entries),
    )
    if inline:
        return InlineValue(entries)
    broadcast = context.spark.sparkContext.broadcast(entries)
    context.broadcasts.append(broadcast)
    return broadcast
