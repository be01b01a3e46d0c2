"""Windowed Beam rows made from Arrow columns (``coders.row_values``): the pieces the
comparison with Beam's decoding (``test_spark_stream_read``) does not single out."""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pytest
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PANE_INFO_UNKNOWN

from beam_spark_runner.coders.row_values import RowValues, _micros_instants, _plain, _tuple_maker

Pair = collections.namedtuple("Pair", ["a", "b"])


class Typed(NamedTuple):
    a: int
    b: str


class Checked(tuple):  # type: ignore[type-arg]
    """A row type whose constructor does more than ``tuple.__new__``."""

    made = 0

    def __new__(cls, a: Any, b: Any) -> Checked:
        Checked.made += 1
        return super().__new__(cls, (a, b))


@pytest.mark.parametrize("row_type", [Pair, Typed])
def test_named_tuples_are_made_as_their_constructor_makes_them(row_type: Any) -> None:
    fields = [(1, "x"), (2, None)]
    made = list(_tuple_maker(row_type)(fields))
    assert made == [row_type(*f) for f in fields]
    assert all(type(row) is row_type for row in made)
    assert made[0].a == 1 and made[1].b is None


def test_other_row_types_are_called() -> None:
    Checked.made = 0
    made = list(_tuple_maker(Checked)([(1, "x"), (2, "y")]))
    assert Checked.made == 2
    assert made == [(1, "x"), (2, "y")] and all(type(row) is Checked for row in made)


def test_instants_with_and_without_nulls() -> None:
    full = pa.array([0, 1_500_000], pa.timestamp("us", tz="UTC"))
    assert _micros_instants(full) == [Timestamp(micros=0), Timestamp(micros=1_500_000)]
    holes = pa.array([None, -7], pa.timestamp("us"))
    assert _micros_instants(holes) == [None, Timestamp(micros=-7)]


@pytest.mark.parametrize(
    "micros",
    [[], [5], [5, 5], [1, 2, 2, 2, 3], [7, 7, 7, 7, 1, 1], [1, 2, 3], [3, 3, 2, 3], [1_000] * 300],
)
def test_rows_stamped_alike_share_one_instant_equal_to_beams(micros: list[int]) -> None:
    """A run of equal times (Spark's ``rate`` source stamps rows in milliseconds) gets one
    ``Timestamp``, made once; every row's equals the one Beam makes, in order."""
    made = _micros_instants(pa.array(micros, pa.timestamp("us", tz="UTC")))
    assert made == [Timestamp(micros=m) for m in micros]
    runs = [i for i in range(len(micros)) if i == 0 or micros[i] != micros[i - 1]]
    if 2 * len(runs) <= len(micros):
        assert len({id(t) for t in made}) == len(runs)


def test_a_batch_and_its_event_times_must_be_as_many() -> None:
    maker = RowValues(["a", "b"], [_plain, _plain], [False, True])
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1, 2], pa.int64()), pa.array(["x", None], pa.string())], names=["a", "b"]
    )
    windows = (GlobalWindow(),)
    made = maker.make(batch, np.array([5_000, 6_000]), Pair, windows, PANE_INFO_UNKNOWN)
    assert [(v.value, v.timestamp_micros, v.windows) for v in made] == [
        (Pair(1, "x"), 5_000, windows),
        (Pair(2, None), 6_000, windows),
    ]
    with pytest.raises(ValueError, match="found 1 for 2 rows"):
        maker.make(batch, np.array([5_000]), Pair, windows, PANE_INFO_UNKNOWN)
