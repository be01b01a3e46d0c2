"""A row-based stateful processor on ``transformWithState`` or its pandas form (PySpark 4.0).

PySpark 4.1+ runs a ``StatefulProcessor`` on rows (``GroupedData.transformWithState``);
PySpark 4.0 has only ``transformWithStateInPandas``, the same processor and state handle
(value, list and map state) but with each group's rows in and out as pandas DataFrames.
:func:`transform_with_state` takes a processor written for rows and runs it on either:
on 4.0 inside :class:`RowsOverPandas`, which turns each group's DataFrames into rows (the
Spark ``Row`` objects 4.1 passes) and the rows it yields back into DataFrames. The
processor's state calls go to PySpark's handle unchanged: 4.0 answers them the same way.

pandas reads a nullable integer column with nulls as floats, which cannot hold every
64-bit value; such long columns therefore cross as ``decimal(20,0)`` (Python ints or
``None`` again here), and nullable int columns, which floats hold exactly, are turned back
into ints. This module imports PySpark, pandas and the standard library only: it is
unpickled in PySpark's pre-init process, where Beam is not imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from beam_spark_runner.spark.compat import has_row_state, has_state_processor

if TYPE_CHECKING or has_state_processor():
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
else:  # PySpark 3.5: processors run on applyInPandasWithState (``group_state``)

    class StatefulProcessor:
        """What a processor subclasses where PySpark has no ``StatefulProcessor``."""

    StatefulProcessorHandle = Any

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

# Enough digits for any long: the type nullable long columns cross to pandas in.
_EXACT_LONG = "decimal(20,0)"
# The most rows ``RowsOverPandas`` puts in one DataFrame out.
_ROWS_PER_FRAME = 4096


def transform_with_state(
    frame: DataFrame,
    keys: list[str],
    processor: StatefulProcessor,
    output_type: StructType,
    pandas: bool | None = None,
) -> DataFrame:
    """``frame`` grouped by ``keys`` through ``processor`` (rows in, rows out).

    Append output mode, time mode none (no timers, no Spark watermark). PySpark 4.1+ runs
    ``processor`` itself; 4.0 (or any line, with ``pandas``) runs it inside
    :class:`RowsOverPandas`. (PySpark 3.5 has neither: ``stateful_operator``.)
    """
    if pandas is None:
        pandas = not has_row_state()
    if not pandas:
        return frame.groupBy(*keys).transformWithState(processor, output_type, "Append", "None")
    adapter = RowsOverPandas(processor, frame.schema, output_type)
    return (
        exact_longs_frame(frame)
        .groupBy(*keys)
        .transformWithStateInPandas(adapter, output_type, "Append", "None")
    )


def exact_longs_frame(frame: DataFrame) -> DataFrame:
    """``frame`` with its nullable long columns as ``decimal(20,0)``, for pandas to hold."""
    from pyspark.sql import functions as F  # noqa: N812 - PySpark's convention
    from pyspark.sql.types import LongType

    return frame.select(
        *(
            F.col(field.name).cast(_EXACT_LONG).alias(field.name)
            if isinstance(field.dataType, LongType) and field.nullable
            else F.col(field.name)
            for field in frame.schema.fields
        )
    )


class RowsOverPandas(StatefulProcessor):  # type: ignore[misc]
    """A row-based ``StatefulProcessor`` run by PySpark 4.0's ``transformWithStateInPandas``."""

    def __init__(
        self, processor: StatefulProcessor, input_type: StructType, output_type: StructType
    ) -> None:
        self.processor = processor
        self.input_type = input_type
        self.output_names = tuple(output_type.names)

    def init(self, handle: StatefulProcessorHandle) -> None:
        """The processor declares its state variables on 4.0's handle, as on 4.1's."""
        self.processor.init(handle)

    def handleInputRows(  # noqa: N802 - PySpark's name
        self,
        key: Any,
        rows: Iterator[pd.DataFrame],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        """The processor's rows out for one group, as DataFrames."""
        out = self.processor.handleInputRows(key, rows_of(rows, self.input_type), timerValues)
        return frames_of(out, self.output_names)

    def close(self) -> None:
        self.processor.close()


def rows_of(frames: Iterator[pd.DataFrame], input_type: StructType) -> Iterator[Any]:
    """The Spark ``Row``s of ``frames``, whose columns are ``input_type``'s as the JVM sent them."""
    from pyspark.sql import Row

    names = tuple(input_type.names)
    # Per input column, what makes its pandas values the rows' Python values.
    readers = tuple(_column_reader(field.dataType) for field in input_type.fields)
    make_row = Row(*names)
    for frame in frames:
        columns = [read(frame[name]) for name, read in zip(names, readers, strict=True)]
        for values in zip(*columns, strict=True):
            yield make_row(*values)


def frames_of(rows: Iterator[Any], names: tuple[str, ...]) -> Iterator[pd.DataFrame]:
    """``rows`` (tuples in ``names``' order) as DataFrames of up to ``_ROWS_PER_FRAME`` rows.

    Each column an object column of the rows' own values: pandas would turn a column of
    ints and ``None`` into floats.
    """
    import pandas as pd

    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= _ROWS_PER_FRAME:
            yield _frame(batch, names, pd)
            batch = []
    if batch:
        yield _frame(batch, names, pd)


def _frame(rows: list[Any], names: tuple[str, ...], pd: Any) -> pd.DataFrame:
    columns = zip(*rows, strict=True)
    return pd.DataFrame(
        {name: pd.Series(column, dtype=object) for name, column in zip(names, columns, strict=True)}
    )


def _column_reader(data_type: Any) -> Callable[[pd.Series], list[Any]]:
    """What turns a pandas column of ``data_type`` (as the JVM sent it) into Python values."""
    from pyspark.sql.types import IntegralType, LongType

    if isinstance(data_type, LongType):
        return _exact_longs
    if isinstance(data_type, IntegralType):
        return _ints
    return _values


def _values(column: pd.Series) -> list[Any]:
    return column.tolist()  # type: ignore[no-any-return]


def _ints(column: pd.Series) -> list[Any]:
    """An int column: floats where it has nulls (NaN for a null), else ints."""
    if column.dtype.kind != "f":
        return column.tolist()  # type: ignore[no-any-return]
    return [None if math.isnan(value) else int(value) for value in column.tolist()]


def _exact_longs(column: pd.Series) -> list[Any]:
    """A long column: ints, or ``decimal.Decimal`` and ``None`` if it crossed as a decimal."""
    if column.dtype.kind in "iu":
        return column.tolist()  # type: ignore[no-any-return]
    return [None if value is None else int(value) for value in column.tolist()]
