"""What a JVM's first streaming query loads, loaded while that query plans.

A process's first streaming query ran its first stateful level's tasks 0.5-0.7 s longer
than the next queries' (the same pipeline, the same session). Two of the things only the
first one does are loads that wait on nothing the query computes:

* RocksDB's native library, which ``transformWithState``'s state stores need: copied out of
  its jar and linked, 0.1 s here;
* Janino, Spark's Java compiler: PySpark's ``transformWithState`` compiles its grouping
  key's ordering and projection even where a query's SQL runs interpreted. Its jar is
  signed, so the driver JVM's class archive (``java``) cannot hold its classes: loading
  them and compiling a first class took 0.13 s.

Meanwhile the first micro-batch's planning runs each level's pre-init, in Python processes,
with the JVM mostly idle (0.5-0.8 s for three levels). :func:`start` loads both then, in a
background thread, once per JVM. Only where the tasks run in the driver's JVM (``local``
masters): a cluster's executors load them in their own JVMs. Never raises; a load that
fails leaves the task to load it as it would have.
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
