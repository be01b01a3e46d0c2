"""Column-wise Beam row encoding (``coders.row_columns``) writes Beam's own bytes."""

from __future__ import annotations

import collections
import math
import random

import numpy as np
import pyarrow as pa
import pytest
from apache_beam.coders import coders
from apache_beam.coders.row_coder import RowCoder
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from beam_spark_runner.coders.row_columns import RowColumnsEncoder, varints
from beam_spark_runner.io.spark_stream import beam_row_type, parse_schema

# The columns of a Spark source, as ReadFromSparkStream maps them to a Beam row type.
WIDE_COLUMNS = (
    "s STRING, i64 BIGINT, i32 INT, i16 SMALLINT, f64 DOUBLE, f32 FLOAT, b BOOLEAN, "
    "raw BINARY, ts TIMESTAMP"
)
Wide = collections.namedtuple("Wide", ["s", "i64", "i32", "i16", "f64", "f32", "b", "raw", "ts"])


ARROW_TYPES = {
    "s": pa.string(),
    "i64": pa.int64(),
    "i32": pa.int32(),
    "i16": pa.int16(),
    "f64": pa.float64(),
    "f32": pa.float32(),
    "b": pa.bool_(),
    "raw": pa.binary(),
    "ts": pa.timestamp("us", tz="UTC"),
}


def _coder(columns: str, prefixed: bool = True) -> coders.WindowedValueCoder:
    row = RowCoder.from_type_hint(beam_row_type(parse_schema(columns)), None)
    value = coders.LengthPrefixCoder(row) if prefixed else row
    return coders.WindowedValueCoder(value, coders.GlobalWindowCoder())


def _batch(rows: list[Wide]) -> pa.RecordBatch:
    def arrow(name: str, value: object) -> object:
        return value.micros if isinstance(value, Timestamp) else value

    return pa.RecordBatch.from_arrays(
        [pa.array([arrow(n, getattr(r, n)) for r in rows], ARROW_TYPES[n]) for n in Wide._fields],
        names=list(Wide._fields),
    )


def _beam(coder: coders.Coder, rows: list[Wide], micros: list[int]) -> list[bytes]:
    return [
        coder.encode(GlobalWindows.windowed_value(r, Timestamp(micros=m)))
        for r, m in zip(rows, micros, strict=True)
    ]


def _random_row(rng: random.Random) -> Wide:
    def maybe(value: object) -> object:
        return None if rng.random() < 0.2 else value

    return Wide(
        s=maybe("".join(rng.choice("aé漢\U0001f600z ") for _ in range(rng.randrange(0, 300)))),
        i64=maybe(rng.choice([0, 1, -1, 127, 128, 2**63 - 1, -(2**63), rng.getrandbits(63)])),
        i32=maybe(np.int32(rng.choice([0, -1, 2**31 - 1, -(2**31), rng.randrange(-999, 999)]))),
        i16=maybe(np.int16(rng.choice([0, -1, 2**15 - 1, -(2**15), 300]))),
        f64=maybe(rng.choice([0.0, -0.0, 1.5, -1e300, math.inf, -math.inf, rng.random()])),
        f32=maybe(np.float32(rng.choice([0.0, 3.25, -1e30, rng.random()]))),
        b=maybe(rng.random() < 0.5),
        raw=maybe(bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))),
        ts=maybe(Timestamp(micros=rng.randrange(-(10**15), 10**16))),
    )


@pytest.mark.parametrize("prefixed", [True, False])
def test_random_rows_with_nulls_encode_as_beam_encodes_them(prefixed: bool) -> None:
    rng = random.Random(7)
    rows = [_random_row(rng) for _ in range(400)]
    micros = [rng.randrange(-(10**15), 10**16) for _ in rows]
    coder = _coder(WIDE_COLUMNS, prefixed)
    encoder = RowColumnsEncoder.for_coder(coder)
    assert encoder is not None
    batch = _batch(rows)
    encoded = encoder.encode(batch, np.array(micros, dtype=np.int64))
    assert encoded.to_pylist() == _beam(coder, rows, micros)
    assert encoder.agrees(batch, np.array(micros, dtype=np.int64), _beam(coder, rows, micros))
    # A slice (a batch Spark hands over can be one) encodes its own rows.
    part = batch.slice(100, 50)
    assert encoder.encode(part, np.array(micros[100:150])).to_pylist() == _beam(
        coder, rows[100:150], micros[100:150]
    )


def test_event_times_at_the_edges_of_beam_time_and_between_milliseconds() -> None:
    moments = [
        MIN_TIMESTAMP.micros,
        MIN_TIMESTAMP.micros - 5,  # before Beam's minimum: clamped, as Beam does
        -1_500,  # rounds towards zero, as Beam does
        -999,
        -1,
        0,
        999,
        1_767_225_600_123_456,
        MAX_TIMESTAMP.micros,
    ]
    coder = _coder(WIDE_COLUMNS)
    encoder = RowColumnsEncoder.for_coder(coder)
    assert encoder is not None
    rows = [Wide("x", 1, None, None, None, None, True, None, None)] * len(moments)
    assert encoder.encode(_batch(rows), np.array(moments, dtype=np.int64)).to_pylist() == _beam(
        coder, rows, moments
    )


def test_rows_without_any_value_and_an_empty_batch() -> None:
    coder = _coder(WIDE_COLUMNS)
    encoder = RowColumnsEncoder.for_coder(coder)
    assert encoder is not None
    rows = [Wide(*[None] * len(Wide._fields))] * 3
    assert encoder.encode(_batch(rows), np.zeros(3, dtype=np.int64)).to_pylist() == _beam(
        coder, rows, [0, 0, 0]
    )
    assert encoder.encode(_batch([]), np.zeros(0, dtype=np.int64)).to_pylist() == []


REQUIRED = _coder("n BIGINT NOT NULL", prefixed=False)
Required = collections.namedtuple("Required", ["n"])


def test_a_null_in_a_field_that_is_not_nullable_is_an_error() -> None:
    encoder = RowColumnsEncoder.for_coder(REQUIRED)
    assert encoder is not None
    batch = pa.RecordBatch.from_arrays([pa.array([1, None], pa.int64())], names=["n"])
    with pytest.raises(ValueError, match=r"non-nullable field.*\['n'\]"):
        encoder.encode(batch, np.zeros(2, dtype=np.int64))


def test_coders_it_cannot_write_are_left_to_beam() -> None:
    assert RowColumnsEncoder.for_coder(_coder("day DATE, n BIGINT")) is None
    assert RowColumnsEncoder.for_coder(_coder("amount DECIMAL(10, 2)")) is None
    not_global = coders.WindowedValueCoder(
        REQUIRED.wrapped_value_coder, coders.IntervalWindowCoder()
    )
    assert RowColumnsEncoder.for_coder(not_global) is None
    plain = coders.WindowedValueCoder(coders.VarIntCoder(), coders.GlobalWindowCoder())
    assert RowColumnsEncoder.for_coder(plain) is None


def test_a_disagreeing_encoder_says_so() -> None:
    coder = REQUIRED
    encoder = RowColumnsEncoder.for_coder(coder)
    assert encoder is not None
    batch = pa.RecordBatch.from_arrays([pa.array([5], pa.int64())], names=["n"])
    right = _beam(coder, [Required(5)], [0])
    assert encoder.agrees(batch, np.zeros(1, dtype=np.int64), right)
    assert not encoder.agrees(batch, np.zeros(1, dtype=np.int64), [right[0] + b"!"])


def test_varints_are_beams() -> None:
    from apache_beam.coders.coder_impl import create_OutputStream

    values = [0, 1, 127, 128, 300, 2**62, 2**63 - 1, -1, -(2**63), -300]
    expected = []
    for v in values:
        out = create_OutputStream()
        out.write_var_int64(v)
        expected.append(out.get())
    pieces = varints(np.array(values, dtype=np.int64))
    ends = np.cumsum(pieces.lengths)
    got = [pieces.data[e - n : e].tobytes() for e, n in zip(ends, pieces.lengths, strict=True)]
    assert got == expected
