"""The values of encoded ``KV`` elements as a typed Arrow column, decoded per batch.

A native combine's writers (``planning.native_combines``) send Spark each element's key,
as every writer into a shuffle does (``coders.keys``), and its value as an ``int64`` or
``float64`` column, which Spark aggregates in the JVM. The values are read straight from
the elements' bytes with numpy: the value starts where the key's nested encoding ends
(``KeyExtractor.keys_and_value_starts``) and is a varint (``VarIntCoder``, which writes
an ``int64`` as its unsigned 64-bit two's complement) or eight big-endian bytes
(``FloatCoder``), possibly after a varint length (``LengthPrefixCoder``). An element that
cannot be read so (its key was decoded, or its value does not end where the element
does) is decoded with its coder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import pyarrow as pa
from apache_beam.coders import Coder, coders

from beam_spark_runner.coders.keys import KeyExtractor, read_varints

# The Arrow type of each value type a native aggregation reads (planning.NativeAggregation).
ARROW_TYPES: dict[str, pa.DataType] = {"int": pa.int64(), "float": pa.float64()}
_MAX_VARINT_BYTES = 10
_MAX_LENGTH_VARINT_BYTES = 5
_DOUBLE_BYTES = 8


def value_is_length_prefixed(safe_windowed_kv_coder: Coder) -> bool:
    """Whether the elements' values are written after a varint length."""
    kv_coder = cast(coders.TupleCoder, safe_windowed_kv_coder.wrapped_value_coder)  # type: ignore[attr-defined]
    return type(kv_coder.coders()[1]) is coders.LengthPrefixCoder


class TypedValueReader:
    """Reads the keys and the typed values of a stream of windowed ``KV`` elements."""

    def __init__(self, safe_windowed_kv_coder: Coder, value_type: str) -> None:
        if value_type not in ARROW_TYPES:
            raise ValueError(
                f"Expected a value type among {sorted(ARROW_TYPES)}, found {value_type!r}"
            )
        self.value_type = value_type
        self._keys = KeyExtractor(safe_windowed_kv_coder)
        self._prefixed = value_is_length_prefixed(safe_windowed_kv_coder)

    def read(self, data: bytes, ends: Sequence[int]) -> tuple[list[bytes], pa.Array]:
        """Each element's key (as ``KeyExtractor.keys``) and its value, as an Arrow array."""
        keys, starts, decoded = self._keys.keys_and_value_starts(data, ends)
        count = len(ends)
        if starts is None:
            values = np.zeros(count, dtype=np.float64 if self.value_type == "float" else np.int64)
            odd = decoded
        else:
            values, readable = self._read_values(data, ends, starts)
            readable[decoded] = False
            odd = np.flatnonzero(~readable)
        if len(odd):
            python_values = self._keys.decoded_values(data, ends, odd)
            values[odd] = np.asarray(python_values, dtype=values.dtype)
        return keys, pa.array(values, type=ARROW_TYPES[self.value_type])

    def _read_values(
        self, data: bytes, ends: Sequence[int], starts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The values read at ``starts``, and whether each value ends its element."""
        buf = np.frombuffer(data, dtype=np.uint8)
        element_ends = np.asarray(ends, dtype=np.int64)
        position = starts
        readable = np.ones(len(starts), dtype=bool)
        if self._prefixed:
            length, size, ended = read_varints(buf, position, _MAX_LENGTH_VARINT_BYTES)
            position = position + size
            readable &= ended & (position + length == element_ends)
        if self.value_type == "int":
            # read_varints keeps the value in an int64: the tenth byte's one bit lands in
            # the sign bit, which is the two's complement VarIntCoder wrote.
            values, size, ended = read_varints(buf, position, _MAX_VARINT_BYTES)
            readable &= ended & (position + size == element_ends)
            return values, readable
        readable &= position + _DOUBLE_BYTES == element_ends
        last = len(buf) - 1
        gathered = buf[np.minimum(position[:, None] + np.arange(_DOUBLE_BYTES), last)]
        values = np.ascontiguousarray(gathered).view(">f8").ravel().astype(np.float64)
        return values, readable
