"""The values of encoded ``KV`` elements as a typed column, decoded per batch.

A native combine's writers (``planning.native_combines``) hand Spark partial aggregates
(``execution.partial_aggregation``) under the shuffle's grouping keys (``coders.keys``).
Each value is read from the element's bytes with numpy where its key's nested encoding
ends: a varint (``VarIntCoder``) or eight big-endian bytes (``FloatCoder``), possibly after
a varint length (``LengthPrefixCoder``). An element that cannot be read so (its key was
decoded, or its value does not end where the element does) is decoded with the stream's
own coder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pyarrow as pa
from apache_beam.coders import Coder, coders

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.keys import KeyExtractor, read_varints

# The numpy type of each value type a native aggregation reads (planning.NativeAggregation).
NUMPY_TYPES: dict[str, Any] = {"int": np.int64, "float": np.float64}
_PLAIN_VALUE_CODERS: dict[str, type] = {"int": coders.VarIntCoder, "float": coders.FloatCoder}
_MAX_VARINT_BYTES = 10
_MAX_LENGTH_VARINT_BYTES = 5
_DOUBLE_BYTES = 8


def _value_coder(windowed_kv_coder: Coder) -> Coder:
    kv_coder = cast(coders.TupleCoder, windowed_kv_coder.wrapped_value_coder)  # type: ignore[attr-defined]
    return kv_coder.coders()[1]


class TypedValueReader:
    """Reads the keys and the typed values of a stream of windowed ``KV`` elements.

    ``safe_coder`` is the runner-safe coder the keys are computed with; ``coder`` the
    stream's own (the data channel's), which says how the values are written.
    """

    def __init__(self, safe_coder: Coder, coder: Coder, value_type: str) -> None:
        value_coder = _value_coder(coder)
        self._prefixed = type(value_coder) is coders.LengthPrefixCoder
        if self._prefixed:
            value_coder = value_coder.value_coder()  # type: ignore[attr-defined]
        plain = _PLAIN_VALUE_CODERS.get(value_type)
        if plain is None or type(value_coder) is not plain:
            raise ValueError(
                f"Expected {value_type} values coded with {plain.__name__ if plain else '?'}, "
                f"found {value_coder!r}. This is a bug in SparkStructuredRunner's planning."
            )
        self.value_type = value_type
        self._keys = KeyExtractor(safe_coder)
        self._element_impl = coder.get_impl()

    def read(self, data: bytes, ends: Sequence[int]) -> tuple[pa.Array, np.ndarray]:
        """Each element's key (as ``KeyExtractor.keys``, a binary array) and its value."""
        keys, starts, decoded = self._keys.key_array_and_value_starts(data, ends)
        if starts is None:
            values = np.zeros(len(ends), dtype=NUMPY_TYPES[self.value_type])
            odd = decoded
        else:
            values, readable = self._read_values(data, ends, starts)
            readable[decoded] = False
            odd = np.flatnonzero(~readable)
        if len(odd):
            values[odd] = np.asarray(self._decoded_values(data, ends, odd), dtype=values.dtype)
        return keys, values

    def _decoded_values(self, data: bytes, ends: Sequence[int], indices: np.ndarray) -> list[Any]:
        values = []
        for index in indices.tolist():
            start = ends[index - 1] if index else 0
            stream = bi.create_InputStream(data[start : ends[index]])
            values.append(self._element_impl.decode_from_stream(stream, True).value[1])
        return values

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
