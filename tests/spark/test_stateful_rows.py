"""A row-based stateful processor on PySpark's ``transformWithState`` or its pandas form (4.0)."""

from __future__ import annotations

import decimal
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from beam_spark_runner.spark.compat import has_row_state, has_state_processor

if not has_state_processor():
    pytest.skip(
        "runs processors on transformWithState (rows, PySpark 4.1+) or transformWithStateInPandas "
        "(4.0); this PySpark has neither (its levels run on applyInPandasWithState: "
        "tests/spark/test_group_state.py)",
        allow_module_level=True,
    )

from beam_spark_runner.spark import stateful_rows  # noqa: E402
from beam_spark_runner.spark.stateful_rows import (  # noqa: E402
    RowsOverPandas,
    frames_of,
    transform_with_state,
)

# Beam's earliest and latest timestamps in microseconds: longs a float cannot hold.
LOWEST = -9_223_372_036_854_775_000
HIGHEST = 9_223_372_036_854_775_000

SCHEMA = StructType(
    [
        StructField("target", IntegerType(), False),
        StructField("port", IntegerType()),
        StructField("watermark", LongType()),
        StructField("element", BinaryType()),
        StructField("producer", StringType()),
    ]
)
NAMES = tuple(SCHEMA.names)
# What a row-based processor yields (PySpark 4.1+ reads its rows out by name).
OUT = Row(*NAMES)


class _Echo:
    """A row-based processor: records its rows and yields them back, then one of its own."""

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.handles: list[Any] = []
        self.closed = 0

    def init(self, handle: Any) -> None:
        self.handles.append(handle)

    def handleInputRows(  # noqa: N802 - PySpark's name
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[Any]:
        for row in rows:
            self.rows.append(row)
            yield row
        yield (int(key[0]), None, HIGHEST, None, "end")

    def close(self) -> None:
        self.closed += 1


def _as_pyspark_40_sends(frame: dict[str, list[Any]]) -> pd.DataFrame:
    """What 4.0 hands a processor: the long column as decimals, ints with nulls as floats."""
    return pd.DataFrame(
        {
            "target": pd.Series(frame["target"], dtype="int32"),
            "port": pd.Series(frame["port"], dtype="float64"),
            "watermark": pd.Series(
                [None if v is None else decimal.Decimal(v) for v in frame["watermark"]],
                dtype=object,
            ),
            "element": pd.Series(frame["element"], dtype=object),
            "producer": pd.Series(frame["producer"], dtype=object),
        }
    )


def test_the_processor_reads_rows_with_every_long_exact_and_nulls_as_none() -> None:
    echo = _Echo()
    adapter = RowsOverPandas(echo, SCHEMA, SCHEMA)  # type: ignore[arg-type]
    frame = _as_pyspark_40_sends(
        {
            "target": [3, 3],
            "port": [None, 2],
            "watermark": [LOWEST, None],
            "element": [None, b"\x00elements"],
            "producer": ["source", None],
        }
    )
    out = list(adapter.handleInputRows((3, 0), iter([frame]), None))
    assert [tuple(row) for row in echo.rows] == [
        (3, None, LOWEST, None, "source"),
        (3, 2, None, b"\x00elements", None),
    ]
    assert all(type(value) is int for value in (echo.rows[0][2], echo.rows[1][1]))
    # Read by name too, as the level's shards read Spark's rows.
    assert echo.rows[0]["watermark"] == LOWEST
    assert echo.rows[1]["element"] == b"\x00elements"
    # Back as PySpark turns a DataFrame into Arrow: the longs as exact as they came.
    (back,) = out
    assert list(back.columns) == list(NAMES)
    assert pa.Array.from_pandas(back["watermark"], type=pa.int64()).to_pylist() == [
        LOWEST,
        None,
        HIGHEST,
    ]
    assert pa.Array.from_pandas(back["port"], type=pa.int32()).to_pylist() == [None, 2, None]


def test_the_processor_declares_its_state_and_closes_through_the_adapter() -> None:
    echo = _Echo()
    adapter = RowsOverPandas(echo, SCHEMA, SCHEMA)  # type: ignore[arg-type]
    handle = object()
    adapter.init(handle)  # type: ignore[arg-type]
    adapter.close()
    assert echo.handles == [handle]
    assert echo.closed == 1


def test_rows_out_are_cut_into_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stateful_rows, "_ROWS_PER_FRAME", 2)
    rows = [(n, None, n, None, None) for n in range(5)]
    frames = list(frames_of(iter(rows), NAMES))
    assert [len(frame) for frame in frames] == [2, 2, 1]
    assert [t for frame in frames for t in frame["target"]] == list(range(5))


def test_no_rows_out_is_no_frame() -> None:
    assert list(frames_of(iter([]), NAMES)) == []


def test_the_module_a_pre_init_unpickles_imports_no_beam(run_python: Any) -> None:
    code = (
        "import sys\n"
        "import beam_spark_runner.spark.stateful_rows\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'))\n"
    )
    completed = run_python(["-c", code])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


class _Count:
    """Counts each group's rows across micro-batches in a value state; passes rows on."""

    def init(self, handle: Any) -> None:
        count_type = StructType([StructField("count", LongType())])
        self.count = handle.getValueState("count", count_type)

    def handleInputRows(  # noqa: N802 - PySpark's name
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[Any]:
        seen = self.count.get()[0] if self.count.exists() else 0
        for row in rows:
            seen += 1
            yield OUT(row["target"], row["port"], row["watermark"], row["element"], row["producer"])
        self.count.update((seen,))
        yield OUT(int(key[0]), -1, seen, None, "count")

    def close(self) -> None:
        """Nothing to release."""


_MODES = [True] + ([False] if has_row_state() else [])


@pytest.mark.parametrize("pandas", _MODES, ids=lambda p: "pandas" if p else "rows")
def test_two_chained_processors_keep_their_state_and_exact_longs(
    spark_session: Any, tmp_path: Path, pandas: bool
) -> None:
    """A file stream of two micro-batches through two processors in one query."""
    from beam_spark_runner.streaming.query import ensure_state_store

    ensure_state_store(spark_session)
    source = tmp_path / "in"
    source.mkdir()
    arrow_schema = pa.schema(
        [
            pa.field("target", pa.int32(), nullable=False),
            pa.field("port", pa.int32()),
            pa.field("watermark", pa.int64()),
            pa.field("element", pa.binary()),
            pa.field("producer", pa.string()),
        ]
    )
    batches = [
        [(1, 0, LOWEST, None, "a"), (1, None, None, b"x", None)],
        [(1, 0, HIGHEST, None, "a")],
    ]
    for number, rows in enumerate(batches):
        columns = list(zip(*rows, strict=True))
        table = pa.table(
            [pa.array(c, f.type) for c, f in zip(columns, arrow_schema, strict=True)],
            schema=arrow_schema,
        )
        path = source / f"{number}.parquet"
        pq.write_table(table, path)
        # The file source reads the oldest file first: one file per micro-batch, in order.
        os.utime(path, (1_000_000 + number, 1_000_000 + number))
    frame = (
        spark_session.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(source))
    )
    for _ in range(2):
        frame = transform_with_state(frame, ["target"], _Count(), SCHEMA, pandas=pandas)
    seen: list[list[tuple[Any, ...]]] = []
    query = (
        frame.writeStream.foreachBatch(
            lambda batch, _: seen.append(sorted(map(tuple, batch.collect()), key=repr))
        )
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    # Level 2 counts level 1's rows out (its count row too): 3, then 3 + 2.
    assert seen == [
        sorted(
            [
                (1, 0, LOWEST, None, "a"),
                (1, None, None, b"x", None),
                (1, -1, 2, None, "count"),
                (1, -1, 3, None, "count"),
            ],
            key=repr,
        ),
        sorted(
            [(1, 0, HIGHEST, None, "a"), (1, -1, 3, None, "count"), (1, -1, 5, None, "count")],
            key=repr,
        ),
    ]
