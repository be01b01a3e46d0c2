"""The mapInArrow versions of the workloads give the RDD versions' results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import arrow
from benchmarks.data import text_file
from benchmarks.workloads import WORKLOADS, Inputs, Sizes

TINY = Sizes(elements=3_000, keys=50, text_mb=0.02, events=6_000, seeds=4)


def test_rows_go_in_arrow_batches_of_sparks_size() -> None:
    rows = [(i, str(i)) for i in range(arrow.ARROW_BATCH_ROWS + 5)]
    batches = list(arrow.record_batches(rows, ["n", "s"], ["long", "string"]))
    assert [b.num_rows for b in batches] == [arrow.ARROW_BATCH_ROWS, 5]
    assert batches[1].column("s").to_pylist()[-1] == str(len(rows) - 1)
    assert list(arrow.record_batches([], ["n"], ["long"])) == []


def test_event_fields_are_the_sql_versions_columns() -> None:
    from benchmarks import nexmark

    for n in (0, 1, 5):
        fields = arrow.event_fields(nexmark.event(n))
        assert set(fields) <= set(arrow.EVENT_FIELDS)
        assert fields["ms"] == nexmark.BASE_TIME_MS + n


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_mapinarrow_version_gives_the_rdd_versions_summary(
    spark_session: Any, tmp_path: Path, name: str
) -> None:
    inputs = Inputs(TINY)
    if name == "wordcount":
        path, words = text_file(tmp_path, TINY.text_mb)
        inputs = Inputs(TINY, path, words)
    workload = WORKLOADS[name]
    expected = workload.pyspark(spark_session, inputs)
    assert expected.results > 0, "the workload has results to compare at this size"
    assert workload.pyspark_arrow(spark_session, inputs) == expected
