"""The user code alone gives the same output summaries as the benchmark's other lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import run, user_code, worker
from benchmarks.data import text_file
from benchmarks.workloads import DEFAULT_WORKLOADS, WORKLOADS, Inputs, Sizes

TINY = Sizes(elements=3_000, keys=50, text_mb=0.02, events=6_000, seeds=4)
# Beam's q3 outputs nothing on FnApiRunner (docs/performance.md, "Known limits"): its
# user code is checked against the hand-written PySpark line instead, below.
AGREES_WITH_DIRECT_RUNNER = [w for w in DEFAULT_WORKLOADS if w != "nexmark-q3"]


def _inputs(name: str, directory: Path) -> Inputs:
    if name == "wordcount":
        path, words = text_file(directory, TINY.text_mb)
        return Inputs(TINY, path, words)
    return Inputs(TINY)


@pytest.mark.parametrize("name", AGREES_WITH_DIRECT_RUNNER)
def test_user_code_gives_direct_runners_summary(tmp_path: Path, name: str) -> None:
    inputs = _inputs(name, tmp_path)
    expected = worker.RUNNERS["direct"](name, inputs)
    assert expected.results > 0, "the workload has results to compare at this size"
    assert worker.RUNNERS["user-code"](name, inputs) == expected


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_user_code_gives_the_rdd_versions_summary(
    spark_session: Any, tmp_path: Path, name: str
) -> None:
    inputs = _inputs(name, tmp_path)
    expected = WORKLOADS[name].pyspark(spark_session, inputs)
    assert expected.results > 0, "the workload has results to compare at this size"
    assert user_code.run(name, inputs) == expected


def test_user_code_counts_and_sums_what_it_is_given() -> None:
    assert user_code.tally([3, 4, 5], lambda x: x * 2) == user_code.Summary(3, 24)
    assert user_code.tally([], int) == user_code.Summary(0, 0)


def test_user_code_refuses_a_workload_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="no user-code version of workload 'nope'"):
        user_code.run("nope", Inputs(TINY))


def test_make_bench_runs_the_user_code_line() -> None:
    assert "user-code" in run.DEFAULT_RUNNERS
