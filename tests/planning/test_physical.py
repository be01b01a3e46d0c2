"""Physical planning (``planning.physical``): how each stage runs, decided once and printed."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.transforms.userstate import BagStateSpec

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import BufferKind, Plan, StageInput, build_plan
from beam_spark_runner.rewrites.native_create import NativeCreateOverride


class _Stateful(beam.DoFn):  # type: ignore[misc]
    BAG = BagStateSpec("bag", VarIntCoder())

    def process(self, kv: Any, bag: Any = beam.DoFn.StateParam(BAG)) -> Iterator[Any]:
        yield kv


def _plan() -> Plan:
    """A small pipeline with one stage of each decision."""
    p = beam.Pipeline()
    table = p | "Table" >> beam.Create([(1, 2)])
    nums = p | "Nums" >> beam.Create([1, 2, 3])
    looked = nums | "Look up" >> beam.Map(lambda k, d: d.get(k, 0), d=beam.pvalue.AsDict(table))
    looked | "Total" >> beam.CombineGlobally(sum)
    pairs = nums | "Pair" >> beam.Map(lambda x: (x % 2, x))
    pairs | "Sum" >> beam.CombinePerKey(sum)
    pairs | "Stateful" >> beam.ParDo(_Stateful())
    p.replace_all([NativeCreateOverride()])
    proto = p.to_runner_api(default_environment=bi.default_environment())
    return build_plan(bi.prepare_pipeline_proto(proto), native_combines=True)


def _line(lines: list[str], transform: str) -> str:
    (line,) = [line for line in lines if transform in line.split("]:")[0]]
    return line


def test_the_printed_plan_names_each_decision() -> None:
    lines = _plan().describe()
    assert "runs on the driver" in _line(lines, "Table/Map(decode)")
    assert "key-sorted input" in _line(lines, "Stateful")
    assert "combines in stage" in _line(lines, "Sum/Read")
    assert "fused with its GroupByKey" in _line(lines, "Total/CombinePerKey/Merge")
    inline = _line(lines, "Total/InjectDefault")
    assert "reads side inputs inline" in inline
    assert "runs its side input's stage [Total/CombinePerKey/Merge" in inline
    assert "GroupByKey Total/CombinePerKey/Group: one key, one partition" in lines


def test_every_stage_has_one_recorded_decision() -> None:
    plan = _plan()
    assert set(plan.physical.stages) == {stage.name for stage in plan.stages}
    inputs = {plan.strategy(stage.name).input for stage in plan.stages}
    assert inputs == set(StageInput)


def test_build_plan_logs_the_physical_plan_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="beam_spark_runner.planning.assembly")
    _plan()
    assert "Physical plan:" in caplog.text
    assert "fused with its GroupByKey" in caplog.text


def test_a_stage_writing_a_native_combine_does_not_run_on_the_driver() -> None:
    # Its typed value columns are written by its Spark task only.
    p = beam.Pipeline()
    pairs = p | "Nums" >> beam.Create([1, 2, 3]) | "Pair" >> beam.Map(lambda x: (x % 2, x))
    pairs | "Sum" >> beam.CombinePerKey(sum)
    main = p | "Main" >> beam.Create([0, 1])
    main | "Look up" >> beam.Map(lambda k, d: d.get(k), d=beam.pvalue.AsDict(pairs))
    p.replace_all([NativeCreateOverride()])
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    plan = build_plan(proto, native_combines=True)
    (writer,) = [s for s in plan.stages if "Pair" in s.user_transform_names]
    assert any(plan.buffers[o.buffer_id].kind == BufferKind.NATIVE_COMBINE for o in writer.outputs)
    assert not plan.strategy(writer.name).on_driver
    assert plan.physical.driver_writers == {}
