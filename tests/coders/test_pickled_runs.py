"""Pickled runs of windowed values against Beam's windowed-value coder, element by element."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from apache_beam.coders import coders
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import pickled_runs


@dataclasses.dataclass
class Bid:
    """A user type without ``__iter__``: Beam's coder pickles it."""

    price: int
    extra: str


class Lazy:
    """An iterable user type: Beam's coder would not pickle it inside a tuple."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def __iter__(self) -> Any:
        return iter(self.values)


def _coder(prefixed: bool = True) -> Any:
    value = coders.FastPrimitivesCoder()
    return coders.WindowedValueCoder(
        coders.LengthPrefixCoder(value) if prefixed else value, coders.IntervalWindowCoder()
    )


TIMES = [
    0,
    1,
    999,
    1000,
    1001,
    -1,
    -999,
    -1000,
    -1001,
    -1500,
    MIN_TIMESTAMP.micros,
    MIN_TIMESTAMP.micros + 1,
    MAX_TIMESTAMP.micros,
    MAX_TIMESTAMP.micros - 1,
    -(1 << 63),
    (1 << 63) - 1,
    1_700_000_000_123_456,
]
VALUES: list[Any] = [
    None,
    1,
    2**70,
    1.5,
    b"x",
    "y",
    True,
    (1, "a", [2.0]),
    {"k": (1,)},
    {1, 2},
    Bid(3, "e"),
    ("key", Bid(4, "f")),
]
PANES = [
    PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0),
    PaneInfo(True, False, PaneInfoTiming.EARLY, 0, -1),
]
WINDOWS = [[IntervalWindow(0, 10)], (IntervalWindow(10, 20), IntervalWindow(0, 20))]


def _elements(count: int) -> list[Any]:
    return [
        bi.create_windowed_value(
            VALUES[i % len(VALUES)],
            TIMES[i % len(TIMES)],
            WINDOWS[i // 3 % 2],
            PANES[i // 5 % 2],
        )
        for i in range(count)
    ]


def _as_beam_decodes(coder: Any, elements: list[Any]) -> list[str]:
    impl = coder.get_impl()
    return sorted(map(_described, (impl.decode(impl.encode(e)) for e in elements)))


def _described(value: Any) -> str:
    return repr((value.timestamp_micros, tuple(value.windows), value.pane_info, value.value))


@pytest.mark.parametrize("prefixed", [True, False])
def test_runs_give_what_beams_coder_decodes_for_each_element(prefixed: bool) -> None:
    coder = _coder(prefixed)
    assert pickled_runs.pickles_in_runs(coder)
    elements = _elements(60)
    writer = pickled_runs.RunWriter(coder, 2)
    assert writer.add(elements[:25]) and writer.add(elements[25:])
    runs = writer.finish()
    assert all(pickled_runs.is_run(run) for run in runs)
    reader = pickled_runs.RunReader(coder)
    decoded = [value for run in runs for value in reader.values(run)]
    assert sorted(map(_described, decoded)) == _as_beam_decodes(coder, elements)
    # Each run holds one group of windows and pane; its header names them.
    headers = bi.WindowedHeaders(coder.window_coder)
    for run in runs:
        values = reader.values(run)
        windows, earliest = pickled_runs.run_header(run)
        assert {headers.windows(windows)} == {tuple(v.windows) for v in values}
        assert len({v.pane_info for v in values}) == 1
        assert earliest == min(v.timestamp_micros for v in values)
    # Iterated as the bundle processor reads it: Beam's encodings, run by run.
    impl = coder.get_impl()
    encoded = b"".join(pickled_runs.RunsInput(runs, reader))
    assert sorted(map(_described, impl.decode_all(encoded))) == _as_beam_decodes(coder, elements)


def test_a_group_goes_in_parts_of_equal_sizes_of_at_most_run_values_each() -> None:
    coder = _coder()
    window = [IntervalWindow(0, 10)]
    count = 2 * pickled_runs.RUN_VALUES + 7
    elements = [bi.create_windowed_value(i, i, window) for i in range(count)]
    writer = pickled_runs.RunWriter(coder, 2)
    assert writer.add(elements)
    reader = pickled_runs.RunReader(coder)
    sizes = [len(reader.values(run)) for run in writer.finish()]
    assert sizes == [pickled_runs.RUN_VALUES] * 2 + [4, 3]
    # Contiguous, in order.
    values = [v.value for run in writer.made for v in reader.values(run)]
    assert values == list(range(count))


def test_a_value_holding_an_iterable_type_stops_the_runs_and_gives_every_value_back() -> None:
    coder = _coder()
    elements = _elements(30)
    writer = pickled_runs.RunWriter(coder, 2)
    assert writer.add(elements[:20])
    lazy = bi.create_windowed_value(("k", Lazy([1])), 5, [IntervalWindow(0, 10)])
    assert not writer.add([lazy])
    taken = writer.give_up()
    assert _as_beam_decodes(coder, taken) == _as_beam_decodes(coder, elements[:20])
    assert writer.finish() == []


def test_only_a_pickling_value_coder_in_beams_windowed_coder_goes_in_runs() -> None:
    window = coders.IntervalWindowCoder()
    assert pickled_runs.pickles_in_runs(coders.WindowedValueCoder(coders.PickleCoder(), window))
    assert not pickled_runs.pickles_in_runs(coders.WindowedValueCoder(coders.VarIntCoder(), window))
    assert not pickled_runs.pickles_in_runs(
        coders.WindowedValueCoder(coders.FastPrimitivesCoder().as_deterministic_coder("x"), window)
    )
    assert not pickled_runs.pickles_in_runs(coders.FastPrimitivesCoder())


def test_no_encoded_element_starts_as_a_run_does() -> None:
    impl = coders.WindowedValueCoder(coders.PickleCoder(), coders.GlobalWindowCoder()).get_impl()
    for micros in (-(1 << 63), MIN_TIMESTAMP.micros, -1, 0, MAX_TIMESTAMP.micros, (1 << 63) - 1):
        element = impl.encode(bi.create_windowed_value(1, micros, [GlobalWindow()]))
        assert not pickled_runs.is_run(element)


def test_pieces_without_a_run_are_stored_as_before_and_with_runs_come_back_apart() -> None:
    coder = _coder()
    impl = coder.get_impl()
    plain = [impl.encode(e) for e in _elements(3)]
    assert pickled_runs.stored(plain) == b"".join(plain)
    assert pickled_runs.pieces(b"".join(plain)) == [b"".join(plain)]
    writer = pickled_runs.RunWriter(coder, 1)
    assert writer.add(_elements(4))
    runs = writer.finish()
    mixed = [plain[0], *runs, plain[1]]
    assert pickled_runs.pieces(pickled_runs.stored(mixed)) == mixed
