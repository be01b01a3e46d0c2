"""User code's log records in Spark's workers, brought to the driver's log.

Beam's SDK harness sends user code's log records to the runner, at
``--default_sdk_harness_log_level`` (INFO by default) with
``--sdk_harness_log_level_overrides`` per logger; Spark's Python workers have no such
channel. So each task records what its code logs at those levels (capped per task) into a
Spark accumulator, and when the run ends the runner logs each record on the driver through
the logger of the same name, with its Beam step: the driver's logging configuration decides
whether and where it goes. Records of failed attempts are lost with their accumulator
updates; a failing task's error reaches the driver as its ``PipelineExecutionError``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from apache_beam.options import pipeline_options
from pyspark.accumulators import AccumulatorParam

from beam_spark_runner import beam_internals as bi

MAX_RECORDS_PER_TASK = 1000
DEFAULT_LEVEL = logging.INFO


class LogRecord(NamedTuple):
    """A worker's log record, as sent to the driver."""

    logger: str
    level: int
    message: str
    step: str | None
    exception: str | None


@dataclass(frozen=True)
class LogLevels:
    """The levels workers log at: a default, and overrides per logger name (Beam's)."""

    default: int = DEFAULT_LEVEL
    overrides: Mapping[str, int] = field(default_factory=dict)


def _level(value: object, option: str) -> int:
    text = str(value).strip().upper()
    if text.isdecimal():
        return int(text)
    level = logging.getLevelName(text)
    if isinstance(level, int):
        return level
    raise ValueError(
        f"{option}: {value!r} is not a log level. Expected a name (DEBUG, INFO, WARNING, "
        "ERROR, CRITICAL) or a number, e.g. --default_sdk_harness_log_level=DEBUG or "
        '--sdk_harness_log_level_overrides=\'{"my.module": "DEBUG"}\'.'
    )


def log_levels(options: Any) -> LogLevels:
    """The worker log levels a pipeline's options choose; raises ValueError if invalid."""
    # From a view of the declaring class, as Beam's harness reads them: get_all_options
    # would parse the flags of every options class Beam knows.
    worker = options.view_as(pipeline_options.WorkerOptions)
    default = worker.default_sdk_harness_log_level
    overrides = worker.sdk_harness_log_level_overrides or {}
    if isinstance(overrides, str):
        overrides = json.loads(overrides)
    if not isinstance(overrides, dict):
        raise ValueError(
            f"--sdk_harness_log_level_overrides: expected a JSON object of logger name to "
            f'level, e.g. \'{{"my.module": "DEBUG"}}\', found {overrides!r}.'
        )
    return LogLevels(
        default=DEFAULT_LEVEL
        if default is None
        else _level(default, "--default_sdk_harness_log_level"),
        overrides={
            name: _level(level, "--sdk_harness_log_level_overrides")
            for name, level in overrides.items()
        },
    )


class LogsParam(AccumulatorParam):
    """Accumulates log records (each task caps its own, see ``recording``)."""

    def zero(self, value: list[LogRecord]) -> list[LogRecord]:
        """No records."""
        return []

    def addInPlace(  # noqa: N802 - PySpark's API
        self, value1: list[LogRecord], value2: list[LogRecord]
    ) -> list[LogRecord]:
        """Both lists' records, in order."""
        value1.extend(value2)
        return value1


def new_accumulator(spark_context: Any) -> Any:
    """A fresh accumulator for one pipeline run."""
    return spark_context.accumulator([], LogsParam())


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[LogRecord] = []
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) >= MAX_RECORDS_PER_TASK:
            self.dropped += 1
            return
        try:
            message = record.getMessage()
        except Exception as error:  # noqa: BLE001 - a bad format string must not fail user code
            message = f"{record.msg!r} (unformattable: {error})"
        exception = None
        if record.exc_info:
            exception = logging.Formatter().formatException(record.exc_info)
        self.records.append(
            LogRecord(record.name, record.levelno, message, bi.current_step_name(), exception)
        )


_lock = threading.Lock()


@contextlib.contextmanager
def recording(sink: Any, levels: LogLevels) -> Iterator[None]:
    """Records what is logged inside the block at ``levels`` and adds it to ``sink``."""
    if sink is None:
        yield
        return
    root = logging.getLogger()
    recorder = _Recorder()
    with _lock:
        saved = {name: logging.getLogger(name).level for name in levels.overrides}
        saved_root = root.level
        # The recorder is the root's only handler meanwhile, as Beam's harness sends records
        # to the runner only: a handler the worker process got (Python's basicConfig on a
        # first logging.warning) would print each record in the executor's log as well.
        saved_handlers = root.handlers[:]
        root.handlers[:] = [recorder]
        root.setLevel(levels.default)
        for name, level in levels.overrides.items():
            logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        with _lock:
            root.handlers[:] = saved_handlers
            root.setLevel(saved_root)
            for name, level in saved.items():
                logging.getLogger(name).setLevel(level)
        if recorder.dropped:
            recorder.records.append(
                LogRecord(
                    __name__,
                    logging.WARNING,
                    f"{recorder.dropped} more log records of this task were dropped (at most "
                    f"{MAX_RECORDS_PER_TASK} per task reach the driver)",
                    None,
                    None,
                )
            )
        if recorder.records:
            sink.add(recorder.records)


def reemit(records: list[LogRecord]) -> None:
    """Logs each worker record on the driver, through the logger of the same name.

    The driver's logging configuration applies as to its own records: a record below the
    level the driver's logger is enabled for is dropped there too.
    """
    for record in records:
        logger = logging.getLogger(record.logger)
        if not logger.isEnabledFor(record.level):
            continue
        where = f" [Beam step '{record.step}', Spark worker]" if record.step else " [Spark worker]"
        message = record.message + where
        if record.exception:
            message += "\n" + record.exception
        logger.handle(
            logger.makeRecord(record.logger, record.level, "(spark worker)", 0, message, (), None)
        )
