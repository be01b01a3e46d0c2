"""A query's stateful levels and the routers between them in one group (PySpark 3.5)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_spark_runner.spark.group_state import CellsHandle
from beam_spark_runner.streaming.level_chain import LevelChain
from beam_spark_runner.streaming.rows import TARGET, routed_row
from tests.conftest import SPARK_TEST_MASTER
from tests.file_outputs import WriteEach, group_state_operator, written


class _Level:
    """A level of nodes ``mine``: counts each (target, shard)'s rows, sends them to ``to``."""

    def __init__(self, mine: set[int], to: int, log: list[Any]) -> None:
        self.mine = mine
        self.to = to
        self.log = log

    def init(self, handle: Any) -> None:
        self.count = handle.getValueState("shard")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:  # noqa: N802, N803
        if key[0] not in self.mine:
            yield from rows
            return
        rows = list(rows)
        count = (self.count.get()[0] if self.count.exists() else 0) + len(rows)
        self.count.update((count,))
        self.log.append((key, count))
        make_row = routed_row()
        for row in rows:
            yield make_row(self.to, row[1], None, row[3], None, None, None, 0)


def _router(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Router 1: sends what reaches node 2 on to node 3."""
    for batch in batches:
        targets = batch.column(TARGET)
        moved = pc.if_else(pc.equal(targets, 2), 3, targets)
        yield batch.set_column(0, TARGET, moved)


def _row(target: int, shard: int, element: bytes) -> Any:
    return (target, shard, None, element, None, None, None, 0, 0)  # the group's column last


def test_the_chain_runs_each_level_by_target_and_shard_then_the_router_between() -> None:
    log: list[Any] = []
    chain = LevelChain([_Level({1}, 2, log), _Level({3}, 9, log)], [_router])
    handle = CellsHandle()
    chain.init(handle)
    rows = [_row(1, 1, b"a"), _row(1, 0, b"b"), _row(1, 1, b"c"), _row(9, 0, b"through")]
    out = list(chain.handleInputRows((0,), iter(rows), None))
    # Level 1's groups in order, then level 2 on what router 1 readdressed.
    assert log == [((1, 0), 1), ((1, 1), 2), ((3, 0), 1), ((3, 1), 2)]
    assert sorted((row[0], row[1], row[3]) for row in out) == [
        (9, 0, b"b"),
        (9, 0, b"through"),
        (9, 1, b"a"),
        (9, 1, b"c"),
    ]
    assert all(len(row) == 8 for row in out)  # routed rows, without the group's column
    # Each (target, shard) its own cells, kept for the next micro-batch.
    assert handle.cells == {
        ((1, 0), "shard"): (1,),
        ((1, 1), "shard"): (2,),
        ((3, 0), "shard"): (1,),
        ((3, 1), "shard"): (2,),
    }
    list(chain.handleInputRows((0,), iter([_row(1, 0, b"d")]), None))
    assert handle.cells[((1, 0), "shard")] == (2,) and handle.cells[((3, 0), "shard")] == (2,)


def test_a_missing_router_between_two_levels_passes_rows_on() -> None:
    log: list[Any] = []
    chain = LevelChain([_Level({1}, 3, log), _Level({3}, 9, log)], [None])
    chain.init(CellsHandle())
    out = list(chain.handleInputRows((0,), iter([_row(1, 0, b"a")]), None))
    assert [(row[0], row[3]) for row in out] == [(9, b"a")]
    assert log == [((1, 0), 1), ((3, 0), 1)]


# The chain in a streaming run: on PySpark 3.5 the only way to run several levels; on
# 4.0+ chosen by the test (``group_state_operator``), so that every line runs it.

_START = 1_000_000_000.0


def _key_of_tick(tick: float) -> tuple[str, int]:
    return f"k{int(tick) % 3}", 1


def _windowed_sums(pipeline: beam.Pipeline) -> Any:
    return (
        pipeline
        | PeriodicImpulse(start_timestamp=_START, stop_timestamp=_START + 30, fire_interval=1)
        | beam.Map(_key_of_tick)
        | beam.WindowInto(window.FixedWindows(10))
        | beam.CombinePerKey(sum)
        | beam.Map(lambda kv, w=beam.DoFn.WindowParam: [kv[0], kv[1], int(w.start)])
    )


@pytest.mark.spark
def test_a_windowed_combine_over_periodic_impulse_streams_in_one_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two stateful levels (the splittable DoFn's, the combine's), and assert_that's third."""
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--streaming"])) as p:
        _ = _windowed_sums(p) | beam.ParDo(WriteEach(str(tmp_path / "direct")))
    expected = written(tmp_path / "direct")
    assert len(expected) == 9 and sum(row[1] for row in expected) == 30, expected
    operators = group_state_operator(monkeypatch)
    options = PipelineOptions(
        ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_TEST_MASTER}", "--streaming"]
    )
    pipeline = beam.Pipeline(options=options)
    sums = _windowed_sums(pipeline)
    _ = sums | beam.ParDo(WriteEach(str(tmp_path / "spark")))
    assert_that(sums, equal_to(expected))
    assert pipeline.run().wait_until_finish() == PipelineState.DONE
    assert written(tmp_path / "spark") == expected
    assert operators == ["chain"]
    assert "stateful levels run in one task per micro-batch" in caplog.text
