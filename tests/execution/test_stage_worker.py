"""A fused stage run in process, without Spark: bundles, outputs and bundle finalization."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa
import pytest

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import stage_cache
from beam_spark_runner.execution.stage_worker import (
    BUNDLE_SAMPLING_PERIOD_MS,
    ELEMENT,
    StageSpec,
    run_stage,
)
from beam_spark_runner.planning import build_plan
from tests.stage_specs import stage_spec

FINALIZED: list[int] = []


class Finalizing(beam.DoFn):
    """Registers a bundle finalization callback that records the element it saw."""

    def process(
        self, element: bytes, finalizer: typing.Any = beam.DoFn.BundleFinalizerParam
    ) -> Iterator[tuple[int, int]]:
        finalizer.register(lambda: FINALIZED.append(1))
        yield 1, 1


def finalizing_stage(run_id: str) -> StageSpec:
    p = beam.Pipeline()
    _ = p | beam.Impulse() | beam.ParDo(Finalizing()) | beam.GroupByKey()
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    (stage,) = [s for s in plan.stages if any("Finalizing" in n for n in s.user_transform_names)]
    return stage_spec(plan, stage, run_id, keyed=False)


def impulse_batches(count: int, fail_after: int | None = None) -> Iterator[pa.RecordBatch]:
    for index in range(count):
        if fail_after is not None and index == fail_after:
            raise RuntimeError("the task fails while reading its input")
        yield pa.RecordBatch.from_arrays(
            [pa.array([bi.ENCODED_IMPULSE_VALUE], type=pa.binary())], names=[ELEMENT]
        )


def test_a_bundle_is_finalized_only_after_spark_took_its_output() -> None:
    FINALIZED.clear()
    task = run_stage(finalizing_stage("finalize-ok"), impulse_batches(2))
    first = next(task)  # bundle 1's output, handed to "Spark"
    assert first.num_rows == 1
    assert FINALIZED == [], "finalized before its output was handed over"
    second = next(task)  # asking for more: bundle 1 is finalized, then bundle 2 runs
    assert FINALIZED == [1]
    assert second.num_rows == 1
    assert list(task) == []
    assert FINALIZED == [1, 1]


def test_a_failed_task_does_not_finalize_bundles_it_did_not_hand_over() -> None:
    FINALIZED.clear()
    spec = finalizing_stage("finalize-fail")
    task = run_stage(spec, impulse_batches(3, fail_after=1))
    assert next(task).num_rows == 1  # bundle 1 handed over
    with pytest.raises(RuntimeError, match="fails while reading"):
        next(task)  # bundle 1 finalized, then the input fails
    assert FINALIZED == [1]
    # A bundle whose output Spark never asked for is dropped, never finalized, when the
    # worker runs its next task.
    FINALIZED.clear()
    abandoned = run_stage(spec, impulse_batches(2))
    next(abandoned)
    abandoned.close()  # the task is killed before it asks for more
    list(run_stage(spec, impulse_batches(1)))
    assert FINALIZED == [1]


def test_bundles_of_a_stage_worker_sample_every_20_ms_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apache_beam.runners.worker import statesampler
    from apache_beam.utils import counters

    # A bundle's end waits out its sampler's sleep: Beam's default of up to 200 ms would be
    # on every task's critical path.
    made: list[typing.Any] = []

    class Recorded(statesampler.StateSampler):  # type: ignore[misc]
        def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    # Beam's own default, however an earlier test left it.
    init = statesampler.StateSampler.__init__
    monkeypatch.setattr(init, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))
    monkeypatch.setattr(statesampler, "StateSampler", Recorded)
    list(run_stage(finalizing_stage("sampling-run"), impulse_batches(1)))
    assert made and {s.sampling_period_ms for s in made} == {BUNDLE_SAMPLING_PERIOD_MS} == {20}
    # Beam's default is Beam's again for every other bundle processor of the process.
    probe = statesampler.StateSampler("probe", counters.CounterFactory())
    assert probe.sampling_period_ms == statesampler.DEFAULT_SAMPLING_PERIOD_MS == 200


def test_a_task_of_an_empty_partition_sets_up_no_stage_worker() -> None:
    # A GroupByKey whose keys all hash to one partition leaves the others empty (every
    # assert_that's grouping): their tasks return at once instead of building the stage's
    # DoFns and Beam's bundle processor for nothing.
    spec = finalizing_stage("empty-partition")
    empty = pa.RecordBatch.from_arrays([pa.array([], type=pa.binary())], names=[ELEMENT])
    assert list(run_stage(spec, iter([]))) == []
    assert list(run_stage(spec, iter([empty]))) == []
    assert spec.cache_key not in stage_cache._WORKERS
    assert sum(batch.num_rows for batch in run_stage(spec, impulse_batches(1))) == 1
    assert spec.cache_key in stage_cache._WORKERS
