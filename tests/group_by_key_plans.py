"""A one-GroupByKey pipeline, planned: what grouping tests build their GroupSpec from."""

from __future__ import annotations

import typing

import apache_beam as beam

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import Plan, build_plan


class PlannedGroupByKey(typing.NamedTuple):
    plan: Plan
    input_pcoll: str
    output_pcoll: str
    components: bytes  # what a GroupSpec carries: coders, windowing, environments
    buffer_id: bytes


def plan_group_by_key(
    kv_type: typing.Any = None, windowing: beam.WindowInto | None = None
) -> PlannedGroupByKey:
    """Plans Create | Map(x -> (x, x)) [| windowing] | GroupByKey, typed as ``kv_type``."""
    p = beam.Pipeline()
    pairs = beam.Map(lambda x: (x, x))
    if kv_type is not None:
        pairs = pairs.with_output_types(kv_type)
    pcoll = p | beam.Create([1]) | pairs
    if windowing is not None:
        pcoll = pcoll | windowing
    _ = pcoll | beam.GroupByKey()
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    plan = build_plan(proto)
    (buffer,) = [b for b in plan.buffers.values() if b.kind == "group"]
    transform = plan.components.transforms[buffer.name]
    (input_pcoll,) = transform.inputs.values()
    (output_pcoll,) = transform.outputs.values()
    components = bi.beam_runner_api_pb2.Components(
        coders=dict(plan.components.coders.items()),
        windowing_strategies=dict(plan.components.windowing_strategies.items()),
        environments=dict(plan.components.environments.items()),
    )
    return PlannedGroupByKey(
        plan, input_pcoll, output_pcoll, components.SerializeToString(), buffer.buffer_id
    )
