"""PySpark's Python worker daemon, with Beam imported once before it forks workers.

Spark forks a Python worker per concurrent task from this daemon. Importing Beam, pyarrow
and the runner's executor modules takes seconds; doing it here, before the forks, lets
every worker start with them already loaded (copy-on-write) instead of importing them
again. That includes what a streaming query's levels and routers run: without it the
first query of a process spent 0.1 s of its first stateful level importing them (in each
worker, compiled from source where ``PYTHONDONTWRITEBYTECODE`` is set). The runner
selects this module (``spark.python.daemon.module``) for the local sessions it creates;
the worker code itself is PySpark's.
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

import apache_beam  # noqa: E402, F401
import pyspark.daemon  # noqa: E402
from pyspark.daemon import manager  # noqa: E402

import beam_spark_runner.execution.grouping  # noqa: E402, F401
import beam_spark_runner.execution.stage_worker  # noqa: E402, F401
from beam_spark_runner import beam_internals  # noqa: E402
from beam_spark_runner.execution.zip_directories import remember_zip_directories  # noqa: E402
from beam_spark_runner.spark.compat import pyspark_version  # noqa: E402
from beam_spark_runner.streaming.check import STREAMING_SPARK  # noqa: E402
from beam_spark_runner.streaming.driver_processes import quiet_on_closed_socket  # noqa: E402

if pyspark_version() >= STREAMING_SPARK:
    # Only where pipelines stream: the levels build on PySpark 4.1's transformWithState.
    import beam_spark_runner.streaming.levels  # noqa: F401
    import beam_spark_runner.streaming.router  # noqa: F401


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
    manager()


if __name__ == "__main__":
    serve()
