"""A ``MatchContinuously`` without a start time starts when its pipeline runs, not at import.

Beam's default ``start_timestamp=Timestamp.now()`` is evaluated when ``apache_beam.io.fileio``
is imported; the deduplicating expansion then polls ``ceil((stop - start) / interval)``
times, one per interval, so in a process that imported ``fileio`` minutes earlier the query
ran minutes past its stop timestamp (the test suite's MatchContinuously hang). No Spark
here: ``run_streaming`` is replaced by one that stops the run once the runner has prepared
the pipeline.
"""

from __future__ import annotations

import inspect
import math
import time
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import PipelineVisitor
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner.runner import SparkStructuredRunner

# How long before the pipeline Beam's fileio was imported, in the tests below.
IMPORTED_AGO = 600.0


class _Prepared(Exception):
    """Raised instead of starting a query: the pipeline is as the runner would run it."""


@pytest.fixture
def fileio_imported_long_ago(monkeypatch: pytest.MonkeyPatch) -> Timestamp:
    """Beam's default start as in a process that imported ``fileio`` 10 minutes ago."""
    init = fileio.MatchContinuously.__init__
    names = list(inspect.signature(init).parameters)[1:]  # without self
    defaults = list(init.__defaults__)
    offset = len(names) - len(defaults)
    old = Timestamp.of(time.time() - IMPORTED_AGO)
    defaults[names.index("start_timestamp") - offset] = old
    monkeypatch.setattr(init, "__defaults__", tuple(defaults))

    def prepared_only(self: Any, proto: Any, options: Any, settings: Any = None) -> Any:
        raise _Prepared

    monkeypatch.setattr(SparkStructuredRunner, "run_streaming", prepared_only)
    return old


def _run_until_prepared(pipeline: beam.Pipeline) -> None:
    with pytest.raises(_Prepared):
        pipeline.run()


def _streaming_pipeline() -> beam.Pipeline:
    return beam.Pipeline(options=PipelineOptions(["--runner=SparkStructuredRunner", "--streaming"]))


class _Find(PipelineVisitor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.transforms: list[Any] = []

    def enter_composite_transform(self, applied: Any) -> None:
        self.visit_transform(applied)

    def visit_transform(self, applied: Any) -> None:
        self.transforms.append(applied.transform)


def _transforms(pipeline: beam.Pipeline) -> list[Any]:
    finder = _Find()
    pipeline.visit(finder)
    return finder.transforms


def _polls(pipeline: beam.Pipeline) -> int:
    """How many polls the pipeline's file matching makes before it stops.

    Newer Beam expands a deduplicating ``MatchContinuously`` into a ``Watch`` whose DoFn
    carries its poll budget; Beam 2.69 (the oldest line we support) into a
    ``PeriodicImpulse`` firing once per interval from its start to its stop timestamp.
    """
    transforms = _transforms(pipeline)
    budgets = [
        int(transform.fn._termination._max_polls)  # noqa: SLF001 - what the Watch DoFn runs with
        for transform in transforms
        if isinstance(transform, beam.ParDo)
        and hasattr(getattr(transform.fn, "_termination", None), "_max_polls")
    ]
    if not budgets:
        budgets = [
            math.ceil(
                (Timestamp.of(impulse.stop_ts) - Timestamp.of(impulse.start_ts)).micros
                / 1e6
                / impulse.interval
            )
            for impulse in transforms
            if isinstance(impulse, PeriodicImpulse)
        ]
    assert len(budgets) == 1, budgets
    return budgets[0]


def test_a_match_without_start_time_polls_only_until_its_stop_time(
    tmp_path: Any, fileio_imported_long_ago: Timestamp
) -> None:
    pipeline = _streaming_pipeline()
    _ = pipeline | fileio.MatchContinuously(
        str(tmp_path / "*.txt"), interval=2, stop_timestamp=time.time() + 45
    )
    # Beam's expansion, built with the import-time start: 10.75 minutes of polls.
    assert _polls(pipeline) > (IMPORTED_AGO + 45) / 2
    _run_until_prepared(pipeline)
    # Started when the pipeline ran: 45 s of polls every 2 s.
    assert _polls(pipeline) in (23, 24)
    (match,) = [t for t in _transforms(pipeline) if isinstance(t, fileio.MatchContinuously)]
    assert abs(float(match.start_ts) - time.time()) < 30


def test_a_match_without_deduplication_does_not_fire_the_intervals_since_the_import(
    tmp_path: Any, fileio_imported_long_ago: Timestamp
) -> None:
    pipeline = _streaming_pipeline()
    _ = pipeline | fileio.MatchContinuously(
        str(tmp_path / "*.txt"),
        interval=2,
        has_deduplication=False,
        stop_timestamp=time.time() + 45,
    )
    _run_until_prepared(pipeline)
    (impulse,) = [t for t in _transforms(pipeline) if isinstance(t, PeriodicImpulse)]
    assert abs(float(impulse.start_ts) - time.time()) < 30


def test_an_explicit_start_time_is_kept(tmp_path: Any, fileio_imported_long_ago: Timestamp) -> None:
    now = time.time()
    start = Timestamp.of(now - 60)
    pipeline = _streaming_pipeline()
    _ = pipeline | fileio.MatchContinuously(
        str(tmp_path / "*.txt"), interval=2, start_timestamp=start, stop_timestamp=now + 40
    )
    _run_until_prepared(pipeline)
    assert _polls(pipeline) == 50
    (match,) = [t for t in _transforms(pipeline) if isinstance(t, fileio.MatchContinuously)]
    assert match.start_ts is start


def test_a_stop_time_already_past_starts_there(
    tmp_path: Any, fileio_imported_long_ago: Timestamp
) -> None:
    stop = Timestamp.of(time.time() - 5)
    pipeline = _streaming_pipeline()
    _ = pipeline | fileio.MatchContinuously(
        str(tmp_path / "*.txt"), interval=2, stop_timestamp=stop
    )
    _run_until_prepared(pipeline)
    (match,) = [t for t in _transforms(pipeline) if isinstance(t, fileio.MatchContinuously)]
    assert match.start_ts == stop
