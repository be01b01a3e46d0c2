"""Physical planning: how each fused stage runs on Spark, decided once after fusion.

:func:`decide` records, per stage, a :class:`~beam_spark_runner.planning.plan.StageStrategy`
on the plan; the translators dispatch on it and ask no other translator. A stage may run on
the driver (``translators.driver_side_inputs``), be fused with its GroupByKey
(``execution.grouped_stage``) or native combine (``execution.native_combine``) as its only
stateless reader, read its side inputs inline (``execution.inline_side_inputs``), or, if
stateful, get its input shuffled and sorted on the key; and the writers of a GroupByKey
that all key with None go to one partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning.plan import (
    PhysicalPlan,
    Plan,
    PlannedBuffer,
    PlannedStage,
    StageInput,
    StageStrategy,
)
from beam_spark_runner.planning.urns import (
    GROUP_BY_KEY_URN,
    NATIVE_COMBINE_URN,
    BufferKind,
    decode_create_payload,
)

# At most this many literal rows feed a stage computed on the driver.
DRIVER_SIDE_INPUT_MAX_ROWS = 100_000
# A stage reading side inputs whose main input is at most this many literal rows (an
# Impulse, a small Create) may read them in its own task, in the pipeline's one Spark job.
INLINE_SIDE_INPUTS_MAX_MAIN_ROWS = 64
_SDF_URNS = frozenset(
    [
        bi.common_urns.sdf_components.PAIR_WITH_RESTRICTION.urn,
        bi.common_urns.sdf_components.SPLIT_AND_SIZE_RESTRICTIONS.urn,
        bi.common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn,
        bi.common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn,
    ]
)
_MERGE_ACCUMULATORS_URN: str = (
    bi.common_urns.combine_components.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn
)


def decide(plan: Plan) -> PhysicalPlan:
    """How each stage of ``plan`` runs (see the module's docstring)."""
    known: dict[str, bool] = {}
    driver_writers = {
        buffer_id: name
        for buffer_id, buffer in plan.buffers.items()
        if buffer.side_readers and (name := driver_stage(plan, buffer_id, known)) is not None
    }
    on_driver = _with_inputs(plan, driver_writers.values())
    stages = {}
    for stage in plan.stages:
        writer = None
        stage_input = _stage_input(plan, stage)
        if stage_input is StageInput.INLINE_SIDE_INPUTS:
            grouped_writer = grouped_side_input_writer(plan, stage)
            writer = None if grouped_writer is None else grouped_writer.name
        stages[stage.name] = StageStrategy(stage_input, stage.name in on_driver, writer)
    single_key = frozenset(
        buffer_id
        for buffer_id, buffer in plan.buffers.items()
        if buffer.kind == BufferKind.GROUP and has_one_key(buffer, plan)
    )
    return PhysicalPlan(stages, driver_writers, single_key)


def _stage_input(plan: Plan, stage: PlannedStage) -> StageInput:
    if combined_in_stage(plan, stage):
        return StageInput.NATIVE_COMBINED
    if groups_in_stage(plan, stage):
        return StageInput.GROUPED
    if reads_side_inputs_inline(plan, stage):
        return StageInput.INLINE_SIDE_INPUTS
    return StageInput.KEY_SORTED if stage.stateful else StageInput.BUFFER


# 1. Stages computed on the driver.


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
    writers = [
        name
        for buffer_id, buffer in plan.buffers.items()
        if buffer.side_readers and (name := driver_stage(plan, buffer_id, known)) is not None
    ]
    return _with_inputs(plan, writers)


def _with_inputs(plan: Plan, names: Iterable[str]) -> frozenset[str]:
    """The driver stages ``names`` and the stages writing their inputs, transitively."""
    stages: set[str] = set()
    pending = list(names)
    while pending:
        name = pending.pop()
        if name not in stages:
            stages.add(name)
            source = plan.buffers[plan.stage(name).input_buffer_id]
            if source.kind not in (BufferKind.IMPULSE, BufferKind.CREATE):
                pending.extend(writer for writer, _ in source.writers)
    return frozenset(stages)


def _qualifies(plan: Plan, name: str, known: dict[str, bool]) -> bool:
    if name not in known:
        known[name] = False  # a stage reached again in a cycle does not qualify
        known[name] = _stage_qualifies(plan, name, known)
    return known[name]


def _stage_qualifies(plan: Plan, name: str, known: dict[str, bool]) -> bool:
    """Literal input, stateless, no native combine or splittable DoFn, side inputs too."""
    stage = plan.stage(name)
    if stage.stateful:
        return False
    # A native combine's typed columns are written by its Spark task only.
    if any(plan.buffers[o.buffer_id].kind == BufferKind.NATIVE_COMBINE for o in stage.outputs):
        return False
    if any(driver_stage(plan, side.buffer_id, known) is None for side in stage.side_inputs):
        return False
    # A streaming query would run the stage's user code a second time for main readers.
    if plan.streaming and any(plan.buffers[o.buffer_id].main_readers for o in stage.outputs):
        return False
    if any(t.spec.urn in _SDF_URNS for t in stage.descriptor.transforms.values()):
        return False
    source = plan.buffers[stage.input_buffer_id]
    if source.kind == BufferKind.IMPULSE:
        return True
    if source.kind == BufferKind.CREATE:
        payload = plan.components.transforms[source.name].spec.payload
        return len(decode_create_payload(payload)) <= DRIVER_SIDE_INPUT_MAX_ROWS
    # In batch, rows other stages computed on the driver (counted when they are computed).
    return (
        not plan.streaming
        and source.kind == BufferKind.MATERIALIZE
        and bool(source.writers)
        and all(_qualifies(plan, writer, known) for writer, _ in source.writers)
    )


# 2. Stages fused with their GroupByKey or native combine.


def groups_in_stage(plan: Plan, node: PlannedStage) -> bool:
    """Whether the stage groups its input itself: the GroupByKey's only reader, stateless.

    A GroupByKey read by more than one stage, or as a side input, keeps its own
    DataFrame (computed once, persisted if read twice); a stateful stage re-shuffles its
    input on the key.
    """
    return _only_stateless_reader(plan, node, GROUP_BY_KEY_URN)


def combined_in_stage(plan: Plan, node: PlannedStage) -> bool:
    """Whether the stage writes the native combine's output elements itself.

    It does where it is the combine's only reader and stateless; a combine read by more
    than one stage, or as a side input, keeps its own DataFrame.
    """
    return _only_stateless_reader(plan, node, NATIVE_COMBINE_URN)


def _only_stateless_reader(plan: Plan, node: PlannedStage, urn: str) -> bool:
    buffer = plan.buffers[node.input_buffer_id]
    return (
        buffer.urn == urn
        and buffer.main_readers == [node.name]
        and not buffer.side_readers
        and not node.stateful
    )


# 3. Stages reading their side inputs inline.


def reads_side_inputs_inline(plan: Plan, node: PlannedStage) -> bool:
    """Whether the stage reads its side inputs from its own input (one task, no extra job).

    It does when its main input is a few literal rows and every side input is written by a
    stage that merges combined groups: ``CombineGlobally``'s default value, read by a
    ``Map`` over ``Create([None])``, is the common case. Any other side input keeps the
    collect-and-broadcast job, so the stages computing it keep their parallelism.
    """
    if not node.side_inputs or node.stateful:
        return False
    if not all(_inline_side_buffer(plan, node, s.buffer_id) for s in node.side_inputs):
        return False
    rows = _literal_row_count(plan, node)  # decodes a Create's payload: checked last
    return rows is not None and rows <= INLINE_SIDE_INPUTS_MAX_MAIN_ROWS


def grouped_side_input_writer(plan: Plan, node: PlannedStage) -> PlannedStage | None:
    """The stage writing an inline-read stage's only side input, run in the stage's task.

    So where that writer groups its own input (``groups_in_stage``), reads no side input and
    writes nothing else: a ``CombineGlobally``'s merge, read by its default value's stage.
    """
    if len(node.side_inputs) != 1:
        return None
    writers = plan.buffers[node.side_inputs[0].buffer_id].writers
    if len(writers) != 1:
        return None
    writer = plan.stage(writers[0][0])
    if len(writer.outputs) != 1 or writer.side_inputs or not groups_in_stage(plan, writer):
        return None
    return writer


def _inline_side_buffer(plan: Plan, node: PlannedStage, buffer_id: bytes) -> bool:
    """Whether ``node`` alone reads the buffer, and only stages merging groups write it.

    Read by another stage too, the buffer would be computed once per reader.
    """
    buffer = plan.buffers[buffer_id]
    return (
        bool(buffer.writers)
        and not buffer.main_readers
        and set(buffer.side_readers) == {node.name}
        and all(_merges_combined_groups(plan, writer) for writer, _ in buffer.writers)
    )


def _literal_row_count(plan: Plan, node: PlannedStage) -> int | None:
    """How many rows the stage's main input has, if it is literal (Impulse, Create)."""
    buffer = plan.buffers[node.input_buffer_id]
    if buffer.kind == BufferKind.IMPULSE:
        return 1
    if buffer.kind == BufferKind.CREATE:
        return len(decode_create_payload(plan.components.transforms[buffer.name].spec.payload))
    return None


def _merges_combined_groups(plan: Plan, stage_name: str) -> bool:
    """Whether a stage reads a GroupByKey and merges combiner accumulators per key.

    Or reads a native combine's output: the combine's aggregation ran in Spark. Such a
    stage (the second half of a lifted ``CombinePerKey``) does little per key, so running
    all its partitions in one task costs little.
    """
    stage = plan.stage(stage_name)
    kind = plan.buffers[stage.input_buffer_id].kind
    if kind == BufferKind.NATIVE_COMBINE:
        return True  # the JVM merged them: the stage writes one element per key
    return kind == BufferKind.GROUP and any(
        transform.spec.urn == _MERGE_ACCUMULATORS_URN
        for transform in stage.descriptor.transforms.values()
    )


# 4. GroupByKeys of one key.


def has_one_key(node: PlannedBuffer, plan: Plan) -> bool:
    """Whether every writer keys its elements with None: a ``CombineGlobally``'s grouping.

    Beam's ``CombineGlobally`` keys each element with None (``KeyWithVoid``, a DoFn
    registered by URN) before its ``CombinePerKey``, whose lifted precombine may follow in
    the same stage. A key that is None encodes to the same bytes every time.
    """
    if not node.writers:
        return False
    for stage_name, index in node.writers:
        stage = plan.stage(stage_name)
        transforms = stage.descriptor.transforms
        write = transforms[stage.outputs[index].transform_id]
        producer = _producer(transforms, bi.only_element(list(write.inputs.values())))
        if producer is not None and producer.spec.urn == bi.PRECOMBINE_URN:
            producer = _producer(transforms, bi.only_element(list(producer.inputs.values())))
        if producer is None or producer.spec.urn not in bi.PAR_DO_URNS:
            return False
        payload = bi.beam_runner_api_pb2.ParDoPayload.FromString(producer.spec.payload)
        if payload.do_fn.urn != bi.KEY_WITH_NONE_DOFN_URN:
            return False
    return True


def _producer(transforms: Mapping[str, Any], pcollection: str) -> Any:
    """The transform of a stage that outputs ``pcollection`` (None: none of them)."""
    for transform in transforms.values():
        if pcollection in transform.outputs.values():
            return transform
    return None
