"""A native combine's writers: each bundle's elements aggregated per key, in Arrow.

A stage writing a native combine's buffer (``planning.phases.native_combines``) hands Spark
one row per key and bundle: Arrow's hash aggregation over the bundle's keys
(``coders.keys``) and values (``coders.typed_values``) computes the partial ``count``,
``sum``, ``mean`` (sum and count), ``min`` or ``max`` that Spark merges in the JVM
(``translators.native_combine``), as Beam's lifted combine precombines per bundle. Integer
sums stay exact: where a bundle's values could overflow an ``int64``, its rows go one per
element and Spark adds them as ``decimal(38, 0)``. Arrow's min and max skip NaN unless all
values are NaN (Python's depend on value order). Rows have the typed output layout
(``TYPED_STAGE_OUTPUT_SCHEMA``): tag, key, a null element, the typed value and the count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from apache_beam.coders import Coder

from beam_spark_runner.coders.arrow_columns import KEY, STAGE_OUTPUT_SCHEMA
from beam_spark_runner.coders.keys import KeyExtractor
from beam_spark_runner.coders.typed_values import TypedValueReader

INT_VALUE = "int_value"
FLOAT_VALUE = "float_value"
VALUE_COUNT = "value_count"
VALUE_COLUMNS: dict[str, str] = {"int": INT_VALUE, "float": FLOAT_VALUE}
TYPED_STAGE_OUTPUT_SCHEMA = (
    STAGE_OUTPUT_SCHEMA.append(pa.field(INT_VALUE, pa.int64()))
    .append(pa.field(FLOAT_VALUE, pa.float64()))
    .append(pa.field(VALUE_COUNT, pa.int64()))
)
_VALUE = "value"


@dataclasses.dataclass(frozen=True)
class NativeOutput:
    """A stage output bound for a native combine: what it aggregates, and its coder."""

    # sum, min, max, count or mean (planning.NativeAggregation)
    function: str
    # int, float, or none (a count reads no values)
    value_type: str
    # The output's data channel coder id (how its values are written).
    coder_id: str


class PartialAggregator:
    """Turns a bundle's output stream into partial aggregates per key."""

    def __init__(self, native: NativeOutput, safe_coder: Coder, coder: Coder) -> None:
        self.native = native
        self._reader = (
            TypedValueReader(safe_coder, coder, native.value_type)
            if native.value_type in VALUE_COLUMNS
            else None
        )
        # A count reads keys only.
        self._keys = KeyExtractor(safe_coder) if self._reader is None else None

    def record_batch(self, tag: int, data: bytes, ends: Sequence[int]) -> pa.RecordBatch:
        """The partial aggregates of one output stream, in the typed output layout."""
        if self._reader is None:
            assert self._keys is not None
            keys = self._keys.key_array_and_value_starts(data, ends)[0]
            grouped = pa.table({KEY: keys}).group_by(KEY).aggregate([([], "count_all")])
            return _rows(tag, grouped[KEY], None, None, grouped["count_all"])
        keys, values = self._reader.read(data, ends)
        function = self.native.function
        if function in ("sum", "mean") and self.native.value_type == "int":
            if not _sums_fit(values):
                # Added up here, they could overflow an int64: Spark adds them exactly.
                ones = pa.array(np.ones(len(values), dtype=np.int64))
                return _rows(tag, keys, "int", pa.array(values), ones)
        aggregates: list[tuple[str, str] | tuple[list[str], str]] = []
        if function in ("sum", "mean"):
            aggregates.append((_VALUE, "sum"))
        elif function in ("min", "max"):
            aggregates.append((_VALUE, function))
        if function == "mean":
            aggregates.append(([], "count_all"))
        table = pa.table({KEY: keys, _VALUE: values})
        grouped = table.group_by(KEY).aggregate(aggregates)
        partial = grouped[f"{_VALUE}_{'sum' if function == 'mean' else function}"]
        counts = grouped["count_all"] if function == "mean" else None
        return _rows(tag, grouped[KEY], self._reader.value_type, partial, counts)


def _sums_fit(values: np.ndarray) -> bool:
    """Whether any sum of these int64 values fits in an int64."""
    if not len(values):
        return True
    limit = (2**63 - 1) // len(values)
    return -limit <= int(values.min()) and int(values.max()) <= limit


def _rows(
    tag: int,
    keys: pa.Array | pa.ChunkedArray,
    value_type: str | None,
    values: pa.Array | pa.ChunkedArray | None,
    counts: pa.Array | pa.ChunkedArray | None,
) -> pa.RecordBatch:
    count = len(keys)
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        INT_VALUE: pa.nulls(count, pa.int64()),
        FLOAT_VALUE: pa.nulls(count, pa.float64()),
        VALUE_COUNT: pa.nulls(count, pa.int64()) if counts is None else counts,
    }
    if value_type is not None and values is not None:
        columns[VALUE_COLUMNS[value_type]] = values
    arrays = [
        pa.array(np.full(count, tag, dtype=np.int32)),
        keys,
        pa.nulls(count, pa.binary()),
        columns[INT_VALUE],
        columns[FLOAT_VALUE],
        columns[VALUE_COUNT],
    ]
    combined = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    return pa.RecordBatch.from_arrays(combined, schema=TYPED_STAGE_OUTPUT_SCHEMA)
