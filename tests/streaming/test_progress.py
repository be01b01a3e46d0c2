"""The streaming progress line and the falling-behind warning (no Spark)."""

from __future__ import annotations

import logging
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import build_plan
from beam_spark_runner.streaming.progress import (
    BEHIND_AFTER,
    Counts,
    ProgressPlan,
    ProgressReport,
    progress_plan,
)
from beam_spark_runner.streaming.watermarks import MAX_MICROS

GROUP = Counts("Count/CombinePerKey", (("s1", "p1"),), (("s2", "p2"),))
PLAN = ProgressPlan(
    nodes={1: GROUP, 3: Counts("Format -> Write", (("s2", "p2"),), (("s2", "p3"),))},
    sources=(Counts("Ticks", (("s0", "r"),), (("s1", "p1"),)),),
)
NOW = 1_700_000_000.0


def _progress(batch: int, millis: int) -> dict:
    return {
        "batchId": batch,
        "durationMs": {"triggerExecution": millis},
        "inputRowsPerSecond": 12.5,
        "processedRowsPerSecond": 40.0,
    }


def _report(plan: ProgressPlan = PLAN) -> ProgressReport:
    report = ProgressReport("wordcount", 0.0, plan)
    report.previous_at = 100.0
    return report


def test_the_line_gives_element_rates_of_the_sources_and_the_slowest_transform() -> None:
    report = _report()
    counts = {("s0", "r"): 2, ("s1", "p1"): 5000, ("s2", "p2"): 30, ("s2", "p3"): 30}
    line = report.line(
        _progress(7, 1500),
        # Shards of node 1 disagree: the node is as slow as its slowest shard.
        {"1#0": int(NOW * 1e6), "1#1": int((NOW - 4) * 1e6), "3#0": int((NOW - 1) * 1e6)},
        counts,
        at=110.0,
        wall=NOW,
    )
    assert line.startswith("Beam pipeline wordcount (streaming): micro-batch 7 took 1.5 s; ")
    assert "source 'Ticks' 500 elements/s out (0.2/s in)" in line
    assert "slowest transform 'Count/CombinePerKey' 500 elements/s in, 3.0/s out," in line
    assert "(4.0 s behind the clock)" in line
    assert "rows/s" not in line
    # The next line's rates are over the time since the last line.
    more = {**counts, ("s1", "p1"): 5010}
    line = report.line(None, {"1#0": int(NOW * 1e6)}, more, at=115.0, wall=NOW)
    assert "source 'Ticks' 2.0 elements/s out" in line
    assert "'Count/CombinePerKey' 2.0 elements/s in, 0.0/s out" in line


def test_the_line_before_any_batch() -> None:
    line = _report().line(None, {}, {}, at=101.0)
    assert line == (
        "Beam pipeline wordcount (streaming): no micro-batch completed yet; "
        "source 'Ticks' 0.0 elements/s out (0.0/s in)"
    )


def test_a_test_streams_event_time_is_not_compared_with_the_clock() -> None:
    plan = ProgressPlan(nodes={1: GROUP}, not_clock_time="event time from a TestStream")
    line = _report(plan).line(None, {"1#0": 10_000_000}, {}, at=101.0, wall=NOW)
    assert "watermark 1970-01-01T00:00:10Z (event time from a TestStream: no lag" in line
    assert "behind the clock)" in line and " s behind" not in line


def test_event_time_far_from_the_clock_has_no_lag() -> None:
    line = _report().line(None, {"1#0": 10_000_000}, {}, at=101.0, wall=NOW)
    assert "(event time far from the clock: no lag behind it)" in line


def test_a_watermark_at_infinity_says_done() -> None:
    line = _report().line(None, {"1#0": MAX_MICROS}, {}, at=101.0, wall=NOW)
    assert line.endswith("watermark +inf (done)")


def _plan_of(pipeline: beam.Pipeline) -> ProgressPlan:
    from beam_spark_runner.streaming.query import plan_topology

    pipeline.visit(bi.group_by_key_input_visitor(True))
    proto = bi.prepare_pipeline_proto(
        pipeline.to_runner_api(default_environment=bi.default_environment())
    )
    plan = build_plan(proto, streaming=True)
    return progress_plan(plan, plan_topology(plan, shards=2))


def test_nodes_and_sources_carry_the_users_transform_names() -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    now = time.time()
    _ = (
        pipeline
        | "Ticks" >> PeriodicImpulse(start_timestamp=now, stop_timestamp=now + 60)
        | "Key" >> beam.Map(lambda t: (int(t) % 3, 1))
        | beam.WindowInto(window.FixedWindows(5))
        | "Group" >> beam.GroupByKey()
        | "Show" >> beam.Map(str)
    )
    plan = _plan_of(pipeline)
    names = {counts.name for counts in plan.nodes.values()}
    assert "Group" in names, names
    assert not [n for n in names if "ref_" in n], names
    (source,) = plan.sources
    assert source.name == "Ticks" and source.outputs and source.inputs
    # The splittable DoFn's own output, not its fused stage's (a Precombine's, here).
    (stage,) = [c for c in plan.nodes.values() if c.inputs == source.inputs]
    assert not set(source.outputs) & set(stage.outputs)
    assert plan.not_clock_time is None
    group = next(c for c in plan.nodes.values() if c.name == "Group")
    # Counted where Beam counts them: the writing stage's output, the reading stage's input.
    assert group.inputs and group.outputs and group.inputs != group.outputs


def test_a_test_stream_is_a_source_whose_time_is_not_the_clocks() -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    _ = (
        pipeline
        | "Events" >> ScriptedStream().add_elements(["a"])
        | beam.Map(lambda word: (word, 1))
        | beam.WindowInto(window.FixedWindows(5))
        | "Group" >> beam.GroupByKey()
    )
    plan = _plan_of(pipeline)
    assert [s.name for s in plan.sources] == ["Events"]
    # A source's own watermark is named as the source, not by its buffer.
    (root,) = [key for key in plan.nodes if isinstance(key, str)]
    line = ProgressReport("p", 0.0, plan).line(None, {f"{root}": 5_000_000}, {})
    assert "slowest transform 'Events'" in line
    assert plan.not_clock_time == "event time from a TestStream"


def test_batches_over_the_interval_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    report = ProgressReport("wordcount", 1.0, PLAN)
    slow = [_progress(b, 2500) for b in range(BEHIND_AFTER)]
    with caplog.at_level(logging.WARNING):
        assert not report.falls_behind(slow[:-1])
        # The same progress seen again counts once.
        assert not report.falls_behind(slow[:-1])
        assert report.falls_behind(slow)
        assert report.falls_behind(slow)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot keep up" in warnings[0]
    # A batch within the interval resets the count.
    assert not report.falls_behind([*slow, _progress(BEHIND_AFTER, 500)])


def test_without_a_trigger_interval_nothing_falls_behind() -> None:
    report = ProgressReport("wordcount", 0.0, PLAN)
    assert not report.falls_behind([_progress(b, 60_000) for b in range(10)])
