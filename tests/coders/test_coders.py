"""Beam coders <-> Arrow binary columns, over a corpus of Beam's standard coders."""

from __future__ import annotations

import itertools
import math
import typing
from fractions import Fraction

import pyarrow as pa
import pytest
from apache_beam.coders import coders
from apache_beam.coders.coders import GlobalWindowCoder, IntervalWindowCoder, WindowedValueCoder
from apache_beam.coders.row_coder import RowCoder
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_spark_runner.coders import (
    KeyExtractor,
    decode_column,
    encode_column,
    packed_bytes,
    split_packed,
)
from beam_spark_runner.coders.arrow_columns import MAX_ARRAY_BYTES


class Point(typing.NamedTuple):
    x: int
    y: float
    label: str
    tags: list[str]
    note: typing.Optional[str]


ON_TIME = PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0)
EARLY = PaneInfo(True, False, PaneInfoTiming.EARLY, 0, -1)
LATE = PaneInfo(False, False, PaneInfoTiming.LATE, 2, 1)

KV_CODER = coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()])

# (id, coder, values): every value must decode equal to itself; at least four values each,
# so that slices have elements on both sides.
CORPUS: list[tuple[str, coders.Coder, list[typing.Any]]] = [
    ("bytes", coders.BytesCoder(), [b"", b"a", b"\x00\xff" * 100, bytes(range(256))]),
    ("str_utf8", coders.StrUtf8Coder(), ["", "a", "héllo wörld", "日本語", "x" * 1000]),
    ("varint", coders.VarIntCoder(), [0, 1, -1, 127, 128, 2**63 - 1, -(2**63)]),
    ("bool", coders.BooleanCoder(), [True, False, False, True]),
    ("double", coders.FloatCoder(), [0.0, 1.5, -2.25, 1e308, 5e-324, math.inf, -math.inf]),
    ("kv", KV_CODER, [("a", 1), ("", 0), ("b", -5), ("日本", 2**40)]),
    (
        "tuple",
        coders.TupleCoder([coders.VarIntCoder(), coders.StrUtf8Coder(), coders.FloatCoder()]),
        [(1, "a", 1.0), (0, "", 0.0), (-7, "zz", -0.5), (2**31, "b" * 300, 3.25)],
    ),
    (
        "iterable",
        coders.IterableCoder(coders.StrUtf8Coder()),
        [[], ["a"], ["a", "b", "c"], [""] * 5, ["x" * 200] * 3],
    ),
    (
        "windowed_interval",
        WindowedValueCoder(KV_CODER, IntervalWindowCoder()),
        [
            WindowedValue(("a", 1), Timestamp(5), (IntervalWindow(0, 10),), ON_TIME),
            WindowedValue(
                ("b", 2),
                Timestamp(micros=12_000),  # the coder keeps milliseconds
                (IntervalWindow(0, 10), IntervalWindow(5, 15)),
                EARLY,
            ),
            WindowedValue(("a", 3), Timestamp(-3), (IntervalWindow(-10, 0),), LATE),
            WindowedValue(("", 0), Timestamp(99), (IntervalWindow(90, 100),), ON_TIME),
        ],
    ),
    (
        "windowed_global",
        WindowedValueCoder(coders.BytesCoder(), GlobalWindowCoder()),
        [
            WindowedValue(b"x", MIN_TIMESTAMP, (GlobalWindow(),)),
            WindowedValue(b"", Timestamp(0), (GlobalWindow(),), EARLY),
            WindowedValue(b"y" * 500, MAX_TIMESTAMP, (GlobalWindow(),), LATE),
            WindowedValue(b"z", Timestamp(1_700_000_000), (GlobalWindow(),)),
        ],
    ),
    (
        "length_prefix_bytes",
        coders.LengthPrefixCoder(coders.BytesCoder()),
        [b"", b"abc", b"\x00" * 1000, b"\xff"],
    ),
    (
        "length_prefix_fast_primitives",
        coders.LengthPrefixCoder(coders.FastPrimitivesCoder()),
        [None, 1, "two", (3, b"four"), {"five": [5.0]}],
    ),
    (
        "row_named_tuple",
        RowCoder.from_type_hint(Point, None),
        [
            Point(1, 2.5, "a", ["t"], None),
            Point(0, 0.0, "", [], "note"),
            Point(-(2**40), -1.0, "日本", ["x", "y", "z"], ""),
            Point(7, 1e-9, "b" * 100, ["q"] * 10, None),
        ],
    ),
    (
        "pickle",
        coders.PickleCoder(),
        [None, {"a": {1, 2}}, Fraction(1, 3), frozenset({"x"}), complex(1, -2)],
    ),
    (
        "fast_primitives",
        coders.FastPrimitivesCoder(),
        [None, 1, "s", b"b", (1, "a"), [1.5, None], {"k": [1, 2]}, True, 2**70, 0.25],
    ),
]


@pytest.fixture(params=CORPUS, ids=[case[0] for case in CORPUS])
def case(request):
    _, coder, values = request.param
    return coder, values


def nested_cells(coder: coders.Coder, values: list[typing.Any]) -> list[bytes]:
    return [coder.get_impl().encode_nested(value) for value in values]


def end_offsets(cells: list[bytes]) -> list[int]:
    return list(itertools.accumulate(len(cell) for cell in cells))


def cells_of(arrays: typing.Sequence[pa.Array]) -> list[bytes]:
    return [cell for array in arrays for cell in array.to_pylist()]


def test_encode_column_holds_one_nested_encoding_per_value(case):
    coder, values = case
    column = encode_column(values, coder)
    assert column.type == pa.binary()
    assert column.null_count == 0
    assert column.to_pylist() == nested_cells(coder, values)


def test_encode_column_unnested_holds_outer_context_encodings(case):
    coder, values = case
    column = encode_column(values, coder, nested=False)
    assert column.to_pylist() == [coder.encode(value) for value in values]


def test_round_trip(case):
    coder, values = case
    assert decode_column(encode_column(values, coder), coder) == values


def test_packed_bytes_is_the_stream_of_all_cells(case):
    coder, values = case
    column = encode_column(values, coder)
    assert packed_bytes(column) == b"".join(nested_cells(coder, values))


def test_packed_cells_decode_like_one_cell_per_element(case):
    """A cell may hold several concatenated elements, as a data-channel stream does."""
    coder, values = case
    cells = nested_cells(coder, values)
    packed = pa.array([b"".join(cells[:2]), b"", b"".join(cells[2:])], type=pa.binary())
    assert decode_column(packed, coder) == values


def test_split_packed_round_trip(case):
    coder, values = case
    cells = nested_cells(coder, values)
    arrays = split_packed(b"".join(cells), end_offsets(cells))
    assert len(arrays) == 1
    assert arrays[0].type == pa.binary()
    assert arrays[0].to_pylist() == cells
    assert decode_column(arrays[0], coder) == values


@pytest.mark.parametrize("max_bytes", [1, 2, 7, 64, 512])
def test_split_packed_cuts_arrays_at_max_bytes(case, max_bytes):
    coder, values = case
    cells = nested_cells(coder, values) * 3
    arrays = split_packed(b"".join(cells), end_offsets(cells), max_bytes=max_bytes)
    assert cells_of(arrays) == cells
    for array in arrays:
        assert len(array) >= 1
        # Only an element larger than the cap gets an array of its own above it.
        assert packed_bytes(array) == b"".join(array.to_pylist())
        assert len(packed_bytes(array)) <= max_bytes or len(array) == 1
    if sum(map(len, cells)) > max_bytes:
        assert len(arrays) > 1
    # Greedy: each array could not have taken the next array's first element.
    for array, following in itertools.pairwise(arrays):
        assert len(packed_bytes(array)) + len(following[0].as_py()) > max_bytes
    assert decode_column(pa.chunked_array(arrays), coder) == values * 3


def test_sliced_column_decodes_only_its_slice(case):
    coder, values = case
    column = encode_column(values, coder)
    sliced = column.slice(1, len(values) - 2)
    assert sliced.offset == 1
    assert packed_bytes(sliced) == b"".join(nested_cells(coder, values)[1:-1])
    assert decode_column(sliced, coder) == values[1:-1]
    assert decode_column(column.slice(len(values) - 1), coder) == values[-1:]
    assert decode_column(column.slice(2, 0), coder) == []


def test_nulls_are_skipped(case):
    coder, values = case
    cells: list[bytes | None] = [None]
    for cell in nested_cells(coder, values):
        cells += [cell, None]
    column = pa.array(cells, type=pa.binary())
    assert column.null_count == len(values) + 1
    assert decode_column(column, coder) == values
    assert decode_column(column.slice(2, 4), coder) == values[1:3]
    assert packed_bytes(pa.array([None, None], type=pa.binary())) == b""


def test_null_slots_with_leftover_data_are_skipped(case):
    """Arrow lets a null slot span bytes; they are not part of any element."""
    coder, values = case
    garbage = b"\xde\xad\xbe\xef"
    cells = [garbage]
    for cell in nested_cells(coder, values):
        cells += [cell, garbage]
    valid = [index % 2 == 1 for index in range(len(cells))]
    _, offsets, data = pa.array(cells, type=pa.binary()).buffers()
    validity = pa.array(valid).buffers()[1]
    column = pa.Array.from_buffers(pa.binary(), len(cells), [validity, offsets, data])
    assert column.to_pylist() == [
        cell if ok else None for cell, ok in zip(cells, valid, strict=True)
    ]
    assert packed_bytes(column) == b"".join(nested_cells(coder, values))
    assert decode_column(column, coder) == values
    assert decode_column(column.slice(1, 3), coder) == values[:2]


def test_chunked_array(case):
    coder, values = case
    column = encode_column(values, coder)
    empty = encode_column([], coder)
    chunked = pa.chunked_array([column.slice(0, 1), empty, column.slice(1)], type=pa.binary())
    assert chunked.num_chunks == 3
    assert packed_bytes(chunked) == packed_bytes(column)
    assert decode_column(chunked, coder) == values


def test_large_binary_column(case):
    coder, values = case
    column = pa.array(nested_cells(coder, values), type=pa.large_binary())
    assert decode_column(column, coder) == values
    assert decode_column(column.slice(1, 2), coder) == values[1:3]


def test_empty_columns(case):
    coder, _ = case
    empty = encode_column([], coder)
    assert len(empty) == 0
    assert packed_bytes(empty) == b""
    assert decode_column(empty, coder) == []
    assert decode_column(pa.chunked_array([], type=pa.binary()), coder) == []
    assert decode_column(pa.array([b""], type=pa.binary()), coder) == []


def test_split_packed_of_nothing_is_no_arrays():
    assert split_packed(b"", []) == []


def test_split_packed_default_cap_fits_32_bit_offsets():
    assert MAX_ARRAY_BYTES < 2**31


def test_split_packed_rejects_offsets_that_do_not_cover_the_stream():
    with pytest.raises(ValueError, match="cover the stream of 6 bytes, but the last offset is 5"):
        split_packed(b"abcdef", [2, 5])


@pytest.mark.parametrize(
    "column",
    [pa.array(["a"]), pa.array([1]), pa.array([b"abcd"], type=pa.binary(4))],
    ids=["string", "int64", "fixed_size_binary"],
)
def test_packed_bytes_rejects_columns_that_are_not_binary(column):
    with pytest.raises(TypeError, match="Expected a binary Arrow column"):
        packed_bytes(column)


# KeyExtractor: the grouping key column of windowed KV elements.


def extract_keys(coder: WindowedValueCoder, elements: list[WindowedValue]) -> list[bytes]:
    cells = nested_cells(coder, elements)
    return KeyExtractor(coder).keys(b"".join(cells), end_offsets(cells))


def test_keys_are_equal_exactly_when_the_element_keys_are():
    coder = WindowedValueCoder(KV_CODER, IntervalWindowCoder())
    elements = [
        WindowedValue(("a", 1), Timestamp(1), (IntervalWindow(0, 10),), ON_TIME),
        # Same key, different value, timestamp, window and pane.
        WindowedValue(("a", 2), Timestamp(15), (IntervalWindow(10, 20),), LATE),
        WindowedValue(("b", 1), Timestamp(1), (IntervalWindow(0, 10),), ON_TIME),
        WindowedValue(("", 1), Timestamp(1), (IntervalWindow(0, 10),), ON_TIME),
        WindowedValue(("ab", 1), Timestamp(1), (IntervalWindow(0, 10),), ON_TIME),
        WindowedValue(("a", 3), Timestamp(2), (IntervalWindow(0, 10), IntervalWindow(1, 11))),
    ]
    keys = extract_keys(coder, elements)
    assert len(keys) == len(elements)
    assert keys[0] == keys[1] == keys[5]
    assert len({keys[0], keys[2], keys[3], keys[4]}) == 4
    assert keys == [coders.StrUtf8Coder().encode(element.value[0]) for element in elements]


def test_composite_keys_are_encoded_unambiguously():
    """("ab", "c") and ("a", "bc") must not group together: nested parts are delimited."""
    key_coder = coders.TupleCoder([coders.StrUtf8Coder(), coders.StrUtf8Coder()])
    coder = WindowedValueCoder(
        coders.TupleCoder([key_coder, coders.FastPrimitivesCoder()]), GlobalWindowCoder()
    )
    window = (GlobalWindow(),)
    elements = [
        WindowedValue((("ab", "c"), None), Timestamp(0), window),
        WindowedValue((("a", "bc"), None), Timestamp(0), window),
        WindowedValue((("ab", "c"), {"other": "value"}), Timestamp(7), window),
    ]
    keys = extract_keys(coder, elements)
    assert keys[0] == keys[2]
    assert keys[0] != keys[1]


def test_length_prefixed_keys_are_read_as_opaque_bytes():
    """The runner-safe coder of a user key: length-prefixed bytes, never unpickled."""
    safe_key = coders.LengthPrefixCoder(coders.BytesCoder())
    coder = WindowedValueCoder(
        coders.TupleCoder([safe_key, coders.LengthPrefixCoder(coders.BytesCoder())]),
        GlobalWindowCoder(),
    )
    window = (GlobalWindow(),)
    user_keys = [b"\x80\x04pickled", b"\x80\x04other", b"\x80\x04pickled", b""]
    elements = [
        WindowedValue((key, b"v%d" % i), Timestamp(i), window) for i, key in enumerate(user_keys)
    ]
    keys = extract_keys(coder, elements)
    assert keys[0] == keys[2]
    assert len({keys[0], keys[1], keys[3]}) == 3
    assert keys == [safe_key.encode(key) for key in user_keys]


def test_no_elements_no_keys():
    coder = WindowedValueCoder(KV_CODER, GlobalWindowCoder())
    assert KeyExtractor(coder).keys(b"", []) == []
