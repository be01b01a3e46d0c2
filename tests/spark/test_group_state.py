"""A row-based stateful processor on PySpark 3.5's ``applyInPandasWithState``."""

from __future__ import annotations

import decimal
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pandas as pd
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream as ScriptedStream
from apache_beam.transforms import userstate, window
from apache_beam.transforms.window import TimestampedValue
from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from beam_spark_runner.spark.group_state import CellsHandle, RowsOverGroupState
from tests.conftest import SPARK_TEST_MASTER
from tests.file_outputs import WriteEach, group_state_operator, written

_INPUT = StructType(
    [
        StructField("target", IntegerType()),
        StructField("watermark", LongType()),
        StructField("element", BinaryType()),
    ]
)
_OUTPUT = StructType([StructField("target", IntegerType()), StructField("count", LongType())])
# Beam's latest timestamp in microseconds: a long a float cannot hold.
HIGHEST = 9_223_372_036_854_775_000


def test_value_and_list_states_are_cells_of_the_current_scope() -> None:
    handle = CellsHandle()
    value = handle.getValueState("shard")
    waiting = handle.getListState("waiting")
    handle.scoped((1, 0))
    assert not value.exists() and not waiting.exists()
    value.update((b"one",))
    waiting.appendList([(b"t", b"a")])
    waiting.appendValue((b"u", b"b"))
    handle.scoped((2, 0))
    assert not value.exists() and list(waiting.get()) == []
    value.update((b"two",))
    handle.scoped((1, 0))
    assert value.get() == (b"one",)
    assert list(waiting.get()) == [(b"t", b"a"), (b"u", b"b")]
    waiting.put([(b"u", b"b")])
    assert list(waiting.get()) == [(b"u", b"b")]
    waiting.clear()
    value.clear()
    assert not value.exists() and not waiting.exists()
    assert handle.cells == {((2, 0), "shard"): (b"two",)}


def test_cells_round_trip_and_no_cells_encode_as_none() -> None:
    handle = CellsHandle()
    handle.getValueState("shard").update((b"x",))
    encoded = handle.dump()
    assert encoded is not None
    other = CellsHandle()
    other.load(encoded)
    assert other.getValueState("shard").get() == (b"x",)
    other.load(None)
    assert other.cells == {} and other.dump() is None


class _Counter:
    """A row-based processor: counts each group's rows across calls, keeps their elements."""

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("count")
        self.seen = handle.getListState("seen")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        count = self.count.get()[0] if self.count.exists() else 0
        for row in rows:
            assert row.watermark in (HIGHEST, None), row  # every long exact, nulls None
            count += 1
            if row.element is not None:
                self.seen.appendValue((row.element,))
            yield (key[0], count)
        if row.element == b"forget":
            self.count.clear()
            self.seen.clear()
        else:
            self.count.update((count,))


class _GroupState:
    """PySpark's ``GroupState`` as the adapter uses it."""

    def __init__(self, value: tuple[Any, ...] | None = None) -> None:
        self.value = value
        self.updates = 0

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value
        self.updates += 1

    def remove(self) -> None:
        self.value = None


def _frames(*rows: tuple[int, Any, bytes | None]) -> Iterator[pd.DataFrame]:
    """Rows as the JVM sends them: the nullable long as ``decimal(20,0)``."""
    yield pd.DataFrame(
        {
            "target": pd.Series([r[0] for r in rows], dtype="int32"),
            "watermark": pd.Series(
                [None if r[1] is None else decimal.Decimal(r[1]) for r in rows], dtype=object
            ),
            "element": pd.Series([r[2] for r in rows], dtype=object),
        }
    )


def _call(adapter: RowsOverGroupState, state: _GroupState, *rows: Any) -> list[tuple[int, int]]:
    frames = list(adapter((7,), _frames(*rows), state))
    return [tuple(values) for frame in frames for values in frame.itertuples(index=False)]


def test_the_adapter_keeps_a_groups_states_in_its_group_state_across_calls() -> None:
    adapter = RowsOverGroupState(_Counter(), _INPUT, _OUTPUT)
    state = _GroupState()
    assert _call(adapter, state, (7, HIGHEST, b"a"), (7, None, None)) == [(7, 1), (7, 2)]
    assert state.updates == 1
    # Another processor instance (another task) reads what the first wrote.
    again = pickle.loads(pickle.dumps(adapter))
    assert _call(again, state, (7, None, b"b")) == [(7, 3)]
    cells = CellsHandle()
    cells.load(state.get[0])
    assert cells.cells == {(None, "count"): (3,), (None, "seen"): [(b"a",), (b"b",)]}


def test_the_group_state_is_written_only_after_the_last_row_out() -> None:
    adapter = RowsOverGroupState(_Counter(), _INPUT, _OUTPUT)
    state = _GroupState()
    frames = adapter((7,), _frames((7, None, b"a")), state)
    next(frames)
    assert state.updates == 0  # PySpark reads the state once the output is exhausted
    assert list(frames) == []
    assert state.updates == 1


def test_a_group_that_keeps_nothing_removes_its_group_state() -> None:
    adapter = RowsOverGroupState(_Counter(), _INPUT, _OUTPUT)
    state = _GroupState()
    _call(adapter, state, (7, None, b"a"))
    assert state.exists
    _call(adapter, state, (7, None, b"forget"))
    assert not state.exists


# The operator itself, in a streaming run: on PySpark 3.5 the only one; on 4.0+ chosen by
# the test (``group_state_operator``), so that every line runs it.


class _BufferUntilWindowEnd(beam.DoFn):  # type: ignore[misc]
    VALUES = userstate.BagStateSpec("values", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        element: Any,
        w: Any = beam.DoFn.WindowParam,
        values: Any = beam.DoFn.StateParam(VALUES),
        flush: Any = beam.DoFn.TimerParam(FLUSH),
    ) -> None:
        values.add(element[1])
        flush.set(w.end)

    @userstate.on_timer(FLUSH)
    def on_flush(
        self,
        key: Any = beam.DoFn.KeyParam,
        w: Any = beam.DoFn.WindowParam,
        values: Any = beam.DoFn.StateParam(VALUES),
    ) -> Any:
        yield [key, int(w.start), sorted(values.read())]


def _timers_over_a_test_stream(pipeline: beam.Pipeline, out: Path) -> None:
    coder = beam.coders.TupleCoder([beam.coders.StrUtf8Coder(), VarIntCoder()])
    stream = ScriptedStream(coder=coder)
    for batch in range(4):
        at = batch * 10
        stream.add_elements([TimestampedValue((key, batch), at + 1) for key in "ab"])
        stream.add_elements([TimestampedValue(("a", 100 + batch), at + 5)])
        stream.advance_watermark_to(at + 12)
    _ = (
        pipeline
        | stream.advance_watermark_to_infinity()
        | beam.WindowInto(window.FixedWindows(10))
        | beam.ParDo(_BufferUntilWindowEnd())
        | beam.ParDo(WriteEach(str(out)))
    )


@pytest.mark.spark
def test_a_stateful_dofn_with_timers_streams_on_one_group_state_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One stateful level: its (target, shard) groups on ``applyInPandasWithState``."""
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--streaming"])) as p:
        _timers_over_a_test_stream(p, tmp_path / "direct")
    expected = written(tmp_path / "direct")
    assert len(expected) == 8 and ["a", 0, [0, 100]] in expected, expected
    operators = group_state_operator(monkeypatch)
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    _timers_over_a_test_stream(pipeline, tmp_path / "spark")
    assert pipeline.run().wait_until_finish() == PipelineState.DONE
    assert written(tmp_path / "spark") == expected
    assert operators == ["target,shard"]
