"""What a JVM's first streaming query loads, loaded while that query plans.

A process's first streaming query runs its first stateful level's tasks longer than the
next queries' do; two of the things only the first one does wait on nothing it computes:
RocksDB's native library (``transformWithState``'s state stores), and Janino, Spark's Java
compiler (``transformWithState`` compiles its grouping key's ordering even where the SQL
runs interpreted; its jar is signed, so the class archive cannot hold it). The first
micro-batch's planning leaves the JVM mostly idle while each level's pre-init runs in
Python: :func:`start` loads both then, in a background thread, once per JVM. Only where
the tasks run in the driver's JVM (``local`` masters): a cluster's executors load them in
their own JVMs. Never raises; a load that fails leaves the task to load it as it would have.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from beam_spark_runner.spark import internals as spark_internals
from beam_spark_runner.workers.warmup import OncePerContext

if TYPE_CHECKING:
    from pyspark import SparkContext

_LOGGER = logging.getLogger(__name__)

# A class Janino compiles: the smallest that loads its scanner, parser and class writer.
_FIRST_CLASS = "public int first(Object[] values) { return values.length; }"

_warmed = OncePerContext("beam-spark-jvm-warmup")


def runs_tasks_in_driver(master: str) -> bool:
    """Whether ``master``'s tasks run in the driver's JVM (``local``, ``local[N]``, ...)."""
    return master == "local" or master.startswith("local[")


def _load(jvm: Any) -> None:
    started = time.monotonic()
    try:
        jvm.org.rocksdb.RocksDB.loadLibrary()
        compiler = jvm.org.codehaus.janino.ClassBodyEvaluator()
        compiler.setClassName("beam_spark_runner.FirstClass")
        compiler.cook(_FIRST_CLASS)
    except Exception as error:  # noqa: BLE001 - the query's tasks load them as before
        _LOGGER.debug("Loading RocksDB and Janino ahead of the first micro-batch: %s", error)
        return
    _LOGGER.debug("RocksDB and Janino loaded in %.2f s", time.monotonic() - started)


def start(context: SparkContext) -> threading.Thread | None:
    """Loads RocksDB's library and Janino in the background, once per context.

    Returns the thread (for tests), or None where it does nothing.
    """
    jvm = spark_internals.context_jvm(context)
    if not runs_tasks_in_driver(context.master or "") or jvm is None:
        return None
    return _warmed.start(context, _load, jvm)
