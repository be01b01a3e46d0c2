"""The state benchmark's pure parts: a tick's elements, the batches measured, the table."""

from __future__ import annotations

import apache_beam as beam

from benchmarks.state import (
    PREFILL_RATE,
    SIDE_PER_TICK,
    TICK_SECONDS,
    StateTrial,
    _Elements,
    _measured,
    build,
    markdown_table,
    prefill_ticks,
)


def test_the_prefill_puts_every_key_once_then_ticks_draw_the_rate() -> None:
    keys, start = 12_345, 1000.0
    elements = _Elements(start, keys, per_tick=50)
    ticks = prefill_ticks(keys)
    assert ticks == -(-keys // round(PREFILL_RATE * TICK_SECONDS))
    prefill = [k for t in range(ticks) for k, _ in elements.process(start + t * TICK_SECONDS)]
    assert prefill == list(range(keys))
    later = list(elements.process(start + (ticks + 3) * TICK_SECONDS))
    assert len(later) == 50 and all(0 <= k < keys for k, _ in later)
    # The same tick draws the same keys (a re-run micro-batch is the same).
    assert later == list(elements.process(start + (ticks + 3) * TICK_SECONDS))


def _progress(at: str, seconds: float | None) -> dict[str, object]:
    duration = {} if seconds is None else {"triggerExecution": seconds * 1000}
    return {"timestamp": at, "durationMs": duration, "numInputRows": 10}


def test_measured_batches_leave_out_idle_reports_the_first_two_and_the_prefill() -> None:
    progress = [
        _progress("2026-01-01T00:00:00.000Z", 30.0),
        _progress("2026-01-01T00:00:30.000Z", 2.0),
        _progress("2026-01-01T00:00:32.000Z", None),
        _progress("2026-01-01T00:00:34.000Z", 1.0),
        _progress("2026-01-01T00:00:36.000Z", 1.0),
    ]
    start = 1767225600.0  # 2026-01-01T00:00:00Z
    assert [p["timestamp"] for p in _measured(progress, start)] == [
        "2026-01-01T00:00:34.000Z",
        "2026-01-01T00:00:36.000Z",
    ]
    assert _measured(progress, start + 35) == [progress[-1]]


def test_the_table_reports_medians_and_memory() -> None:
    trial = StateTrial(1000, 5000, [(100, 0.5, 2048), (100, 0.7, 4096), (100, 0.6, 1024)])
    trial.jvm_peak_rss_mib, trial.python_workers_peak_rss_mib = 700.4, 300.6
    summary = trial.summary()
    assert summary["median_batch_s"] == 0.6 and summary["median_checkpoint_kib"] == 2.0
    table = markdown_table([trial, StateTrial(2_000_000, 5000, [], error="boom")])
    assert "| global | 1000 | 5000 | 3 | 0.6 | 2.0 | None | 700 | 301 | 0 | None |" in table
    assert "boom" in table


def test_the_stateful_pipeline_counts_per_key_in_user_state_without_a_group() -> None:
    pipeline = beam.Pipeline()
    build(pipeline, 1000.0, 1010.0, keys=10, rate=100, pipeline_name="stateful")
    transforms = pipeline.to_runner_api().components.transforms.values()
    (count,) = [t for t in transforms if t.unique_name == "Count"]
    payload = beam.portability.api.beam_runner_api_pb2.ParDoPayload.FromString(count.spec.payload)
    assert list(payload.state_specs) == ["count"]
    assert not [t for t in transforms if "GroupByKey" in t.unique_name]


def test_the_side_values_give_every_key_one_then_a_few_a_tick() -> None:
    keys, start = 12_345, 1000.0
    values = _Elements(start, keys, SIDE_PER_TICK, side=True)
    ticks = prefill_ticks(keys)
    prefill = [k for t in range(ticks) for k, _ in values.process(start + t * TICK_SECONDS)]
    assert prefill == list(range(keys))
    later = list(values.process(start + (ticks + 3) * TICK_SECONDS))
    assert len(later) == SIDE_PER_TICK and all(0 <= k < keys for k, _ in later)
    assert {value for _, value in later} == {ticks + 3}, "a side value is the tick's index"


def test_the_side_pipeline_reads_a_grouped_multimap_side_input() -> None:
    pipeline = beam.Pipeline()
    build(pipeline, 1000.0, 1010.0, keys=10, rate=100, pipeline_name="side")
    transforms = pipeline.to_runner_api().components.transforms.values()
    (lookup,) = [t for t in transforms if t.unique_name == "Lookup"]
    payload = beam.portability.api.beam_runner_api_pb2.ParDoPayload.FromString(lookup.spec.payload)
    (side,) = payload.side_inputs.values()
    assert side.access_pattern.urn == "beam:side_input:multimap:v1"
