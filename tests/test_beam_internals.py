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
