"""Arrow columns as Beam's windowed values of rows, made directly, a column at a time.

A ``ReadFromSparkStream`` whose readers are all stateless stages hands them its rows as
Arrow columns (``streaming.spark_sources``); their batched steps need the windowed values
Beam's ``RowCoder`` would decode. :class:`RowValues` makes them from the columns, for the
field types :mod:`row_columns` encodes, without encoding and decoding each element. The
windowed value's timestamp is the event time as the windowed-value coder carries it
(milliseconds, rounded towards zero); the row's timestamp fields keep their microseconds.
The caller checks the first rows made against Beam's decoding before trusting them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from apache_beam.coders import coders
from apache_beam.portability.api import schema_pb2

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.row_columns import (
    MICROS_INSTANT_URN,
    row_fields,
    timestamp_micros,
    windowed_value_micros,
)

_FieldValues = Callable[[pa.Array], list[Any]]


def _plain(column: pa.Array) -> list[Any]:
    return column.to_pylist()  # type: ignore[no-any-return]


def _micros_instants(column: pa.Array) -> list[Any]:
    """The column's ``Timestamp``s, rows with equal times next to each other sharing one.

    Sources stamp runs of rows alike (Spark's ``rate`` source in milliseconds), and a
    ``Timestamp`` is immutable: one made per run rather than per row, where runs are
    longer than a row on average (making a ``Timestamp`` was the costliest part of a row).
    """
    make = bi.timestamp_of_micros
    times = timestamp_micros(column)
    if column.null_count:
        return [None if m is None else make(m) for m in times.to_pylist()]
    micros = times.to_numpy()
    starts = np.flatnonzero(micros[1:] != micros[:-1]) + 1 if len(micros) else micros
    if 2 * (len(starts) + 1) > len(micros):
        return list(map(make, micros.tolist()))
    bounds = np.concatenate(([0], starts, [len(micros)]))
    made = map(make, micros[bounds[:-1]].tolist())
    return list(
        itertools.chain.from_iterable(map(itertools.repeat, made, np.diff(bounds).tolist()))
    )


def _tuple_maker(row_type: Any) -> Callable[[Iterable[tuple[Any, ...]]], Iterator[Any]]:
    """Rows of ``row_type`` from tuples of their fields.

    A named tuple's generated ``__new__`` is ``tuple.__new__(cls, fields)`` and nothing
    else: such rows are made by ``tuple.__new__`` directly, without a Python call per row.
    Any other row type is called.
    """
    new = getattr(row_type.__new__, "__globals__", {}).get("_tuple_new")
    if new is tuple.__new__:
        return lambda fields: map(tuple.__new__, itertools.repeat(row_type), fields)
    return lambda fields: itertools.starmap(row_type, fields)


def _field_values(field: schema_pb2.Field) -> _FieldValues | None:
    """How to read a column of this field's type as Beam's values, or None."""
    kind = field.type.WhichOneof("type_info")
    if kind == "logical_type":
        return _micros_instants if field.type.logical_type.urn == MICROS_INSTANT_URN else None
    if kind == "atomic_type" and field.type.atomic_type in (
        schema_pb2.INT64,
        schema_pb2.INT32,
        schema_pb2.INT16,
        schema_pb2.DOUBLE,
        schema_pb2.FLOAT,
        schema_pb2.BOOLEAN,
        schema_pb2.STRING,
        schema_pb2.BYTES,
    ):
        return _plain
    return None


class RowValues:
    """Makes windowed Beam rows from record batches; see the module doc."""

    def __init__(self, names: list[str], readers: list[_FieldValues], nullable: list[bool]) -> None:
        self._names = names
        self._readers = readers
        self._nullable = nullable

    @classmethod
    def for_coder(cls, coder: coders.Coder) -> RowValues | None:
        """A maker of ``coder``'s elements, or None where this module cannot make them.

        ``coder``: as ``RowColumnsEncoder.for_coder`` takes it (a windowed-value coder in
        the global window around a ``RowCoder``, possibly length-prefixed).
        """
        fields = row_fields(coder, _field_values)
        return None if fields is None else cls(*fields)

    def make(
        self, batch: pa.RecordBatch, micros: np.ndarray, row_type: Any, windows: Any, pane: Any
    ) -> list[Any]:
        """Each row of ``batch`` as a windowed value at its event time (``micros``).

        The rows are ``row_type``'s (the schema's named tuple), in ``windows`` with ``pane``
        (the global window and the only pane): the caller takes all three from Beam's
        decoding of a probe, as Beam makes a row type per coder or per schema by version.
        """
        if len(micros) != batch.num_rows:
            raise ValueError(
                f"Expected an event time per row; found {len(micros)} for {batch.num_rows} rows."
            )
        columns = []
        for name, reader, nullable in zip(self._names, self._readers, self._nullable, strict=True):
            column = batch.column(name)
            if not nullable and column.null_count:
                raise ValueError(
                    "Expected a value in every non-nullable field of a row; found a null in "
                    f"{name!r}. Make the column nullable or fill it in the source."
                )
            columns.append(reader(column))
        rows = _tuple_maker(row_type)(zip(*columns, strict=True))
        return list(
            map(
                bi.create_windowed_value,
                rows,
                windowed_value_micros(micros).tolist(),
                itertools.repeat(windows),
                itertools.repeat(pane),
            )
        )
