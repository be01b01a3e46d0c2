"""Which bounded side inputs a streaming run computes once and broadcasts (no Spark)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as ScriptedStream

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import Plan, build_plan
from beam_spark_runner.streaming.bounded_side_inputs import plan_broadcasts


def _plan(pipeline: beam.Pipeline) -> Plan:
    proto = bi.prepare_pipeline_proto(
        pipeline.to_runner_api(default_environment=bi.default_environment())
    )
    return build_plan(proto, streaming=True)


def _display(plan: Plan, names: frozenset[str]) -> set[str]:
    return {plan.stage(name).display_name for name in names}


def _stream(pipeline: beam.Pipeline) -> beam.PCollection:
    return pipeline | ScriptedStream().add_elements(["a", "b"]) | "Upper" >> beam.Map(str.upper)


def test_a_side_input_only_a_side_input_needs_is_computed_in_batch() -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    table = pipeline | "Table" >> beam.Create([("A", 1)]) | "Swap" >> beam.Map(lambda kv: kv)
    _ = _stream(pipeline) | "Join" >> beam.Map(
        lambda key, lookup: (key, lookup.get(key)), lookup=beam.pvalue.AsDict(table)
    )
    plan = _plan(pipeline)
    broadcasts = plan_broadcasts(plan)
    (reader,) = broadcasts.readers
    assert "Join" in plan.stage(reader).display_name
    computed = " ".join(_display(plan, broadcasts.computed_in_batch))
    assert "Table" in computed and "Swap" in computed
    assert "Join" not in computed and "Upper" not in computed
    from beam_spark_runner.streaming.query import plan_topology

    topology = plan_topology(plan, 2, broadcasts)
    assert {node.name for node in topology.nodes}.isdisjoint(broadcasts.computed_in_batch)
    join = topology.node_of(reader)
    assert not join.stateful and join.side_expected == ()


def test_a_side_input_whose_source_also_feeds_the_stream_keeps_streaming() -> None:
    # The Create's stage also writes somewhere (a leaf): computing the side input in batch
    # would run that user code twice.
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    table = pipeline | "Table" >> beam.Create([("A", 1)]) | "Swap" >> beam.Map(lambda kv: kv)
    _ = table | "Print" >> beam.Map(print)
    _ = _stream(pipeline) | "Join" >> beam.Map(
        lambda key, lookup: (key, lookup.get(key)), lookup=beam.pvalue.AsDict(table)
    )
    broadcasts = plan_broadcasts(_plan(pipeline))
    assert broadcasts.readers == frozenset()
    assert broadcasts.computed_in_batch == frozenset()


def test_an_unbounded_side_input_keeps_streaming() -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    stream = _stream(pipeline)
    _ = stream | "Join" >> beam.Map(lambda x, side: (x, side), side=beam.pvalue.AsList(stream))
    broadcasts = plan_broadcasts(_plan(pipeline))
    assert broadcasts.readers == frozenset()
    assert broadcasts.computed_in_batch == frozenset()
