"""A row-based ``StatefulProcessor`` on PySpark 3.5's ``applyInPandasWithState``.

PySpark 3.5 has no ``transformWithState``: its stateful operator is
``applyInPandasWithState``, a function called per group with the group's rows as pandas
DataFrames and one ``GroupState``, a single state value per group. :class:`RowsOverGroupState`
runs a processor written for ``transformWithState`` on it: the processor declares its
value and list states on a :class:`CellsHandle`, which keeps them all as *cells* of one
pickled dict, loaded from the group's ``GroupState`` before the group's rows and written
back after its last row out (PySpark reads the ``GroupState`` only once the function's
output is exhausted). A list state is thus rewritten whole every call. A processor that
runs several stateful steps in one group gives each its own cells through
:meth:`CellsHandle.scoped`. This module imports no Beam (PySpark, pandas, the standard
library and ``stateful_rows``' pandas conversions).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from beam_spark_runner.spark.stateful_rows import exact_longs_frame, frames_of, rows_of

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

# The GroupState's one column: the group's cells, pickled.
STATE_TYPE = "cells binary"
# Spark's names for the operator's modes: rows out are appended, no timeouts.
_OUTPUT_MODE = "append"
_NO_TIMEOUT = "NoTimeout"


def apply_in_pandas_with_state(
    frame: DataFrame, keys: list[Any], processor: Any, output_type: StructType
) -> DataFrame:
    """``frame`` grouped by ``keys`` through ``processor`` (rows in, rows out) on PySpark 3.5.

    ``keys`` are column names or Columns. Nullable long columns cross as
    ``decimal(20,0)``, as on 4.0's pandas operator (``stateful_rows``).
    """
    exact = exact_longs_frame(frame)
    adapter = RowsOverGroupState(processor, frame.schema, output_type)
    return exact.groupBy(*keys).applyInPandasWithState(
        adapter, output_type, STATE_TYPE, _OUTPUT_MODE, _NO_TIMEOUT
    )


class CellsHandle:
    """A ``StatefulProcessorHandle`` whose states are cells of one dict, per scope."""

    def __init__(self) -> None:
        # (scope, state name) -> a value state's value, or a list state's list of rows.
        self.cells: dict[tuple[Any, str], Any] = {}
        self.scope: Any = None

    def getValueState(  # noqa: N802 - PySpark's name
        self, name: str, schema: Any = None, ttl: Any = None
    ) -> CellValueState:
        """A value state ``name`` (``schema`` and ``ttl`` are not checked here)."""
        return CellValueState(self, name)

    def getListState(  # noqa: N802 - PySpark's name
        self, name: str, schema: Any = None, ttl: Any = None
    ) -> CellListState:
        """A list state ``name`` (``schema`` and ``ttl`` are not checked here)."""
        return CellListState(self, name)

    def scoped(self, scope: Any) -> CellsHandle:
        """States from now on read and write ``scope``'s cells (each step its own)."""
        self.scope = scope
        return self

    def load(self, encoded: bytes | None) -> None:
        """Takes a group's cells (``dump``'s bytes; ``None``: a group without state)."""
        self.cells = pickle.loads(encoded) if encoded else {}
        self.scope = None

    def dump(self) -> bytes | None:
        """The group's cells, encoded; ``None`` if it has none."""
        return pickle.dumps(self.cells, protocol=pickle.HIGHEST_PROTOCOL) if self.cells else None


class _Cell:
    """A named state variable: one cell of its handle's current scope."""

    def __init__(self, handle: CellsHandle, name: str) -> None:
        self._handle = handle
        self._name = name

    def _key(self) -> tuple[Any, str]:
        return (self._handle.scope, self._name)


class CellValueState(_Cell):
    """A value state, one cell of its handle's current scope."""

    def exists(self) -> bool:
        return self._key() in self._handle.cells

    def get(self) -> Any:
        return self._handle.cells.get(self._key())

    def update(self, value: tuple[Any, ...]) -> None:
        self._handle.cells[self._key()] = tuple(value)

    def clear(self) -> None:
        self._handle.cells.pop(self._key(), None)


class CellListState(_Cell):
    """A list state, one cell (a list of rows) of its handle's current scope."""

    def exists(self) -> bool:
        return bool(self._handle.cells.get(self._key()))

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter(list(self._handle.cells.get(self._key(), ())))

    def put(self, rows: list[tuple[Any, ...]]) -> None:
        self.clear()
        self.appendList(rows)

    def appendValue(self, row: tuple[Any, ...]) -> None:  # noqa: N802 - PySpark's name
        self.appendList([row])

    def appendList(self, rows: list[tuple[Any, ...]]) -> None:  # noqa: N802 - PySpark's name
        if rows:
            self._handle.cells.setdefault(self._key(), []).extend(tuple(row) for row in rows)

    def clear(self) -> None:
        self._handle.cells.pop(self._key(), None)


class RowsOverGroupState:
    """The function ``applyInPandasWithState`` calls: a row-based processor per group."""

    def __init__(self, processor: Any, input_type: StructType, output_type: StructType) -> None:
        self.processor = processor
        self.input_type = input_type
        self.output_names = tuple(output_type.names)
        self._handle: CellsHandle | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None}

    def __call__(self, key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any) -> Any:
        """The processor's rows out for the group ``key``, as DataFrames; its cells kept."""
        handle = self._handle
        if handle is None:
            handle = self._handle = CellsHandle()
            self.processor.init(handle)
        handle.load(bytes(state.get[0]) if state.exists else None)
        out = self.processor.handleInputRows(key, rows_of(frames, self.input_type), None)
        yield from frames_of(out, self.output_names)
        encoded = handle.dump()
        if encoded is not None:
            state.update((encoded,))
        elif state.exists:
            state.remove()
