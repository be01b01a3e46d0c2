"""The driver's end of a streaming query: the sink's markers, and stops told from failures."""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Any

from beam_spark_runner.monitoring import worker_logs
from beam_spark_runner.spark import class_archive
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.topology import Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_LOGGER = logging.getLogger(__name__)


# The Java exceptions a stopped query's interrupted action ends in (Spark's
# StreamExecution.IO_EXCEPTION_NAMES).
_INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


# What Spark's ``query.stop()`` cancels the query's running jobs with (their job group is
# the query's run id): "[SPARK_JOB_CANCELLED] Job 16 cancelled Query <name> [id = ...,
# runId = ...] was stopped".
_STOPPED_JOB = re.compile(r"SPARK_JOB_CANCELLED\].* cancelled Query .* was stopped")


def is_interruption(error: BaseException) -> bool:
    """Whether ``error`` is an action interrupted by ``query.stop()`` (a Py4J error).

    Either the action's thread was interrupted (Spark's I/O interruption exceptions) or
    its job was cancelled with the query's job group (``_STOPPED_JOB``).
    """
    if type(error).__name__ != "Py4JJavaError":
        return False
    head = str(error)[:1000]
    return any(name in head for name in _INTERRUPTIONS) or bool(_STOPPED_JOB.search(head))


class QueryInterrupted(RuntimeError):
    """A micro-batch's action interrupted because the query is stopping.

    Its message is short and in the form Spark recognises as an interruption by ``stop()``
    (``StreamExecution.PROXY_ERROR``): Spark matches that pattern against the
    ``foreachBatch`` error's whole text, and on Py4J's text (a Java stack trace) the match
    overflowed the stream thread's stack, logging a ``StackOverflowError`` on every cancel.
    """

    def __init__(self, batch_id: int) -> None:
        super().__init__(
            "py4j.protocol.Py4JJavaError: An error occurred while calling collectToPython "
            f"for micro-batch {batch_id}: {_INTERRUPTIONS[0]} (the query was stopped)"
        )


class _DropInterruptions(logging.Filter):
    """Drops Py4J's ERROR record of a ``QueryInterrupted`` (a stop, not a failure).

    Py4J logs every exception a Python callback (``foreachBatch``) raises, with its
    traceback; a query stopped mid-batch is not an error to report.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, QueryInterrupted)


_PY4J_CALLBACK_LOGGER = "py4j.clientserver"


def quiet_interruptions() -> None:
    """Installs ``_DropInterruptions`` on Py4J's callback logger, once."""
    logger = logging.getLogger(_PY4J_CALLBACK_LOGGER)
    if not any(isinstance(f, _DropInterruptions) for f in logger.filters):
        logger.addFilter(_DropInterruptions())


class SinkWatch:
    """The driver's view of the sink: the latest watermark of each producer reaching it."""

    def __init__(self, topology: Topology, logs: Any = None) -> None:
        self.expected = topology.sink_producers
        self.logs = logs
        self.watermarks: dict[str, int] = {}
        self.finished = threading.Event()
        self.final_batch: int | None = None
        self.batches = 0

    def on_batch(self, frame: DataFrame, batch_id: int) -> None:
        """``foreachBatch``: runs the micro-batch (one action) and reads its sink markers."""
        try:
            rows = frame.collect()
        except Exception as error:
            if is_interruption(error):
                raise QueryInterrupted(batch_id) from None
            raise
        finally:
            self.reemit_logs()
        for row in rows:
            marker = routed.marker_of(row)
            previous = self.watermarks.get(marker.producer, marker.watermark)
            self.watermarks[marker.producer] = max(previous, marker.watermark)
        self.batches += 1
        class_archive.note_pipeline_ran()
        _LOGGER.debug("Micro-batch %d: sink watermarks %s", batch_id, self.watermarks)
        if self.final_batch is None and all(
            self.watermarks.get(p, -1) >= MAX_MICROS for p in self.expected
        ):
            self.final_batch = batch_id
            self.finished.set()

    def reemit_logs(self) -> None:
        """Logs what user code logged in the micro-batch's tasks, then empties the record.

        Called after the batch's action: its tasks are done, and each task's records were
        merged into the accumulator before the action returned, so none is lost. Emptying
        it keeps a long-running query's driver memory flat.
        """
        if self.logs is None:
            return
        records = self.logs.value
        self.logs.value = []
        worker_logs.reemit(records)


def last_batch(query: Any) -> int:
    """The id of the last micro-batch the query completed, -1 before the first."""
    progress: dict[str, Any] = query.lastProgress or {}
    return int(progress.get("batchId", -1))
