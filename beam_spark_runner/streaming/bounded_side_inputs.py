"""Bounded side inputs in a streaming run: computed once, before the query, and broadcast.

A stage whose side inputs are all bounded (computed from ``Create``, a bounded read, ...
under the Impulse) gets them computed in batch before the query starts, one Spark job per
side input, and shipped with the stage: a Spark broadcast for a stateless stage (run in a
router), inline (``spark.compat.InlineValue``) for a stateful or unbounded splittable DoFn,
whose ``transformWithState`` workers load no broadcasts. No shard then rewrites a copy in
its state every micro-batch. The computing stages leave the streaming graph, so only where
nothing else there needs them (a main input, a leaf that writes); otherwise the side input
streams (``streaming.side_inputs``).
"""

from __future__ import annotations

import dataclasses

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import Plan, PlannedStage

_BOUNDED = bi.beam_runner_api_pb2.IsBounded.BOUNDED


@dataclasses.dataclass(frozen=True)
class BroadcastPlan:
    """Which stages read broadcast side inputs, and which stages only compute those."""

    # Stages whose side inputs are all broadcast: they run as stateless stages.
    readers: frozenset[str]
    # Stages that only feed broadcast side inputs: computed in batch, not streamed.
    computed_in_batch: frozenset[str]


def _stage_is_candidate(plan: Plan, stage: PlannedStage) -> bool:
    return bool(stage.side_inputs) and all(
        plan.components.pcollections[side.pcollection_id].is_bounded == _BOUNDED
        for side in stage.side_inputs
    )


def _writers(plan: Plan, buffer_id: bytes) -> list[str]:
    return [writer for writer, _ in plan.buffers[buffer_id].writers]


def _upstream(plan: Plan, buffer_id: bytes) -> set[str]:
    """Every stage whose output reaches ``buffer_id`` (main and side inputs alike)."""
    seen: set[str] = set()
    pending = _writers(plan, buffer_id)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        stage = plan.stage(name)
        pending.extend(_writers(plan, stage.input_buffer_id))
        for side in stage.side_inputs:
            pending.extend(_writers(plan, side.buffer_id))
    return seen


def _has_inner_leaf(stage: PlannedStage) -> bool:
    """Whether a transform of the fused stage leads to none of the stage's outputs.

    Fusion puts a terminal step (a ``Map(print)``, a write) in the stage of its input: the
    stage then does more than compute its outputs, and must keep running.
    """
    transforms = stage.descriptor.transforms
    producers = {
        pcollection: transform_id
        for transform_id, transform in transforms.items()
        for pcollection in transform.outputs.values()
    }
    reaching: set[str] = set()
    pending = [output.transform_id for output in stage.outputs]
    while pending:
        transform_id = pending.pop()
        if transform_id in reaching:
            continue
        reaching.add(transform_id)
        pending.extend(
            producers[p] for p in transforms[transform_id].inputs.values() if p in producers
        )
    return any(
        transform_id not in reaching and not transform.subtransforms
        for transform_id, transform in transforms.items()
    )


def _needed(plan: Plan, readers: frozenset[str]) -> set[str]:
    """The stages the streaming graph runs when ``readers`` get their side inputs broadcast.

    A stage is needed if it is a leaf (nothing reads its outputs: it writes somewhere) or
    holds one (``_has_inner_leaf``), or if a needed stage reads one of its outputs as main
    input, or as a side input that is not broadcast.
    """
    stages = {stage.name: stage for stage in plan.stages}

    def output_readers(stage: PlannedStage) -> list[str]:
        out = []
        for output in stage.outputs:
            buffer = plan.buffers[output.buffer_id]
            out.extend(buffer.main_readers)
            out.extend(r for r in buffer.side_readers if r not in readers)
        return out

    def is_leaf(stage: PlannedStage) -> bool:
        return not any(
            plan.buffers[o.buffer_id].main_readers or plan.buffers[o.buffer_id].side_readers
            for o in stage.outputs
        )

    needed = {name for name, stage in stages.items() if is_leaf(stage) or _has_inner_leaf(stage)}
    changed = True
    while changed:
        changed = False
        for name, stage in stages.items():
            if name not in needed and any(r in needed for r in output_readers(stage)):
                needed.add(name)
                changed = True
    return needed


def plan_broadcasts(plan: Plan) -> BroadcastPlan:
    """The stages to give broadcast side inputs, and the stages that only compute them."""
    candidates = {stage.name for stage in plan.stages if _stage_is_candidate(plan, stage)}
    while True:
        readers = frozenset(candidates)
        needed = _needed(plan, readers)
        dropped = {
            name
            for name in candidates
            if any(
                _upstream(plan, side.buffer_id) & needed for side in plan.stage(name).side_inputs
            )
        }
        if not dropped:
            break
        candidates -= dropped
    computed = frozenset(stage.name for stage in plan.stages) - needed
    return BroadcastPlan(readers=readers, computed_in_batch=computed)
