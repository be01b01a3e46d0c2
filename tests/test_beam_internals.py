"""``beam_internals``' shortcuts give what Beam's own constructors give."""

from __future__ import annotations

import pytest
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

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
