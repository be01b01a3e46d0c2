"""Waiting main elements of a streaming stage with side inputs, without Spark."""

from __future__ import annotations

import pickle

import pytest
from apache_beam.coders import coders
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner.spark_compat import pyspark_version
from beam_spark_runner.streaming.check import STREAMING_SPARK

if pyspark_version() < STREAMING_SPARK:
    pytest.skip(
        "streaming runs need PySpark 4.1+ (transformWithState on rows); this is older",
        allow_module_level=True,
    )

from beam_spark_runner.streaming import side_inputs  # noqa: E402
from beam_spark_runner.streaming.watermarks import WatermarkState  # noqa: E402

SECOND = 1_000_000


def _coders() -> side_inputs._Coders:
    """The stage's coders for int elements in interval windows, one side input mapped 1:1."""
    made = side_inputs._Coders.__new__(side_inputs._Coders)
    made.input_impl = coders.WindowedValueCoder(
        coders.VarIntCoder(), coders.IntervalWindowCoder()
    ).get_impl()
    made.mappings = [lambda w: w]
    made._needs = {}
    return made


def test_neighbours_with_the_same_needs_wait_as_one_run() -> None:
    made = _coders()
    a, b = IntervalWindow(0, 10), IntervalWindow(10, 20)
    elements = [(1, 3, a), (2, 1, a), (3, 12, b), (4, 5, a)]
    encoded = [
        made.input_impl.encode_nested(WindowedValue(v, Timestamp(t), [w])) for v, t, w in elements
    ]
    runs = list(made.main_runs(b"".join(encoded)))
    need_a, need_b = (a.max_timestamp().micros,), (b.max_timestamp().micros,)
    assert runs == [
        (encoded[0] + encoded[1], 1 * SECOND, need_a),
        (encoded[2], 12 * SECOND, need_b),
        (encoded[3], 5 * SECOND, need_a),
    ]
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    for run in runs:
        state.wait(*run)
    # One bucket per needs, its earliest timestamp the hold.
    assert state.buckets == {
        need_a: [[encoded[0] + encoded[1], encoded[3]], 1 * SECOND],
        need_b: [[encoded[2]], 12 * SECOND],
    }


def test_a_state_written_before_buckets_is_read() -> None:
    old = side_inputs.SideInputShardState(
        WatermarkState(expected=frozenset()), [[b"side"]], waiting=[(b"x", 5, (9,))]
    )
    del old.__dict__["buckets"]  # as an earlier runner version pickled it
    state = side_inputs.SideInputShardState.decode(pickle.dumps(old))
    assert state.buckets == {}
    assert state.waiting == [(b"x", 5, (9,))]
    assert state.sides == [[b"side"]]
