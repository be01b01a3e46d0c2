"""Grouping keys for elements on their way to a GroupByKey.

Spark shuffles on a ``key`` column: the element's key encoded with the *runner-safe* key
coder, which reads user coders Beam does not know as opaque length-prefixed bytes, never
unpickling user objects. Keys group together exactly when these encodings are equal, as in
Beam's FnApiRunner. For the key coders the shuffle meets most (varints, strings, bytes,
length-prefixed user keys, KVs of these) the key's encoding is cut from the element's own
bytes, after a header whose layout the constants below give: :class:`KeyExtractor` slices a
whole bundle with numpy and decodes only the elements it cannot slice.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import cast

import numpy as np
import pyarrow as pa
from apache_beam.coders import Coder, coders

from beam_spark_runner import beam_internals as bi

# An element in the global window: 8 bytes of timestamp, a big-endian int32 window count
# (global windows encode to nothing), then the pane: one byte when its high nibble is 0.
_WINDOW_COUNT_OFFSET = 8
_PANE_OFFSET = 12
_GLOBAL_HEADER_BYTES = 13
# An element in one interval window: the timestamp, a window count of exactly 1, the
# window's end (8 bytes) and its span in milliseconds (a varint), then the pane.
_ONE_WINDOW = np.frombuffer(b"\x00\x00\x00\x01", dtype=np.uint8)
_SPAN_OFFSET = 20
# The longest varint a length may take here (35 bits); longer ones are decoded instead.
_MAX_LENGTH_VARINT_BYTES = 5
_MAX_VARINT_BYTES = 10


class _Part(enum.Enum):
    """How one leaf of a key coder encodes, in the nested context and in the outer one."""

    VARINT = "varint"  # VarIntCoder: a varint in both contexts
    BYTES = "bytes"  # BytesCoder, StrUtf8Coder: nested = varint length + data; outer = data
    PREFIXED = "prefixed"  # LengthPrefixCoder(BytesCoder): varint length + data in both


def _key_parts(coder: Coder) -> list[_Part] | None:
    """The leaves of a key coder whose encodings can be sliced, in order; else None.

    A tuple's nested encoding is its components' nested encodings one after another; its
    outer encoding differs only in its last leaf, which is encoded in the outer context.
    Only coders whose decode-then-encode gives back the bytes they wrote are listed, so a
    slice equals what the decoding path would compute.
    """
    kind = type(coder)
    if kind is coders.VarIntCoder:
        return [_Part.VARINT]
    if kind is coders.BytesCoder or kind is coders.StrUtf8Coder:
        return [_Part.BYTES]
    if kind is coders.LengthPrefixCoder and type(coder.value_coder()) is coders.BytesCoder:
        return [_Part.PREFIXED]
    if kind is coders.TupleCoder:
        parts: list[_Part] = []
        for component in coder.coders():  # type: ignore[attr-defined]
            component_parts = _key_parts(component)
            if component_parts is None:
                return None
            parts += component_parts
        return parts or None
    return None


class _Header(enum.Enum):
    """What comes before an element's key."""

    NONE = "none"  # a value-only (param) element: the key starts it
    GLOBAL = "global"  # _GLOBAL_HEADER_BYTES: timestamp, window count, pane
    INTERVAL = "interval"  # timestamp, window count 1, the window's end and span, pane


def _header(safe_windowed_kv_coder: Coder) -> _Header | None:
    """The header of this coder's elements when their keys can be sliced, else None."""
    kind = type(safe_windowed_kv_coder)
    window_coder = type(getattr(safe_windowed_kv_coder, "window_coder", None))
    if kind is coders.ParamWindowedValueCoder:
        # Its windows are in the payload, not in each element (planning: value-only).
        return _Header.NONE if window_coder is coders.GlobalWindowCoder else None
    if kind is not coders.WindowedValueCoder:
        return None
    if window_coder is coders.GlobalWindowCoder:
        return _Header.GLOBAL
    if window_coder is coders.IntervalWindowCoder:
        return _Header.INTERVAL
    return None


def sliceable_key_parts(safe_windowed_kv_coder: Coder) -> list[_Part] | None:
    """The key's parts when elements of this coder can have their keys sliced, else None."""
    if _header(safe_windowed_kv_coder) is None:
        return None
    windowed = cast(coders.WindowedValueCoder, safe_windowed_kv_coder)
    kv_coder = windowed.wrapped_value_coder
    if type(kv_coder) is not coders.TupleCoder or len(kv_coder.coders()) != 2:
        return None
    return _key_parts(kv_coder.coders()[0])


def read_varints(
    buf: np.ndarray, positions: np.ndarray, max_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each position's varint: (value, size in bytes, whether it ends within max_bytes).

    The value is meaningful only for varints of at most 9 bytes (it is kept in an int64).
    Reads past the buffer are clamped to its last byte; the caller checks bounds.
    """
    count = len(positions)
    values = np.zeros(count, dtype=np.int64)
    sizes = np.zeros(count, dtype=np.int64)
    done = np.zeros(count, dtype=bool)
    last = len(buf) - 1
    for shift in range(max_bytes):
        byte = buf[np.minimum(positions + shift, last)].astype(np.int64)
        active = ~done
        values |= np.where(active, (byte & 0x7F) << (7 * shift), 0)
        sizes += active
        done |= byte < 0x80
        if done.all():
            break
    return values, sizes, done


def _gather(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> pa.LargeBinaryArray:
    """``[data[s : s + n] for s, n in zip(starts, lengths)]``, copied by numpy and Arrow.

    ``starts`` and ``lengths`` have one row per key and one column per segment; a key is
    its segments concatenated.
    """
    count = starts.shape[0]
    flat_starts = starts.ravel()
    flat_lengths = lengths.ravel()
    segment_offsets = np.zeros(len(flat_lengths) + 1, dtype=np.int64)
    np.cumsum(flat_lengths, out=segment_offsets[1:])
    total = int(segment_offsets[-1])
    # The source index of each output byte: its segment's start, plus its place in it.
    source = np.repeat(flat_starts - segment_offsets[:-1], flat_lengths)
    source += np.arange(total, dtype=np.int64)
    gathered = np.frombuffer(data, dtype=np.uint8)[source]
    key_offsets = np.ascontiguousarray(segment_offsets[:: starts.shape[1]])
    array = pa.Array.from_buffers(
        pa.large_binary(),
        count,
        [None, pa.py_buffer(key_offsets), pa.py_buffer(gathered)],
    )
    return array


class KeyExtractor:
    """Computes the grouping key of each element of a windowed ``KV`` stream."""

    def __init__(self, safe_windowed_kv_coder: Coder) -> None:
        self._element_impl = safe_windowed_kv_coder.get_impl()
        kv_coder = safe_windowed_kv_coder.wrapped_value_coder  # type: ignore[attr-defined]
        self._key_impl = kv_coder.key_coder().get_impl()
        self._parts = sliceable_key_parts(safe_windowed_kv_coder)
        self._header = _header(safe_windowed_kv_coder)

    def keys(self, data: bytes, ends: Sequence[int]) -> list[bytes]:
        """One key per element of ``data``; ``ends`` are the elements' end offsets."""
        if self._parts is not None and len(ends):
            keys, _, odd = self._sliced_keys(data, ends, self._parts)
            listed: list[bytes] = keys.to_pylist()
            for index, key in odd.items():
                listed[index] = key
            return listed
        return self.decoded_keys(data, ends)

    def key_array_and_value_starts(
        self, data: bytes, ends: Sequence[int]
    ) -> tuple[pa.Array, np.ndarray | None, np.ndarray]:
        """The keys (a binary array), where the values start, and which elements were decoded.

        The starts are None, and every element is listed as decoded, when the key coder's
        encodings cannot be sliced; a decoded element's start is meaningless.
        """
        if self._parts is None or not len(ends):
            return pa.array(self.decoded_keys(data, ends), pa.binary()), None, np.arange(len(ends))
        keys, value_starts, odd = self._sliced_keys(data, ends, self._parts)
        if odd:
            listed = keys.to_pylist()
            for index, key in odd.items():
                listed[index] = key
            array = pa.array(listed, pa.binary())
        else:
            array = keys.cast(pa.binary())
        return array, value_starts, np.fromiter(odd, dtype=np.int64, count=len(odd))

    def decoded_keys(self, data: bytes, ends: Sequence[int]) -> list[bytes]:
        """The keys by decoding each element and re-encoding its key (any coder)."""
        stream = bi.create_InputStream(data)
        decode = self._element_impl.decode_from_stream
        encode_key = self._key_impl.encode
        keys = []
        for _ in ends:
            windowed = decode(stream, True)
            keys.append(encode_key(windowed.value[0]))
        return keys

    def _sliced_keys(
        self, data: bytes, ends: Sequence[int], parts: list[_Part]
    ) -> tuple[pa.LargeBinaryArray, np.ndarray, dict[int, bytes]]:
        """The keys as slices of the elements' encodings, decoding only odd elements.

        Returns the sliced keys (an odd element's is empty), where each key's encoding
        ends in ``data`` (where the value starts), and the odd elements' decoded keys by
        index.

        An element is sliced when its pane takes one byte, its window count is a plain
        (non-negative) count (in interval windows: exactly one) and its key lies within it;
        any other element is decoded. A value-only element has neither: it is sliced when
        its key lies within it.
        """
        buf = np.frombuffer(data, dtype=np.uint8)
        element_ends = np.asarray(ends, dtype=np.int64)
        starts = np.empty_like(element_ends)
        starts[0] = 0
        starts[1:] = element_ends[:-1]
        key_starts, sliceable = self._key_starts(buf, starts)
        position = key_starts
        last_part_start = key_starts
        for part in parts:
            last_part_start = position
            if part is _Part.VARINT:
                _, size, ended = read_varints(buf, position, _MAX_VARINT_BYTES)
                position = position + size
            else:
                length, size, ended = read_varints(buf, position, _MAX_LENGTH_VARINT_BYTES)
                position = position + size + length
            sliceable &= ended
            sliceable &= position <= element_ends
        # Reads past an element (clamped to the buffer) are harmless: those are not sliced.
        sliceable &= key_starts <= element_ends
        key_ends = position
        if parts[-1] is _Part.BYTES:
            # The outer context drops the last leaf's length prefix: two segments.
            _, prefix, _ = read_varints(buf, last_part_start, _MAX_LENGTH_VARINT_BYTES)
            segment_starts = np.stack([key_starts, last_part_start + prefix], axis=1)
            segment_lengths = np.stack(
                [last_part_start - key_starts, key_ends - last_part_start - prefix], axis=1
            )
        else:
            segment_starts = key_starts[:, None]
            segment_lengths = (key_ends - key_starts)[:, None]
        odd = np.flatnonzero(~sliceable)
        if len(odd):
            segment_lengths[odd] = 0
        decoded = {
            index: self.decoded_keys(data[starts[index] : element_ends[index]], [0])[0]
            for index in odd.tolist()
        }
        return _gather(data, segment_starts, segment_lengths), key_ends, decoded

    def _key_starts(self, buf: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each element's key starts, and whether its header allows slicing it."""
        last = len(buf) - 1
        if self._header is _Header.NONE:
            return starts, np.ones(len(starts), dtype=bool)
        if self._header is _Header.GLOBAL:
            sliceable = buf[np.minimum(starts + _WINDOW_COUNT_OFFSET, last)] < 0x80
            sliceable &= buf[np.minimum(starts + _PANE_OFFSET, last)] < 0x10
            return starts + _GLOBAL_HEADER_BYTES, sliceable
        counts = buf[np.minimum(starts[:, None] + _WINDOW_COUNT_OFFSET + np.arange(4), last)]
        sliceable = (counts == _ONE_WINDOW).all(axis=1)
        _, span_bytes, ended = read_varints(buf, starts + _SPAN_OFFSET, _MAX_VARINT_BYTES)
        sliceable &= ended
        panes = starts + _SPAN_OFFSET + span_bytes
        sliceable &= buf[np.minimum(panes, last)] < 0x10
        return panes + 1, sliceable
