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
# What a streaming query's levels and routers run, on every PySpark that streams.
STREAMING_MODULES = (
    "beam_spark_runner.streaming.levels",
    "beam_spark_runner.streaming.router",
)
# What runs them on PySpark 3.5's one applyInPandasWithState: the levels, chained or not.
GROUP_STATE_MODULES = (
    "beam_spark_runner.spark.group_state",
    "beam_spark_runner.streaming.level_chain",
)


def preload(streaming: bool, group_state: bool = False) -> None:
    """Imports the modules every forked worker should start with.

    ``streaming``: a streaming query's too; ``group_state``: those of 3.5's stateful operator.
    """
    import importlib

    modules: tuple[str, ...] = BATCH_MODULES
    if streaming:
        modules += STREAMING_MODULES + (GROUP_STATE_MODULES if group_state else ())
    for module in modules:
        importlib.import_module(module)
