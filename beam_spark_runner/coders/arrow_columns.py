"""Beam-encoded elements <-> Arrow binary columns, without per-element copies.

An Arrow ``binary`` array is an offsets buffer plus one contiguous data buffer, which is
exactly the shape of a Beam data-channel stream with its element boundaries. So a column
of encoded elements becomes one stream by slicing its data buffer, and a stream with known
element end offsets becomes a column by wrapping both buffers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from apache_beam.coders import Coder

from beam_spark_runner import beam_internals as bi

# The columns of a fused stage's output rows: which output (tag), the grouping key where
# the next step groups by key, and the encoded element(s).
TAG = "tag"
KEY = "key"
ELEMENT = "element"
STAGE_OUTPUT_SCHEMA = pa.schema(
    [pa.field(TAG, pa.int32()), pa.field(KEY, pa.binary()), pa.field(ELEMENT, pa.binary())]
)

# Arrow ``binary`` uses 32-bit offsets: a single array holds under 2 GiB of data.
MAX_ARRAY_BYTES = 1 << 30


def packed_bytes(column: pa.Array | pa.ChunkedArray) -> bytes:
    """The concatenation of a binary column's non-null values, as one stream."""
    if isinstance(column, pa.ChunkedArray):
        return b"".join(packed_bytes(chunk) for chunk in column.chunks)
    if len(column) == 0:
        return b""
    if column.null_count:
        column = column.drop_null()
        if len(column) == 0:
            return b""
    if column.type == pa.large_binary():
        offsets_type: Any = np.int64
    elif column.type == pa.binary():
        offsets_type = np.int32
    else:
        raise TypeError(f"Expected a binary Arrow column of encoded elements, found {column.type}")
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=offsets_type)[column.offset :]
    start, end = int(offsets[0]), int(offsets[len(column)])
    if data_buf is None or end == start:
        return b""
    return data_buf.slice(start, end - start).to_pybytes()


def split_packed(
    data: bytes, ends: Sequence[int], max_bytes: int = MAX_ARRAY_BYTES
) -> list[pa.BinaryArray]:
    """Cuts a stream into one cell per element, given each element's end offset.

    Returns several arrays when the data exceeds ``max_bytes``, so that no array overflows
    Arrow's 32-bit offsets.
    """
    if not ends:
        return []
    if ends[-1] != len(data):
        raise ValueError(
            f"Expected element end offsets to cover the stream of {len(data)} bytes, "
            f"but the last offset is {ends[-1]}."
        )
    all_offsets = np.empty(len(ends) + 1, dtype=np.int64)
    all_offsets[0] = 0
    all_offsets[1:] = np.asarray(ends, dtype=np.int64)
    arrays: list[pa.BinaryArray] = []
    first = 0
    while first < len(ends):
        base = int(all_offsets[first])
        last = int(np.searchsorted(all_offsets, base + max_bytes, side="right")) - 1
        last = max(last, first + 1)  # at least one element per array
        chunk_offsets = (all_offsets[first : last + 1] - base).astype(np.int32)
        chunk_data = data[base : int(all_offsets[last])]
        arrays.append(
            pa.Array.from_buffers(
                pa.binary(),
                last - first,
                [None, pa.py_buffer(chunk_offsets.tobytes()), pa.py_buffer(chunk_data)],
            )
        )
        first = last
    return arrays


def encode_column(values: Iterable[Any], coder: Coder, nested: bool = True) -> pa.BinaryArray:
    """Encodes each value with ``coder`` into one cell of a binary column."""
    impl = coder.get_impl()
    encode = impl.encode_nested if nested else impl.encode
    return pa.array([encode(v) for v in values], type=pa.binary())


def decode_column(column: pa.Array | pa.ChunkedArray, coder: Coder) -> list[Any]:
    """Decodes every element of a column of (possibly packed) nested encodings."""
    impl = coder.get_impl()
    stream = bi.create_InputStream(packed_bytes(column))
    values = []
    while stream.size() > 0:
        values.append(impl.decode_from_stream(stream, True))
    return values
