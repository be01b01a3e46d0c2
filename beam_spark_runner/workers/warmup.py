"""Starts a local session's Python worker daemon while the session itself starts.

``start`` runs a tiny RDD job in a background thread once the Spark context is up, so the
runner's worker daemon (``spark.worker_daemon``) imports Beam, pyarrow and the executor
while the driver starts the SQL session and translates the pipeline, and leaves forked
workers idle for the pipeline's tasks. Spark keys daemons by worker environment, so
``session.worker_environment`` first puts ``SPARK_SIMPLIFIED_TRACEBACK`` and the driver's
``PYTHONPATH`` in the context's environment: every task of the session, batch or streaming,
then forks from this daemon. Only for the local sessions the runner creates
(``session.session_conf``): a cluster's executors start their own daemons.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from beam_spark_runner.workers.preload import DAEMON_MODULE

if TYPE_CHECKING:
    from pyspark import SparkContext

_LOGGER = logging.getLogger(__name__)

DAEMON_CONF = "spark.python.daemon.module"
DESCRIPTION = "beam-spark-runner: starting the Python workers"


class OncePerContext:
    """Starts a function in a background thread at most once per Spark context.

    Keeps the Python contexts, weakly: Py4J compares and hashes a context's JVM side in the
    JVM, which may have exited (``driver_jvm.forget``; a new JVM's identity hash codes
    repeat an old one's).
    """

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._started: weakref.WeakKeyDictionary[SparkContext, threading.Thread] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def __contains__(self, context: SparkContext) -> bool:
        return context in self._started

    def start(
        self, context: SparkContext, target: Callable[..., None], *args: object
    ) -> threading.Thread | None:
        """The thread running ``target(*args)``; None if one started for ``context``."""
        with self._lock:
            if context in self._started:
                return None
            thread = threading.Thread(target=target, args=args, name=self._thread_name, daemon=True)
            self._started[context] = thread
        thread.start()
        return thread

    def join(self, context: SparkContext, timeout: float) -> bool:
        """Waits up to ``timeout`` s for ``context``'s thread to end; whether none runs."""
        with self._lock:
            thread = self._started.get(context)
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()


_warmed = OncePerContext("beam-spark-runner-worker-warmup")


def _elements(elements: Iterable[int]) -> Iterator[int]:
    """The warm-up's function: its partition's elements, unchanged."""
    yield from elements


def _warm(context: SparkContext, tasks: int) -> None:
    try:
        context.setJobDescription(DESCRIPTION)
        context.parallelize(range(tasks), tasks).mapPartitions(_elements).collect()
        _LOGGER.debug("The local Python worker daemon is up")
    except Exception:  # noqa: BLE001 - the pipeline's own tasks report a worker that fails
        _LOGGER.debug("Warming the local Python workers failed", exc_info=True)


class _Settings(Protocol):
    """A session's settings: the runner's ``dict`` of them, or a context's ``SparkConf``."""

    def get(self, key: str, /) -> str | None: ...


def applies(conf: _Settings) -> bool:
    """Whether a session of these settings runs the runner's worker daemon."""
    return conf.get(DAEMON_CONF) == DAEMON_MODULE


def settle(context: SparkContext, timeout: float) -> bool:
    """Waits up to ``timeout`` s for ``context``'s warm-up job to end; whether it has.

    Before the runner stops its session: a warm-up task still running then (a pipeline
    refused moments after its session started) ends in Spark's ERROR that its task
    binary's broadcast no longer exists.
    """
    return _warmed.join(context, timeout)


def start(context: SparkContext) -> threading.Thread | None:
    """Starts the warm-up job in a background thread; the thread, or None if not needed.

    Not needed where the context does not run the runner's worker daemon, or where it was
    warmed already. Call it once the context's environment is final
    (``session.worker_environment``).
    """
    if not applies(context.getConf()):
        return None
    return _warmed.start(context, _warm, context, max(1, context.defaultParallelism))
