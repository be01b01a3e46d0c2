"""``beam_internals``' shortcuts give what Beam's own constructors give."""

from __future__ import annotations

from typing import Any

import pytest
from apache_beam.coders import coders
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, WindowedValue

from beam_spark_runner import beam_internals as bi


@pytest.mark.parametrize(
    "micros",
    [
        0,
        1,
        -1,
        999_999,
        -1_000_001,
        1_767_225_600_123_456,
        MIN_TIMESTAMP.micros,
        MAX_TIMESTAMP.micros,
    ],
)
def test_timestamp_of_micros_is_beams_timestamp(micros: int) -> None:
    made = bi.timestamp_of_micros(micros)
    expected = Timestamp(micros=micros)
    assert type(made) is Timestamp
    assert vars(made) == vars(expected)
    assert made == expected and made.micros == micros and hash(made) == hash(expected)
    assert repr(made) == repr(expected)


_WINDOWINGS = [
    (coders.GlobalWindowCoder(), [[GlobalWindow()]]),
    (
        coders.IntervalWindowCoder(),
        [
            [IntervalWindow(0, 10)],
            [IntervalWindow(0, 10)],
            [IntervalWindow(-20, -10), IntervalWindow(5, 15)],
            [IntervalWindow(-20, -10)],
            [],
            [IntervalWindow(0, 10)],
        ],
    ),
]


@pytest.mark.parametrize(("window_coder", "window_sets"), _WINDOWINGS)
def test_windowed_headers_are_what_beams_decoding_gives_without_the_value(
    window_coder: Any, window_sets: list[list[Any]]
) -> None:
    coder = coders.WindowedValueCoder(coders.PickleCoder(), window_coder)
    impl = coder.get_impl()
    timestamps = [
        Timestamp(0),
        Timestamp(micros=-1_234_567),
        Timestamp(1_767_225_600.123456),
        MIN_TIMESTAMP,
        MAX_TIMESTAMP,
        Timestamp(micros=MIN_TIMESTAMP.micros + 1000),
    ]
    headers = bi.WindowedHeaders.of(coder)
    assert headers is not None
    # Elements one after the other, as a run: some share the previous one's windows.
    for i, timestamp in enumerate(timestamps * len(window_sets)):
        windows = window_sets[i % len(window_sets)]
        pane = PaneInfo(i % 2 == 0, False, 1, i, 0)
        element = impl.encode_nested(WindowedValue({"value": [i]}, timestamp, windows, pane))
        decoded = impl.decode_nested(element)
        micros, windows_bytes = headers.header(element)
        assert micros == decoded.timestamp.micros
        assert headers.windows(windows_bytes) == tuple(decoded.windows)


def test_a_parameterized_windowed_coder_has_no_header() -> None:
    coder = coders.ParamWindowedValueCoder(
        bi.global_window_param_payload(), [coders.BytesCoder(), coders.GlobalWindowCoder()]
    )
    assert bi.WindowedHeaders.of(coder) is None


class _CountingMap:
    """A side-input map that counts its look-ups."""

    def __init__(self) -> None:
        self.looked_up: list[Any] = []
        self.resets = 0

    def __getitem__(self, window: Any) -> Any:
        self.looked_up.append(window)
        return f"value of {window}"

    def is_globally_windowed(self) -> bool:
        return False

    def reset(self) -> None:
        self.resets += 1


def test_a_per_window_side_input_looks_each_window_up_once_until_reset() -> None:
    side_map = _CountingMap()
    side_input = bi._PerWindowSideInput(side_map)
    # Equal windows decoded apart are different objects: one look-up for both.
    first, same, other = IntervalWindow(0, 10), IntervalWindow(0, 10), IntervalWindow(10, 20)
    assert side_input[first] == side_input[same] == f"value of {first}"
    assert side_input[other] == f"value of {other}"
    assert side_input[GlobalWindow()] == side_input[GlobalWindow()]
    assert side_map.looked_up == [first, other, GlobalWindow()]
    side_input.reset()
    assert side_input[same] == f"value of {same}"
    assert side_map.looked_up[-1] is same and side_map.resets == 1
