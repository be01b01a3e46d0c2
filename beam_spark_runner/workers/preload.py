"""The runner's worker daemon (``spark.worker_daemon``) and what it imports before forking.

Named rather than imported here: workers/ is plumbing below spark/, execution/ and
streaming/, whose modules these are.
"""

from __future__ import annotations

# The launched daemon's zygote imports this module before anything heavy: stdlib only here.
DAEMON_MODULE = "beam_spark_runner.spark.worker_daemon"
# What every forked worker runs: Beam, and the runner's batch executor.
BATCH_MODULES = (
    "apache_beam",
    "beam_spark_runner.execution.grouping",
    "beam_spark_runner.execution.stage_worker",
)
# What a streaming query's levels and routers run, where PySpark has transformWithState.
STREAMING_MODULES = (
    "beam_spark_runner.streaming.levels",
    "beam_spark_runner.streaming.router",
)


def preload(streaming: bool) -> None:
    """Imports the modules every forked worker should start with (``streaming``: its too)."""
    import importlib

    modules = BATCH_MODULES + STREAMING_MODULES if streaming else BATCH_MODULES
    for module in modules:
        importlib.import_module(module)
