"""What the runner's worker daemon imports before it forks workers, named by module.

Named rather than imported here: workers/ is plumbing below execution/ and streaming/,
whose modules these are.
"""

from __future__ import annotations

# The launched daemon's zygote imports this module before anything heavy: stdlib only here.
DAEMON_MODULE = "beam_spark_runner.workers.daemon"
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


def preload() -> None:
    """Imports the modules every forked worker should start with."""
    import importlib

    from beam_spark_runner.spark.compat import STREAMING_SPARK, pyspark_version

    modules: tuple[str, ...] = BATCH_MODULES
    if pyspark_version() >= STREAMING_SPARK:
        modules += STREAMING_MODULES
    for module in modules:
        importlib.import_module(module)
