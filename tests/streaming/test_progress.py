"""The streaming progress line and the falling-behind warning (no Spark)."""

from __future__ import annotations

import logging

import pytest

from beam_spark_runner.streaming.progress import BEHIND_AFTER, ProgressReport
from beam_spark_runner.streaming.watermarks import MAX_MICROS

NAMES = {1: "GroupByKey counts", 3: "Format -> Write"}


def _progress(batch: int, millis: int) -> dict:
    return {
        "batchId": batch,
        "durationMs": {"triggerExecution": millis},
        "inputRowsPerSecond": 12.5,
        "processedRowsPerSecond": 40.0,
    }


def test_the_line_names_the_slowest_transform_and_the_batch() -> None:
    report = ProgressReport("wordcount", 0.0, NAMES)
    line = report.line(
        _progress(7, 1500),
        # Shards of node 1 disagree: the node is as slow as its slowest shard.
        {"1#0": 20_000_000, "1#1": 10_000_000, "3#0": 15_000_000, "impulse": MAX_MICROS},
    )
    assert "micro-batch 7 took 1.5 s" in line
    assert "12.5 input rows/s" in line and "40.0 processed rows/s" in line
    assert "slowest transform 'GroupByKey counts' at watermark 1970-01-01T00:00:10Z" in line


def test_the_line_before_any_batch() -> None:
    line = ProgressReport("wordcount", 0.0, NAMES).line(None, {})
    assert line == "Beam pipeline wordcount (streaming), no micro-batch completed yet"


def test_batches_over_the_interval_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    report = ProgressReport("wordcount", 1.0, NAMES)
    slow = [_progress(b, 2500) for b in range(BEHIND_AFTER)]
    with caplog.at_level(logging.WARNING):
        assert not report.falls_behind(slow[:-1])
        # The same progress seen again counts once.
        assert not report.falls_behind(slow[:-1])
        assert report.falls_behind(slow)
        assert report.falls_behind(slow)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot keep up" in warnings[0]
    # A batch within the interval resets the count.
    assert not report.falls_behind([*slow, _progress(BEHIND_AFTER, 500)])


def test_without_a_trigger_interval_nothing_falls_behind() -> None:
    report = ProgressReport("wordcount", 0.0, NAMES)
    assert not report.falls_behind([_progress(b, 60_000) for b in range(10)])
