"""An unbounded splittable DoFn's shard on ``state_cache``'s change log, without Spark.

The shard runs as ``streaming.levels`` runs it, against in-memory stand-ins for the level's
value and list state, beside the same batches through the value rewritten whole.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import NO_SINKS, StageSpec
from beam_spark_runner.planning import build_plan
from beam_spark_runner.streaming import state_cache
from beam_spark_runner.streaming.check import is_unbounded_splittable
from beam_spark_runner.streaming.compression import pack, unpack
from beam_spark_runner.streaming.rows import ELEMENT, PRODUCER, PTIME, WATERMARK
from beam_spark_runner.streaming.splittable import (
    PACKED_SHARE,
    SplittableShard,
    SplittableShardState,
)
from beam_spark_runner.streaming.watermarks import MAX_MICROS
from tests.stage_specs import one_stage_topology, stage_spec
from tests.streaming.memory_state import MemoryList as _List
from tests.streaming.memory_state import MemoryValue as _Value

_SOURCE = "source"
# The shard's output rows' watermark column (``rows.Row``).
_WATERMARK_COLUMN = 5
# What ``_Poll`` output in this process.
_POLLED: list[tuple[str, int]] = []


class _Offsets(beam.transforms.core.RestrictionProvider):  # type: ignore[misc]
    """An element (name, resume delay in s, offsets) has the offsets [0, offsets)."""

    def initial_restriction(self, element: Any) -> OffsetRange:
        return OffsetRange(0, element[2])

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: Any, restriction: OffsetRange) -> int:
        return int(restriction.size())


class _Poll(beam.DoFn):  # type: ignore[misc]
    """Claims one offset per call, then resumes after the element's delay: (name, offset).

    Its outputs are also kept in ``_POLLED``.
    """

    @beam.DoFn.unbounded_per_element()
    def process(
        self, element: Any, tracker: Any = beam.DoFn.RestrictionParam(_Offsets())
    ) -> Iterator[Any]:
        name, delay, _ = element
        restriction = tracker.current_restriction()
        if tracker.try_claim(restriction.start):
            _POLLED.append((name, restriction.start))
            yield name, restriction.start
            if restriction.start + 1 < restriction.stop:
                tracker.defer_remainder(Duration(seconds=delay))


def _spec() -> StageSpec:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    _ = pipeline | beam.Impulse() | beam.FlatMap(lambda _: []) | "Poll" >> beam.ParDo(_Poll())
    plan = build_plan(bi.prepare_pipeline_proto(pipeline.to_runner_api()), streaming=True)
    (stage,) = [s for s in plan.stages if is_unbounded_splittable(s)]
    return stage_spec(plan, stage, "splittable-log")


def _input_encoder(spec: StageSpec) -> Any:
    descriptor = bi.beam_fn_api_pb2.ProcessBundleDescriptor.FromString(spec.descriptor)
    port = bi.remote_grpc_port(descriptor.transforms[spec.input_transform_id].spec.payload)
    return bi.PipelineContext(descriptor).coders[port.coder_id].get_impl()


class _Shard:
    """One splittable shard's micro-batches: through the whole value, or logged.

    A logged shard's batches go round ``workers`` worker processes, each with its own cache,
    as Spark hands a task whichever idle worker comes first.
    """

    def __init__(self, spec: StageSpec, logged: bool, workers: int = 1) -> None:
        self.spec = spec
        self.encoder = _input_encoder(spec)
        self.topology = one_stage_topology(spec, _SOURCE)
        self.logged = logged
        self.whole: bytes | None = None
        self.value, self.log = _Value(), _List()
        self.key = (uuid.uuid4().hex, 0, 0)
        self.caches: list[Any] = [None] * workers
        self.batches = 0

    def rows(self, elements: list[tuple[str, int, int]], now: int) -> list[dict[str, Any]]:
        """(name, resume delay s, offsets) elements; the watermark and processing time (s)."""
        rows: list[dict[str, Any]] = []
        for element in elements:
            restriction = (OffsetRange(0, element[2]), None)
            value = ((element, restriction), float(element[2]))
            encoded = self.encoder.encode_nested(
                WindowedValue(value, Timestamp(0), [GlobalWindow()])
            )
            rows.append({ELEMENT: pack(encoded)})
        micros = MAX_MICROS if now >= MAX_MICROS else now * 1_000_000
        rows.append({ELEMENT: None, PRODUCER: _SOURCE, WATERMARK: micros, PTIME: micros})
        return rows

    def batch(self, elements: list[tuple[str, int, int]], now: int) -> tuple[list[Any], int]:
        """One micro-batch: its outputs, sorted, and its output watermark."""
        _POLLED.clear()
        shard = SplittableShard(self.spec, NO_SINKS)
        node, rows = self.topology.nodes[0], self.rows(elements, now)
        if not self.logged:
            self.whole, out = shard.run_encoded(self.topology, node, 0, self.whole, rows)
        else:
            worker = self.batches % len(self.caches)
            state_cache._CACHE.pop(self.key, None)
            if self.caches[worker] is not None:
                state_cache._CACHE[self.key] = self.caches[worker]
            out = state_cache.run_logged(
                shard,
                shard,
                self.value,
                self.log,
                self.key,
                self.topology,
                node,
                rows,
                PACKED_SHARE,
            )
            self.caches[worker] = state_cache._CACHE[self.key]
        self.batches += 1
        (marker,) = [row[_WATERMARK_COLUMN] for row in out if row[_WATERMARK_COLUMN] is not None]
        return sorted(_POLLED), marker

    @property
    def state(self) -> SplittableShardState:
        if not self.logged:
            assert self.whole is not None
            return SplittableShardState.decode(self.whole)
        state = self.caches[(self.batches - 1) % len(self.caches)].state
        assert isinstance(state, SplittableShardState)
        return state

    def read_back(self) -> SplittableShardState:
        """The state as a new worker reads it from the store (base and log)."""
        shard = SplittableShard(self.spec, NO_SINKS)
        state = state_cache._reload(shard, shard, self.log, self.key)
        assert isinstance(state, SplittableShardState)
        return state


def _script(seed: int) -> list[tuple[list[tuple[str, int, int]], int]]:
    """Batches a second apart: restrictions opening, resuming after 0-3 s, finishing."""
    draw = random.Random(seed)
    batches = []
    for now in range(1, 30):
        elements = [
            (f"e{now}-{i}", draw.randrange(4), draw.randrange(1, 6))
            for i in range(draw.randrange(3))
        ]
        batches.append((elements, now))
    return [*batches, ([], MAX_MICROS)]


def _kept(state: SplittableShardState) -> tuple[Any, ...]:
    """The residuals (their resume time to the second: the SDK's delay is measured from its
    clock) and the watermarks."""
    residuals = [(r.element, r.watermark, round(r.resume_at / 1e6)) for r in state.residuals]
    return residuals, state.watermarks


@pytest.fixture(scope="module")
def spec() -> StageSpec:
    return _spec()


@pytest.mark.parametrize("workers", [1, 3, 6])
def test_a_logged_shard_gives_the_outputs_and_residuals_of_the_whole_value(
    spec: StageSpec, workers: int
) -> None:
    whole, logged = _Shard(spec, logged=False), _Shard(spec, logged=True, workers=workers)
    outputs = 0
    for elements, now in _script(workers):
        expected = whole.batch(elements, now)
        outputs += len(expected[0])
        assert logged.batch(elements, now) == expected
        assert _kept(logged.state) == _kept(whole.state)
        assert _kept(logged.read_back()) == _kept(whole.state)
    assert outputs > 30


def test_a_logged_batch_run_again_after_a_failed_attempt_reads_the_store(
    spec: StageSpec,
) -> None:
    shard = _Shard(spec, logged=True)
    shard.batch([("a", 0, 5), ("b", 0, 5)], now=1)
    committed = (shard.value.value, list(shard.log.rows))
    first = shard.batch([], now=2)
    # Spark discards the attempt's writes; this process's cache holds the state after it.
    shard.value.value, shard.log.rows = committed
    reloads = state_cache.STATS.reloads
    assert shard.batch([], now=2) == first
    assert state_cache.STATS.reloads == reloads + 1
    assert first[0] == [("a", 1), ("b", 1)]


def test_a_logged_batch_writes_the_residuals_it_resumed_and_added_not_all(
    spec: StageSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_cache, "COMPACT_FRACTION", 100.0)  # no new base meanwhile
    shard = _Shard(spec, logged=True)
    # 1 000 open restrictions: one resumes every second, the others every 100 s.
    shard.batch([("often", 0, 10**6), *((f"e{i}", 100, 10**6) for i in range(999))], now=1)
    (base,) = shard.log.rows
    for now in range(2, 6):
        assert shard.batch([], now=now)[0] == [("often", now - 1)]
    assert shard.log.puts == 1 and shard.log.appends == 4
    # Before compression (these residuals' elements differ little, and compress 60 times).
    changes = [unpack(row[0][1:]) for row in shard.log.rows[1:]]
    assert max(map(len, changes)) * 100 < len(unpack(base[0][1:]))
    assert shard.read_back().residuals == shard.state.residuals


def test_a_value_written_whole_is_read_and_written_as_a_base(spec: StageSpec) -> None:
    whole = _Shard(spec, logged=False)
    whole.batch([("a", 0, 3), ("b", 5, 3)], now=1)
    assert len(whole.state.residuals) == 2
    shard = _Shard(spec, logged=True)
    assert whole.whole is not None
    shard.value.value = (pack(whole.whole),)
    assert shard.batch([], 2) == whole.batch([], 2)
    assert shard.log.puts == 1
    header = shard.value.value
    assert header is not None and header[0].startswith(state_cache._HEADER)
    for now in range(3, 13):
        assert shard.batch([], now) == whole.batch([], now)
    assert shard.state.residuals == whole.state.residuals == []


def test_a_batch_that_resumes_every_residual_writes_a_base_not_a_change(spec: StageSpec) -> None:
    """Its change holds every residual: logged, and kept in the header for a few batches,
    it would write more than the whole value does."""
    whole, shard = _Shard(spec, logged=False), _Shard(spec, logged=True)
    elements = [(f"e{i}", 0, 10**6) for i in range(300)]
    whole.batch(elements, now=1)
    shard.batch(elements, now=1)
    for now in range(2, 6):
        whole.batch([], now)
        shard.batch([], now)
        assert shard.log.puts == now and shard.log.appends == 0
        header = shard.value.value
        assert header is not None and state_cache._Header.decode(header[0]).recent == []
        assert whole.whole is not None
        assert len(shard.log.rows[0][0]) < 1.1 * len(pack(whole.whole))
