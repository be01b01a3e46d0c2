"""PySpark's Python worker daemon, with Beam imported once before it forks workers.

Spark forks a Python worker per concurrent task from this daemon. Importing Beam, pyarrow
and the runner's executor modules (``workers.preload``) here, before the forks, lets every
worker start with them already loaded (copy-on-write) instead of importing them again. The
runner selects this module (``spark.python.daemon.module``) for the local sessions it
creates; the daemon loop and the worker code are PySpark's (a private module, hence here in
spark/). Where the driver offered a zygote (``workers.zygote``), this process hands over to
the daemon forked from it.
"""

from __future__ import annotations

import gc
import logging

if __name__ == "__main__":
    from beam_spark_runner.workers import zygote as worker_zygote

    # Forked from the driver's zygote where there is one (it returns only where not).
    worker_zygote.hand_over()


class _DropDriverWarnings(logging.Filter):
    """Drops Beam's import-time warning that the driver, importing Beam, already printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("apitools not found")


logging.getLogger().addFilter(_DropDriverWarnings())

import pyspark.daemon  # noqa: E402

from beam_spark_runner import beam_internals  # noqa: E402
from beam_spark_runner.spark.compat import (  # noqa: E402
    OLDEST_STREAMING_SPARK,
    has_state_processor,
    pyspark_version,
)
from beam_spark_runner.workers import preload  # noqa: E402
from beam_spark_runner.workers.closed_socket import quiet_on_closed_socket  # noqa: E402
from beam_spark_runner.workers.zip_directories import remember_zip_directories  # noqa: E402

preload.preload(
    streaming=pyspark_version() >= OLDEST_STREAMING_SPARK, group_state=not has_state_processor()
)


def serve() -> None:
    """Runs PySpark's daemon loop in this process, its imports done."""
    # Found once here (a search of the heap) rather than in every forked worker.
    beam_internals.type_pickle_caches()
    remember_zip_directories()
    # PySpark's daemon runs a full garbage collection after every task of a reused worker;
    # what the imports above allocated lives as long as the process: frozen, those
    # collections no longer walk it (nor write to its pages, shared with every fork).
    gc.freeze()
    pyspark.daemon.worker = quiet_on_closed_socket(pyspark.daemon.worker)  # type: ignore[assignment]
    pyspark.daemon.manager()


if __name__ == "__main__":
    serve()
