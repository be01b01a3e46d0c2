"""Unbounded splittable DoFns in a streaming run (``streaming.splittable``)."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.io.restriction_trackers import OffsetRange
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_spark_runner.execution.stage_worker import NO_SINKS
from beam_spark_runner.streaming import state_cache
from beam_spark_runner.streaming.compression import pack
from beam_spark_runner.streaming.rows import (
    ELEMENT,
    FRAMED_RUN,
    PORT,
    PRODUCER,
    PTIME,
    WATERMARK,
)
from beam_spark_runner.streaming.splittable import SplittableSideInputShard
from tests.conftest import SPARK_TEST_MASTER
from tests.streaming.memory_state import MemoryList as _List
from tests.streaming.memory_state import MemoryValue as _Value
from tests.streaming.test_side_inputs import (
    MemoryWaitingStore,
    side_rows,
    side_stage,
)
from tests.unbounded_side_reader import OFFSETS, READ, UnboundedWithSide

# The marker's watermark in a shard's output row (``rows.Row``).
WATERMARK_COLUMN = 5

WINDOW = 5


@pytest.mark.parametrize(
    "runner",
    [
        "DirectRunner",
        pytest.param("SparkStructuredRunner", marks=[pytest.mark.spark, pytest.mark.slow]),
    ],
)
def test_a_splittable_dofn_reads_a_streamed_side_input_as_direct_runner_does(runner: str) -> None:
    """Its input elements wait for their side window; its residuals read it as they resume."""
    args = ["--streaming", f"--runner={runner}"]
    if runner != "DirectRunner":
        args.append(f"--spark_master={SPARK_TEST_MASTER}")
    with beam.Pipeline(options=PipelineOptions(args)) as pipeline:
        # Beam's slowly-updating form: a side value per window of WINDOW seconds.
        side = pipeline | "Side" >> PeriodicImpulse(0, 10, WINDOW, apply_windowing=True)
        read = (
            pipeline
            | "Main" >> PeriodicImpulse(0, 10, 1)
            | beam.WindowInto(window.FixedWindows(WINDOW))
            | "Unbounded" >> beam.ParDo(UnboundedWithSide(), beam.pvalue.AsSingleton(side))
            | beam.MapTuple(lambda at, offset, value: (float(at), offset, float(value)))
        )
        assert_that(
            read,
            equal_to(
                [
                    (float(at), offset, float(at // WINDOW * WINDOW))
                    for at in range(10)
                    for offset in range(OFFSETS)
                ]
            ),
        )


@pytest.mark.parametrize("workers", [None, 1, 2])
def test_input_elements_wait_for_their_side_window_and_residuals_keep_it(
    workers: int | None, monkeypatch: Any
) -> None:
    """On the value rewritten whole (``workers`` None) or on ``state_cache``'s change log,
    each batch in the next of ``workers`` caches."""
    spec, node, topology, _, side, main = side_stage(
        lambda main, side: main | beam.ParDo(UnboundedWithSide(), side),
        window.FixedWindows(WINDOW),
        splittable=True,
    )
    store = MemoryWaitingStore()
    value: bytes | None = None
    # The log kept and changes in the header, however small the state.
    monkeypatch.setattr(state_cache, "COMPACT_FRACTION", 100.0)
    monkeypatch.setattr(state_cache, "RECENT_SHARE", 100.0)
    log, value_state, key = _List(), _Value(), (uuid.uuid4().hex, node.index, 0)
    caches: list[Any] = [None] * (workers or 1)
    batches = 0
    READ.clear()

    def batch(mains: list[int], sides: list[int], marks: dict[str, int]) -> int:
        """One micro-batch: elements (at t s, restriction [0, OFFSETS)); the output watermark."""
        nonlocal value
        rows = side_rows(main.get_impl(), side, [], sides, marks)
        framed = b"".join(
            struct.pack(">I", len(e)) + e
            for e in (
                main.get_impl().encode_nested(
                    WindowedValue(
                        ((float(t), (OffsetRange(0, OFFSETS), None)), float(OFFSETS)),
                        Timestamp(t),
                        [IntervalWindow(t // WINDOW * WINDOW, t // WINDOW * WINDOW + WINDOW)],
                    )
                )
                for t in mains
            )
        )
        if mains:
            rows.append({ELEMENT: pack(framed), PORT: FRAMED_RUN})
        shard = SplittableSideInputShard(spec, NO_SINKS, store)
        if workers is None:
            value, out = shard.run_encoded(topology, node, 0, value, rows)
        else:
            nonlocal batches
            slot, batches = batches % workers, batches + 1
            state_cache._CACHE.pop(key, None)
            if caches[slot] is not None:
                state_cache._CACHE[key] = caches[slot]
            # Without ``PACKED_SHARE``: every change logged, however small the state.
            out = state_cache.run_logged(shard, shard, value_state, log, key, topology, node, rows)
            caches[slot] = state_cache._CACHE[key]
            value = shard.encode(caches[slot].state)
        (marker,) = [row[WATERMARK_COLUMN] for row in out if row[WATERMARK_COLUMN] is not None]
        return int(marker)

    # No side value for [0, 5) yet: the element waits, holding the output watermark.
    assert batch([1], [], {"main": 0, "side": 0}) == 0
    assert batch([], [], {"main": 20, "side": 0}) == 1_000_000
    assert READ == []
    # Its side window is done: it runs, and defers the rest of its restriction.
    batch([], [0], {"main": 20, "side": 5})
    assert READ == [(1.0, 0, 0.0)]
    # The main input's watermark is past [0, 5), but the residual still reads it.
    batch([], [], {"main": 20, "side": 5})
    batch([], [], {"main": 20, "side": 5})
    assert READ == [(1.0, offset, 0.0) for offset in range(OFFSETS)]
    # No residual left: the window is forgotten, the output watermark is the main input's.
    assert batch([], [], {"main": 20, "side": 5}) == 20_000_000
    state = SplittableSideInputShard(spec, NO_SINKS, store).decode(value)
    assert (state.residuals, state.side_elements(0)) == ([], [])
    if workers is not None:
        assert sum(row[0][:1] == b"C" for row in log.rows) == batches - 1
        shard = SplittableSideInputShard(spec, NO_SINKS, store)
        assert shard.encode(state_cache._reload(shard, shard, log, key)) == value


def test_residuals_in_the_global_window_read_the_side_inputs_latest_firing() -> None:
    spec, node, topology, _, side, main = side_stage(
        lambda main, side: main | beam.ParDo(UnboundedWithSide(), side),
        window.GlobalWindows(),
        splittable=True,
    )
    store = MemoryWaitingStore()
    value: bytes | None = None
    READ.clear()

    def batch(mains: list[int], firing: tuple[int, float] | None) -> None:
        """One micro-batch: elements at t s; the side input's firing (pane index, value)."""
        nonlocal value
        rows: list[dict[str, Any]] = [
            {ELEMENT: None, PRODUCER: p, WATERMARK: 0, PTIME: 0} for p in ("main", "side")
        ]
        if firing is not None:
            index, fired = firing
            pane = PaneInfo(index == 0, False, PaneInfoTiming.EARLY, index, -1)
            encoded = side.encode_nested(WindowedValue(fired, Timestamp(0), [GlobalWindow()], pane))
            rows.append({ELEMENT: pack(encoded), PORT: 1})
        framed = b"".join(
            struct.pack(">I", len(e)) + e
            for e in (
                main.get_impl().encode_nested(
                    WindowedValue(
                        ((float(t), (OffsetRange(0, OFFSETS), None)), float(OFFSETS)),
                        Timestamp(t),
                        [GlobalWindow()],
                    )
                )
                for t in mains
            )
        )
        if mains:
            rows.append({ELEMENT: pack(framed), PORT: FRAMED_RUN})
        shard = SplittableSideInputShard(spec, NO_SINKS, store)
        value, _ = shard.run_encoded(topology, node, 0, value, rows)

    batch([1], None)
    assert READ == []  # the global window has had no firing yet
    batch([], (0, 100.0))
    # A later firing replaces the earlier one: the residuals read it as they resume.
    batch([], (1, 200.0))
    batch([], None)
    assert READ == [(1.0, 0, 100.0), (1.0, 1, 200.0), (1.0, 2, 200.0)]
