"""Arrow columns encoded as Beam rows in the global window, a column at a time.

A ``ReadFromSparkStream`` turns each row Spark reads into a Beam element: a row of the
source's columns (``RowCoder``, possibly in a ``LengthPrefixCoder``) in the global window,
at its event time, in the one pane. Beam's coder makes Python objects for every row;
:class:`RowColumnsEncoder` writes the same bytes with numpy, a field at a time for all rows.
It takes only the field types below (:meth:`RowColumnsEncoder.for_coder` returns None
otherwise, and the caller encodes element by element); its caller checks its first rows
against Beam's own encoding before trusting it. Timestamps are microseconds since the epoch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import pyarrow as pa
from apache_beam.coders import coders
from apache_beam.coders.row_coder import RowCoder
from apache_beam.portability.api import schema_pb2
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP

_LOGGER = logging.getLogger(__name__)

MICROS_INSTANT_URN = "beam:logical_type:micros_instant:v1"
_MAX_VARINT_BYTES = 10
# The windowed value's timestamp: milliseconds, shifted so that they sort as unsigned.
_TIME_SHIFT = 1 << 63
_MIN_MICROS = MIN_TIMESTAMP.micros
_MAX_MICROS = MAX_TIMESTAMP.micros
# One global window (a four-byte count, the window itself encodes as nothing), then the
# pane (the first and only firing, on time). Checked against Beam's encoding of a probe.
_GLOBAL_WINDOW_AND_PANE = b"\x00\x00\x00\x01\x0f"


@dataclasses.dataclass(frozen=True)
class Pieces:
    """One variable-length byte string per row: their lengths and their bytes, in order."""

    lengths: np.ndarray  # int64, one per row
    data: np.ndarray  # uint8, the rows' bytes concatenated

    @staticmethod
    def constant(value: bytes, rows: int) -> Pieces:
        return Pieces(
            np.full(rows, len(value), dtype=np.int64),
            np.tile(np.frombuffer(value, dtype=np.uint8), rows),
        )

    @staticmethod
    def fixed(data: np.ndarray, width: int) -> Pieces:
        """Rows of ``width`` bytes each, ``data`` their concatenation."""
        return Pieces(np.full(len(data) // width, width, dtype=np.int64), data)

    def spread(self, valid: np.ndarray) -> Pieces:
        """These pieces (one per valid row) as one per row, empty where not ``valid``."""
        lengths = np.zeros(len(valid), dtype=np.int64)
        lengths[valid] = self.lengths
        return Pieces(lengths, self.data)


def varints(values: np.ndarray) -> Pieces:
    """Each value's varint, as Beam writes an ``int64`` (its unsigned 64-bit two's complement)."""
    unsigned = values.astype(np.int64).view(np.uint64)
    sizes = np.ones(len(unsigned), dtype=np.int64)
    for k in range(1, _MAX_VARINT_BYTES):
        sizes += unsigned >= np.uint64(1 << (7 * k))
    groups = np.empty((len(unsigned), _MAX_VARINT_BYTES), dtype=np.uint8)
    for k in range(_MAX_VARINT_BYTES):
        seven = (unsigned >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (sizes > k + 1).astype(np.uint64) << np.uint64(7)
        groups[:, k] = (seven | more).astype(np.uint8)
    used = np.arange(_MAX_VARINT_BYTES) < sizes[:, None]
    return Pieces(sizes, groups[used])


def join(pieces: Sequence[Pieces]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's pieces concatenated: (offsets, one per row and one more; the bytes)."""
    rows = len(pieces[0].lengths)
    lengths = np.stack([p.lengths for p in pieces])  # (pieces, rows)
    row_lengths = lengths.sum(axis=0)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(row_lengths, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    # Where each piece of each row starts in the output.
    starts = offsets[:-1] + np.cumsum(lengths, axis=0) - lengths
    for piece, start in zip(pieces, starts, strict=True):
        if not len(piece.data):
            continue
        source_starts = np.cumsum(piece.lengths) - piece.lengths
        target = np.repeat(start - source_starts, piece.lengths)
        target += np.arange(len(piece.data), dtype=np.int64)
        out[target] = piece.data
    return offsets, out


def _varint_column(column: pa.Array, valid: np.ndarray, mask: int | None) -> Pieces:
    values = column.filter(pa.array(valid)).to_numpy().astype(np.int64)
    if mask is not None:  # VarInt32Coder writes an int32 as its unsigned 32 bits
        values = values & mask
    return varints(values).spread(valid)


def _big_endian_column(column: pa.Array, valid: np.ndarray, dtype: str) -> Pieces:
    values = column.filter(pa.array(valid)).to_numpy().astype(dtype)
    return Pieces.fixed(values.view(np.uint8), np.dtype(dtype).itemsize).spread(valid)


def _boolean_column(column: pa.Array, valid: np.ndarray) -> Pieces:
    values = column.filter(pa.array(valid)).to_numpy(zero_copy_only=False).astype(np.uint8)
    return Pieces.fixed(values, 1).spread(valid)


def _length_prefixed_column(column: pa.Array, valid: np.ndarray) -> Pieces:
    """A string or bytes column: each value's length (a varint), then its bytes."""
    present = column.filter(pa.array(valid))
    present = present.cast(pa.large_binary())
    # A sliced array's offsets start at its own offset in the buffer.
    offsets = np.frombuffer(present.buffers()[1], dtype=np.int64)[
        present.offset : present.offset + len(present) + 1
    ]
    data_buffer = present.buffers()[2]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
        if data_buffer is not None
        else np.zeros(0, dtype=np.uint8)
    )
    lengths = np.diff(offsets)
    prefixes = varints(lengths)
    return join_pieces([prefixes, Pieces(lengths, data)]).spread(valid)


def _micros_instant_column(column: pa.Array, valid: np.ndarray) -> Pieces:
    """A ``Timestamp`` field: a nested row (seconds, micros) of two non-null varints."""
    micros = timestamp_micros(column.filter(pa.array(valid))).to_numpy().astype(np.int64)
    seconds, rest = np.divmod(micros, 1_000_000)
    header = Pieces.constant(b"\x02\x00", len(micros))
    return join_pieces([header, varints(seconds), varints(rest)]).spread(valid)


def join_pieces(pieces: Sequence[Pieces]) -> Pieces:
    """Pieces, each row's concatenated, as pieces again."""
    offsets, data = join(pieces)
    return Pieces(np.diff(offsets), data)


def timestamp_micros(column: pa.Array) -> pa.Array:
    """A TIMESTAMP column as integer microseconds since the epoch (nulls stay null)."""
    if column.type.unit != "us":
        column = column.cast(pa.timestamp("us", tz=column.type.tz))
    return column.cast(pa.int64())


def row_coder_of(coder: coders.Coder) -> RowCoder | None:
    """The ``RowCoder`` inside ``coder``, or None.

    ``coder`` must be a windowed-value coder in the global window around it (possibly
    length-prefixed), its fields in encoding order.
    """
    if not isinstance(coder, coders.WindowedValueCoder) or not isinstance(
        coder.window_coder, coders.GlobalWindowCoder
    ):
        return None
    value_coder = coder.wrapped_value_coder
    if isinstance(value_coder, coders.LengthPrefixCoder):
        value_coder = value_coder.value_coder()
    if not isinstance(value_coder, RowCoder):
        return None
    schema = value_coder.schema
    if schema.encoding_positions_set and [f.encoding_position for f in schema.fields] != list(
        range(len(schema.fields))
    ):
        return None
    return value_coder


_Field = TypeVar("_Field")


def row_fields(
    coder: coders.Coder, per_field: Callable[[schema_pb2.Field], _Field | None]
) -> tuple[list[str], list[_Field], list[bool]] | None:
    """The names, ``per_field`` of each field, and nullability of ``coder``'s row fields.

    None where ``coder`` is not one ``row_coder_of`` takes, the row has no field, or
    ``per_field`` gives None for one.
    """
    row_coder = row_coder_of(coder)
    if row_coder is None:
        return None
    schema = row_coder.schema
    made = [per_field(field) for field in schema.fields]
    if not schema.fields or any(m is None for m in made):
        return None
    return (
        [field.name for field in schema.fields],
        [m for m in made if m is not None],
        [field.type.nullable for field in schema.fields],
    )


_FieldEncoder = Callable[[pa.Array, np.ndarray], Pieces]


def _field_encoder(field: schema_pb2.Field) -> _FieldEncoder | None:
    """How to encode a column of this field's type, or None when this module cannot."""
    kind = field.type.WhichOneof("type_info")
    if kind == "logical_type":
        if field.type.logical_type.urn == MICROS_INSTANT_URN:
            return _micros_instant_column
        return None
    if kind != "atomic_type":
        return None
    atomic = field.type.atomic_type
    if atomic == schema_pb2.INT64:
        return lambda column, valid: _varint_column(column, valid, None)
    if atomic == schema_pb2.INT32:
        return lambda column, valid: _varint_column(column, valid, 0xFFFFFFFF)
    if atomic == schema_pb2.INT16:
        return lambda column, valid: _big_endian_column(column, valid, ">i2")
    if atomic == schema_pb2.DOUBLE:
        return lambda column, valid: _big_endian_column(column, valid, ">f8")
    if atomic == schema_pb2.FLOAT:
        return lambda column, valid: _big_endian_column(column, valid, ">f4")
    if atomic == schema_pb2.BOOLEAN:
        return _boolean_column
    if atomic in (schema_pb2.STRING, schema_pb2.BYTES):
        return _length_prefixed_column
    return None


class RowColumnsEncoder:
    """Encodes record batches as windowed Beam rows; see the module doc."""

    def __init__(
        self, names: list[str], encoders: list[_FieldEncoder], nullable: list[bool], prefixed: bool
    ) -> None:
        self._names = names
        self._encoders = encoders
        self._nullable = np.array(nullable, dtype=bool)
        self._prefixed = prefixed
        self._field_count = varints(np.array([len(names)], dtype=np.int64)).data.tobytes()
        self._null_bytes = (len(names) + 7) // 8

    @classmethod
    def for_coder(cls, coder: coders.Coder) -> RowColumnsEncoder | None:
        """An encoder for ``coder``'s elements, or None where this module cannot write them.

        ``coder`` must be a windowed-value coder in the global window around a
        ``RowCoder`` (or a length-prefixed one) of fields this module encodes. The caller
        checks the first rows it encodes against Beam's own encoding (:meth:`agrees`).
        """
        fields = row_fields(coder, _field_encoder)
        if fields is None:
            return None
        prefixed = isinstance(getattr(coder, "wrapped_value_coder", None), coders.LengthPrefixCoder)
        return cls(*fields, prefixed)

    def agrees(self, batch: pa.RecordBatch, micros: np.ndarray, expected: list[bytes]) -> bool:
        """Whether this encoder writes ``expected`` (Beam's encoding) for ``batch``'s rows."""
        try:
            encoded = self.encode(batch, micros).to_pylist()
        except (pa.ArrowException, TypeError, ValueError) as error:
            _LOGGER.warning("Column-wise row encoding failed on a probe: %s", error)
            return False
        return encoded == expected

    def encode(self, batch: pa.RecordBatch, micros: np.ndarray) -> pa.LargeBinaryArray:
        """Each row of ``batch`` (its columns in schema order) at its event time, encoded."""
        rows = batch.num_rows
        fields: list[Pieces] = []
        nulls = np.zeros((rows, len(self._names)), dtype=bool)
        for index, (name, encoder) in enumerate(zip(self._names, self._encoders, strict=True)):
            column = batch.column(name)
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks()
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            nulls[:, index] = ~valid
            fields.append(encoder(column, valid))
        if (nulls & ~self._nullable).any():
            where = np.asarray(nulls.any(axis=0))
            fields_with_nulls = [n for n, c in zip(self._names, where, strict=True) if c]
            raise ValueError(
                "Expected a value in every non-nullable field of a row; found a null in "
                f"{fields_with_nulls}. Make the column nullable or fill it in the source."
            )
        row = join_pieces(
            [Pieces.constant(self._field_count, rows), self._null_bits(nulls), *fields]
        )
        pieces = [_timestamps(micros), Pieces.constant(_GLOBAL_WINDOW_AND_PANE, rows)]
        if self._prefixed:
            pieces.append(varints(row.lengths))
        pieces.append(row)
        offsets, data = join(pieces)
        return pa.Array.from_buffers(
            pa.large_binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )

    def _null_bits(self, nulls: np.ndarray) -> Pieces:
        """A row without nulls writes a zero; one with nulls their bit mask's length and bits."""
        rows = len(nulls)
        has_nulls = np.asarray(nulls.any(axis=1))
        if not has_nulls.any():
            return Pieces.constant(b"\x00", rows)
        padded = np.zeros((rows, self._null_bytes * 8), dtype=bool)
        padded[:, : nulls.shape[1]] = nulls
        bits = np.packbits(padded, axis=1, bitorder="little")
        masks = np.concatenate([np.full((rows, 1), self._null_bytes, dtype=np.uint8), bits], axis=1)
        lengths = np.where(has_nulls, self._null_bytes + 1, 1).astype(np.int64)
        data = np.where(has_nulls[:, None], masks, 0)
        used = np.arange(self._null_bytes + 1) < lengths[:, None]
        return Pieces(lengths, data.astype(np.uint8)[used])


def _millis(micros: np.ndarray) -> np.ndarray:
    """Event times as ``WindowedValueCoderImpl`` writes them.

    Milliseconds, rounded towards zero (Beam divides the absolute value), from
    ``MIN_TIMESTAMP`` up.
    """
    clamped = np.maximum(micros, _MIN_MICROS)
    return np.sign(clamped) * (np.abs(clamped) // 1000)  # type: ignore[no-any-return]


def windowed_value_micros(micros: np.ndarray) -> np.ndarray:
    """Event times as a windowed value decoded from Beam's encoding has them.

    Its decoder restores ``MIN_TIMESTAMP`` and ``MAX_TIMESTAMP`` from their milliseconds.
    """
    millis = _millis(micros)
    return np.where(  # type: ignore[no-any-return]
        millis <= -(abs(_MIN_MICROS) // 1000),
        _MIN_MICROS,
        np.where(millis >= _MAX_MICROS // 1000, _MAX_MICROS, millis * 1000),
    )


def _timestamps(micros: np.ndarray) -> Pieces:
    """The windowed values' timestamps, as ``WindowedValueCoderImpl`` writes them."""
    millis = _millis(micros)
    shifted = millis.astype(np.int64).view(np.uint64) + np.uint64(_TIME_SHIFT)
    return Pieces.fixed(shifted.astype(">u8").view(np.uint8), 8)
