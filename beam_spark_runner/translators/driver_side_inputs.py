"""Side inputs computed from literal rows on the driver: no Spark job of their own.

A side input is collected to the driver and broadcast (``fused_stage.broadcast_side_inputs``).
Computing it is a Spark job of its own (0.3-0.6 s of fixed cost on a warm ``local[2]``
session) even when all it reads is a few values the driver holds already: a
``Create(table) | Map(...)`` read ``AsDict``, the common lookup-table case. Such a side
input is computed here instead, in the driver process, by the same code a Spark task runs
(``execution.stage_worker.run_stage``, Beam's bundle processor), over the same literal
rows, with the same metrics, warnings and logs recorded.

A stage qualifies when its main input is literal (an Impulse, or a runner-held ``Create``
of at most ``DRIVER_SIDE_INPUT_MAX_ROWS`` values, or in batch the output of stages that
qualify in turn), it is stateless, every side input it reads qualifies in turn (a chain of
lookups, each built from the ones before: computed on the driver first, and handed to the
stage as a task gets them), and it has no splittable DoFn (a file read would read the
files on the driver). In batch, what it writes may also be read as main input: the rows it
wrote on the driver become its output DataFrame (``TranslationContext.stage_frame``), so
its user code runs once, and the stages reading them run in the pipeline's job. A
``Create([None])`` fused with the first of several ``ParDo``s that all read it (and each
other's outputs as side inputs) is the common case. Such rows stay on the driver only up to
``DRIVER_OUTPUT_MAX_BYTES``: beyond that the driver stops, and the stage runs on Spark as
any other (what ran on the driver counts as a failed attempt, as a retried task does). In
a streaming run every output must be read only as a side input: the query would run the
stage's user code a second time. Anything else keeps the collect job.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    KEY,
    TAG,
    has_typed_outputs,
    run_stage,
    tear_down_stage_workers,
)
from beam_spark_runner.planning import CREATE_BUFFER_KIND, Plan, decode_create_payload
from beam_spark_runner.translators.create import create_elements

if TYPE_CHECKING:
    from beam_spark_runner.translators.base import TranslationContext

_LOGGER = logging.getLogger(__name__)

# At most this many literal rows feed a stage computed on the driver.
DRIVER_SIDE_INPUT_MAX_ROWS = 100_000
# At most this many bytes of the rows a stage computed on the driver writes for main inputs.
DRIVER_OUTPUT_MAX_BYTES = 32 * 1024 * 1024
_SDF_URNS = frozenset(
    [
        bi.common_urns.sdf_components.PAIR_WITH_RESTRICTION.urn,
        bi.common_urns.sdf_components.SPLIT_AND_SIZE_RESTRICTIONS.urn,
        bi.common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn,
        bi.common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn,
    ]
)


@dataclasses.dataclass(frozen=True)
class DriverRows:
    """What a stage computed on the driver wrote: its output rows, as a task writes them."""

    tags: list[int]
    keys: list[bytes | None]
    elements: list[bytes]

    def of_output(self, index: int) -> list[bytes]:
        """The elements of the stage's output ``index``."""
        return [e for t, e in zip(self.tags, self.elements, strict=True) if t == index]


def driver_stage(plan: Plan, buffer_id: bytes, _known: dict[str, bool] | None = None) -> str | None:
    """The stage that can compute side-input buffer ``buffer_id`` on the driver, if any."""
    buffer = plan.buffers[buffer_id]
    if len(buffer.writers) != 1 or (plan.streaming and buffer.main_readers):
        return None
    name = buffer.writers[0][0]
    return name if _qualifies(plan, name, {} if _known is None else _known) else None


def driver_stages(plan: Plan) -> frozenset[str]:
    """Every stage the run computes on the driver: side inputs' writers and their inputs'."""
    known: dict[str, bool] = {}
    stages: set[str] = set()
    pending = [
        name
        for buffer_id, buffer in plan.buffers.items()
        if buffer.side_readers and (name := driver_stage(plan, buffer_id, known)) is not None
    ]
    while pending:
        name = pending.pop()
        if name not in stages:
            stages.add(name)
            source = plan.buffers[plan.stage(name).input_buffer_id]
            if source.kind not in ("impulse", CREATE_BUFFER_KIND):
                pending.extend(writer for writer, _ in source.writers)
    return frozenset(stages)


def _qualifies(plan: Plan, name: str, known: dict[str, bool]) -> bool:
    if name not in known:
        known[name] = False  # a stage reached again in a cycle does not qualify
        known[name] = _stage_qualifies(plan, name, known)
    return known[name]


def _stage_qualifies(plan: Plan, name: str, known: dict[str, bool]) -> bool:
    stage = plan.stage(name)
    if stage.stateful:
        return False
    if any(driver_stage(plan, side.buffer_id, known) is None for side in stage.side_inputs):
        return False
    if plan.streaming and any(plan.buffers[o.buffer_id].main_readers for o in stage.outputs):
        return False
    if any(t.spec.urn in _SDF_URNS for t in stage.descriptor.transforms.values()):
        return False
    source = plan.buffers[stage.input_buffer_id]
    if source.kind == "impulse":
        return True
    if source.kind == CREATE_BUFFER_KIND:
        payload = plan.components.transforms[source.name].spec.payload
        return len(decode_create_payload(payload)) <= DRIVER_SIDE_INPUT_MAX_ROWS
    # In batch, rows other stages computed on the driver (counted when they are computed).
    return (
        not plan.streaming
        and source.kind == "materialize"
        and bool(source.writers)
        and all(_qualifies(plan, writer, known) for writer, _ in source.writers)
    )


def literal_elements(
    plan: Plan, buffer_id: bytes, context: TranslationContext
) -> list[bytes] | None:
    """The encoded elements of a buffer the driver holds, or None where it holds none.

    An Impulse, a runner-held ``Create``, or what stages computed on the driver wrote to it.
    """
    buffer = plan.buffers[buffer_id]
    if buffer.kind == "impulse":
        return [bi.ENCODED_IMPULSE_VALUE]
    if buffer.kind == CREATE_BUFFER_KIND:
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
    name = driver_stage(plan, buffer_id)
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

    Its side inputs (see :func:`driver_stage`) are computed first, on the driver too, and
    handed to it as a task gets them, their state entries in the stage's spec.
    """
    from beam_spark_runner.translators.fused_stage import broadcast_side_inputs, stage_spec

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
    spec = dataclasses.replace(
        stage_spec(stage, context, broadcast_side_inputs(stage, context, inline=True)),
        main_session=None,
    )
    if main_read and has_typed_outputs(spec.outputs):
        return None  # a native combine's typed columns: written by its Spark task only
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
