"""The line a finished pipeline ends with: how long it took and where its output went.

A Spark run prints nothing on success at Python's default logging configuration, so a user
had to guess whether a write happened and where. After a pipeline run, the runner logs one
summary on the ``beam_spark_runner.summary`` logger at WARNING, the level Python shows by
default (``logging.getLogger("beam_spark_runner.summary").setLevel(logging.ERROR)``
silences it): the run's duration and the files its file writes produced.

The files come from the Python pipeline's file writes (Beam's ``FileBasedSink`` writes:
``WriteToText``, ``WriteToParquet``, ``WriteToAvro``, ...: the files named by their prefix
and suffix; ``fileio.WriteToFiles``, as the DataFrame API's ``to_csv`` uses: the files of
its directory), matched on the driver after the run and kept if written since it started.
A pipeline run from a proto (``run_proto``) has no Python transforms to read them from and
gets no summary.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from beam_spark_runner import beam_internals as bi

SUMMARY_LOGGER = logging.getLogger("beam_spark_runner.summary")
MAX_LISTED_FILES = 5
# Some file systems keep modification times in whole seconds.
_MTIME_SLACK_S = 0.5


def _static(value: Any) -> str | None:
    if value is None:
        return None
    if hasattr(value, "is_accessible"):
        return str(value.get()) if value.is_accessible() else None
    return str(value)


def output_patterns(pipeline: Any) -> list[str]:
    """Glob patterns matching the files the pipeline's file writes produce."""
    from apache_beam.io import iobase
    from apache_beam.io.filebasedsink import FileBasedSink
    from apache_beam.io.filesystems import FileSystems

    # Only where the pipeline could have used it: importing Beam's fileio from here made a
    # later pipeline's stateful DoFn fail Beam's key-value input check in to_runner_api
    # (tests/rewrites/test_batch_test_stream.py; cause not found yet).
    fileio = sys.modules.get("apache_beam.io.fileio")
    patterns: list[str] = []
    for transform in bi.python_transforms(pipeline):
        sink = getattr(transform, "sink", None)
        if isinstance(transform, iobase.Write) and isinstance(sink, FileBasedSink):
            prefix = _static(sink.file_path_prefix)
            suffix = _static(sink.file_name_suffix) or ""
            if prefix is not None:
                patterns.append(f"{prefix}*{suffix}")
        elif fileio is not None and isinstance(transform, fileio.WriteToFiles):
            directory = _static(transform.path)
            if directory is not None:
                patterns.append(FileSystems.join(directory, "*"))
    return list(dict.fromkeys(patterns))


def written_files(patterns: list[str], since: float) -> list[str]:
    """The files matching ``patterns`` modified at or after ``since`` (epoch seconds)."""
    from apache_beam.io.filesystems import FileSystems

    files: list[str] = []
    for pattern in patterns:
        try:
            matches = FileSystems.match([pattern])[0].metadata_list
        except Exception:  # noqa: BLE001 - a summary never fails a finished run
            continue
        for metadata in matches:
            modified = getattr(metadata, "last_updated_in_seconds", None) or 0
            if modified >= since - _MTIME_SLACK_S:
                files.append(metadata.path)
    return sorted(dict.fromkeys(files))


def describe(job_name: str, elapsed_s: float, files: list[str]) -> str:
    """The summary line."""
    message = f"Beam pipeline {job_name} finished on Spark in {elapsed_s:.1f} s"
    if not files:
        return message + "."
    listed = ", ".join(files[:MAX_LISTED_FILES])
    more = f" and {len(files) - MAX_LISTED_FILES} more" if len(files) > MAX_LISTED_FILES else ""
    noun = "file" if len(files) == 1 else "files"
    return f"{message}; it wrote {len(files)} {noun}: {listed}{more}."


def log_summary(job_name: str, started_wall: float, elapsed_s: float, patterns: list[str]) -> None:
    """Logs the summary of a finished run (see the module docstring)."""
    files = written_files(patterns, started_wall) if patterns else []
    SUMMARY_LOGGER.warning(describe(job_name, elapsed_s, files))


def now() -> tuple[float, float]:
    """(wall clock, monotonic clock) at the start of a run."""
    return time.time(), time.monotonic()
