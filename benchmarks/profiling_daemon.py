"""The runner's PySpark worker daemon, with every Python task run under cProfile.

Selected by ``benchmarks.profile`` through ``--spark_conf
spark.python.daemon.module=benchmarks.profiling_daemon``. Each task a forked worker runs
(``pyspark.worker.main``) is profiled and its stats are written to
``$BENCH_PROFILE_DIR/<pid>-<n>.prof``. With ``BENCH_PROFILE_CLOCK=cpu`` the profiles count
CPU time (``time.process_time``) instead of wall time: on a loaded machine a worker's wall
time also holds the time it waited for a core, charged to whatever it was running.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import time
from typing import Any

import pyspark.worker

from beam_spark_runner.spark import worker_daemon  # Beam and the runner pre-imported

_ORIGINAL_MAIN = pyspark.worker.main
_TASKS = itertools.count()


def profiled_main(infile: Any, outfile: Any) -> Any:
    """``pyspark.worker.main`` under cProfile; stats go to one file per task."""
    clock = os.environ.get("BENCH_PROFILE_CLOCK")
    profile = cProfile.Profile(time.process_time) if clock == "cpu" else cProfile.Profile()
    profile.enable()
    try:
        return _ORIGINAL_MAIN(infile, outfile)
    finally:
        profile.disable()
        directory = os.environ.get("BENCH_PROFILE_DIR")
        if directory:
            profile.dump_stats(os.path.join(directory, f"{os.getpid()}-{next(_TASKS)}.prof"))


pyspark.worker.main = profiled_main

if __name__ == "__main__":
    # As the runner's daemon serves (zip directories remembered, objects frozen), so that the
    # profiles hold what a task costs there.
    worker_daemon.serve()
