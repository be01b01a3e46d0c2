"""A StageSpec for one planned stage, as the fused-stage translator would ship it (minus
side inputs and state): what tests running a stage worker in-process need."""

from __future__ import annotations

from beam_spark_runner.execution.beam_globals import TaskEnvironment
from beam_spark_runner.execution.stage_worker import OutputSpec, StageSpec
from beam_spark_runner.planning import Plan, PlannedStage


def stage_spec(plan: Plan, stage: PlannedStage, run_id: str, keyed: bool = True) -> StageSpec:
    """``stage``'s spec; with ``keyed``, outputs bound for a GroupByKey compute keys."""
    return StageSpec(
        environment=TaskEnvironment(run_id),
        name=stage.name,
        display_name=stage.display_name,
        descriptor=stage.descriptor.SerializeToString(),
        input_transform_id=stage.input_transform_id,
        outputs=tuple(
            OutputSpec(
                o.transform_id,
                plan.safe_coders.get(o.coder_id, o.coder_id)
                if keyed and plan.is_keyed(o.buffer_id)
                else None,
            )
            for o in stage.outputs
        ),
    )
