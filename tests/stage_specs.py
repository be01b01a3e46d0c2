"""A StageSpec for one planned stage, as the fused-stage translator would ship it (minus
side inputs and state): what tests running a stage worker in-process need."""

from __future__ import annotations

from beam_spark_runner.execution.beam_globals import TaskEnvironment
from beam_spark_runner.execution.stage_worker import OutputSpec, StageSpec
from beam_spark_runner.planning import Plan, PlannedStage
from beam_spark_runner.streaming.topology import STAGE, Node, Topology


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


def one_stage_topology(spec: StageSpec, source: str) -> Topology:
    """A streaming topology of ``spec``'s stage alone, stateful, one shard, fed by ``source``."""
    node = Node(
        index=0,
        name=spec.name,
        kind=STAGE,
        stateful=True,
        step=1,
        targets=tuple(() for _ in spec.outputs),
        expected=frozenset([source]),
        main_expected=frozenset([source]),
    )
    return Topology((node,), {source: (0,)}, levels=1, shards=1, sink_producers=frozenset())
