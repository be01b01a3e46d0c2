"""Watermarks per transform: one shard's bookkeeping (no Spark)."""

from __future__ import annotations

import pytest

from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
    MIN_MICROS,
    Marker,
    WatermarkState,
    input_watermark,
    producer_id,
)


def test_input_watermark_is_the_minimum_over_expected_producers() -> None:
    assert input_watermark({"a", "b"}, {"a": 5, "b": 3}) == 3
    # A producer not heard from holds the input at -inf.
    assert input_watermark({"a", "b"}, {"a": 5}) == MIN_MICROS
    # Nothing upstream: the input is done.
    assert input_watermark(set(), {}) == MAX_MICROS


def test_a_shard_advances_on_markers_and_never_goes_back() -> None:
    state = WatermarkState(expected=frozenset({"src", producer_id(2, 0)}))
    assert state.advance([Marker("src", 10, 100)]) == MIN_MICROS
    assert state.advance([Marker("2#0", 7, 90)]) == 7
    assert state.processing_time == 100
    # A producer repeating an older watermark does not move the input back.
    assert state.advance([Marker("src", 4, 80), Marker("2#0", 12, 95)]) == 10
    assert state.processing_time == 100


def test_output_is_held_by_the_shards_holds_and_is_monotonic() -> None:
    state = WatermarkState(expected=frozenset({"src"}))
    state.advance([Marker("src", 50, 0)])
    assert state.output(hold=20) == 20
    assert state.output() == 50
    # A hold behind what was already said does not move the output back.
    assert state.output(hold=30) == 50


def test_a_marker_from_an_unexpected_producer_is_a_planning_bug() -> None:
    state = WatermarkState(expected=frozenset({"src"}))
    with pytest.raises(ValueError, match="Expected markers from \\['src'\\], got one from 'x'"):
        state.advance([Marker("x", 1, 1)])


def test_the_bounds_are_beams_minimum_and_maximum_timestamps() -> None:
    # Written out in watermarks.py, which the streaming source imports without Beam.
    from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP

    from beam_spark_runner.streaming.watermarks import MAX_MICROS, MIN_MICROS

    assert (MIN_MICROS, MAX_MICROS) == (MIN_TIMESTAMP.micros, MAX_TIMESTAMP.micros)
