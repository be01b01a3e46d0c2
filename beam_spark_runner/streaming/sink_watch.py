"""The driver's end of a streaming query: the sink's markers, and stops told from failures."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
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
    (``StreamExecution.PROXY_ERROR``; Spark 3.5's wants the exception's name on a line of
    its own after ": ", as Py4J writes it): Spark matches that pattern against the
    ``foreachBatch`` error's whole text, and on Py4J's text (a Java stack trace) the match
    overflowed the stream thread's stack, logging a ``StackOverflowError`` on every cancel.
    """

    def __init__(self, batch_id: int) -> None:
        super().__init__(
            "py4j.protocol.Py4JJavaError: An error occurred while calling collectToPython "
            f"for micro-batch {batch_id}.\n: {_INTERRUPTIONS[0]} (the query was stopped)"
        )


class MicroBatchFailed(RuntimeError):
    """A micro-batch's action failed; the runner reports its error (``SinkWatch.failure``).

    What ``foreachBatch`` raises to Spark instead of that error: Spark logs and keeps the
    callback's error as text, so the user's traceback would reach the console once per copy.
    """

    def __init__(self, batch_id: int) -> None:
        super().__init__(
            f"Micro-batch {batch_id} of the Beam pipeline failed; the pipeline's result "
            "raises its error"
        )


class _DemoteCallbackErrors(logging.Filter):
    """Py4J's ERROR record of the runner's own callback errors, at DEBUG.

    Py4J logs every exception a Python callback (``foreachBatch``) raises, with its
    traceback; a query stopped mid-batch (``QueryInterrupted``) is not an error, and a
    failed micro-batch (``MicroBatchFailed``) is reported by the pipeline's result. Every
    other record passes as it is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, QueryInterrupted | MicroBatchFailed):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


# Py4J's loggers of a Python callback's exception: the client server's (PySpark's default
# pinned-thread mode) and the gateway's.
_PY4J_CALLBACK_LOGGERS = ("py4j.clientserver", "py4j.java_gateway")
_callback_filter = _DemoteCallbackErrors()
_callback_filter_users = 0
_callback_filter_lock = threading.Lock()


def quiet_callback_errors() -> Callable[[], None]:
    """``_DemoteCallbackErrors`` on Py4J's callback loggers until the returned call.

    Held by each streaming run while its query runs; the filter goes once none holds it.
    """
    global _callback_filter_users
    with _callback_filter_lock:
        if _callback_filter_users == 0:
            for name in _PY4J_CALLBACK_LOGGERS:
                logging.getLogger(name).addFilter(_callback_filter)
        _callback_filter_users += 1
    released = threading.Event()

    def release() -> None:
        global _callback_filter_users
        with _callback_filter_lock:
            if released.is_set():
                return
            released.set()
            _callback_filter_users -= 1
            if _callback_filter_users == 0:
                for name in _PY4J_CALLBACK_LOGGERS:
                    logging.getLogger(name).removeFilter(_callback_filter)

    return release


class SinkWatch:
    """The driver's view of the sink: the latest watermark of each producer reaching it."""

    def __init__(self, topology: Topology, logs: Any = None) -> None:
        self.expected = topology.sink_producers
        self.logs = logs
        self.watermarks: dict[str, int] = {}
        self.finished = threading.Event()
        self.final_batch: int | None = None
        self.batches = 0
        # A micro-batch's failed action: the user's traceback, kept on the driver.
        self.failure: BaseException | None = None

    def on_batch(self, frame: DataFrame, batch_id: int) -> None:
        """``foreachBatch``: runs the micro-batch (one action) and reads its sink markers."""
        try:
            rows = frame.collect()
        except Exception as error:
            if is_interruption(error):
                raise QueryInterrupted(batch_id) from None
            self.failure = error
            raise MicroBatchFailed(batch_id) from None
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

    def failure_of(self, spark_error: BaseException | None) -> BaseException | None:
        """How a query that ended with ``spark_error`` failed, as the user should see it.

        The failed micro-batch's own error (the user's traceback, once) rather than Spark's
        copy of it, which is logged at DEBUG. None for a query that did not fail.
        """
        if spark_error is None:
            return None
        _LOGGER.debug("Spark's error for the streaming query", exc_info=spark_error)
        return self.failure or spark_error

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
