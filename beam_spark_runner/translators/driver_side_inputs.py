"""Side inputs computed from literal rows on the driver: no Spark job of their own.

A side input is collected to the driver and broadcast (``fused_stage.broadcast_side_inputs``).
Computing it is a Spark job of its own (0.3-0.6 s of fixed cost on a warm ``local[2]``
session) even when all it reads is a few values the driver holds already: a
``Create(table) | Map(...)`` read ``AsDict``, the common lookup-table case. Such a side
input is computed here instead, in the driver process, by the same code a Spark task runs
(``execution.stage_worker.run_stage``, Beam's bundle processor), over the same literal
rows, with the same metrics, warnings and logs recorded.

A stage qualifies when its main input is literal (an Impulse, or a runner-held ``Create``
of at most ``DRIVER_SIDE_INPUT_MAX_ROWS`` values), it is stateless, every side input it
reads qualifies in turn (a chain of lookups, each built from the ones before: computed on
the driver first, and handed to the stage as a task gets them), it has no splittable DoFn
(a file read would read the files on the driver), and every output it writes is read only
as a side input (otherwise the main path would run its user code a second time). Anything
else keeps the collect job.
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
_SDF_URNS = frozenset(
    [
        bi.common_urns.sdf_components.PAIR_WITH_RESTRICTION.urn,
        bi.common_urns.sdf_components.SPLIT_AND_SIZE_RESTRICTIONS.urn,
        bi.common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn,
        bi.common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn,
    ]
)


def driver_stage(
    plan: Plan, buffer_id: bytes, _known: dict[bytes, str | None] | None = None
) -> str | None:
    """The stage that can compute side-input buffer ``buffer_id`` on the driver, if any."""
    known = {} if _known is None else _known
    if buffer_id not in known:
        known[buffer_id] = None  # a side input read in a cycle would not qualify
        known[buffer_id] = _driver_stage(plan, buffer_id, known)
    return known[buffer_id]


def _driver_stage(plan: Plan, buffer_id: bytes, known: dict[bytes, str | None]) -> str | None:
    buffer = plan.buffers[buffer_id]
    if len(buffer.writers) != 1 or buffer.main_readers:
        return None
    name = buffer.writers[0][0]
    stage = plan.stage(name)
    if stage.stateful:
        return None
    if any(driver_stage(plan, side.buffer_id, known) is None for side in stage.side_inputs):
        return None
    if any(plan.buffers[output.buffer_id].main_readers for output in stage.outputs):
        return None
    if any(t.spec.urn in _SDF_URNS for t in stage.descriptor.transforms.values()):
        return None
    source = plan.buffers[stage.input_buffer_id]
    if source.kind == "impulse":
        return name
    if source.kind == CREATE_BUFFER_KIND:
        payload = plan.components.transforms[source.name].spec.payload
        if len(decode_create_payload(payload)) <= DRIVER_SIDE_INPUT_MAX_ROWS:
            return name
    return None


def literal_elements(plan: Plan, buffer_id: bytes, context: TranslationContext) -> list[bytes]:
    """The encoded elements of a literal buffer (an Impulse or a runner-held ``Create``)."""
    buffer = plan.buffers[buffer_id]
    if buffer.kind == "impulse":
        return [bi.ENCODED_IMPULSE_VALUE]
    return create_elements(buffer.name, context)


def compute_on_driver(stage_name: str, context: TranslationContext) -> dict[bytes, list[bytes]]:
    """Runs the stage on the driver; the elements it wrote, per output buffer.

    Its side inputs (see :func:`driver_stage`) are computed first, on the driver too, and
    handed to it as a task gets them, their state entries in the stage's spec.
    """
    from beam_spark_runner.translators.fused_stage import broadcast_side_inputs, stage_spec

    plan = context.plan
    stage = plan.stage(stage_name)
    side_inputs = broadcast_side_inputs(stage, context, inline=True)
    started = time.monotonic()
    rows = literal_elements(plan, stage.input_buffer_id, context)
    batch = pa.RecordBatch.from_arrays(
        [pa.nulls(len(rows), pa.binary()), pa.array(rows, pa.binary())], names=[KEY, ELEMENT]
    )
    written: dict[bytes, list[bytes]] = {output.buffer_id: [] for output in stage.outputs}
    # The driver's own __main__ is the live one: no saved main session to restore into it.
    spec = dataclasses.replace(stage_spec(stage, context, side_inputs), main_session=None)
    try:
        for output in run_stage(spec, [batch], context.sinks):
            for tag, element in zip(
                output.column(TAG).to_pylist(), output.column(ELEMENT).to_pylist(), strict=True
            ):
                written[stage.outputs[tag].buffer_id].append(element)
    finally:
        # Its DoFns are done: their teardown runs now, not when the driver exits.
        tear_down_stage_workers()
    _LOGGER.info(
        "Side input(s) of stage %s computed on the driver from %d literal row(s) in %.3f s",
        stage.display_name,
        len(rows),
        time.monotonic() - started,
    )
    return written
