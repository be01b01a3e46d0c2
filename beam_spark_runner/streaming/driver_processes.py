"""The Python processes PySpark starts beside the driver for a streaming query, kept quiet.

PySpark's per-level "pre-init" process (``level_shell.LevelShell``) prints lines about
"TransformWithStateInPandas" to the driver's standard error that a Beam user cannot act on.
The runner's start-up hook silences it as it starts (``_startup_hook.quiet_pre_init``);
without the hook the level shell calls :func:`quiet_pre_init` when unpickled. Real errors
still reach the JVM over its socket. The worker that looks up statically installed Python
data sources is forked from PySpark's own daemon, which ``pyspark_beam_spark_runner`` wraps
with :func:`quiet_daemon_child`. This module imports no Beam.
"""

from __future__ import annotations

import sys

from beam_spark_runner._startup_hook import PRE_INIT_MODULE, silence_stdout
from beam_spark_runner.workers.closed_socket import quiet_on_closed_socket

# PySpark's own daemon, which forks the driver's data-source lookup worker.
PLAIN_DAEMON_MODULE = "pyspark.daemon"


def running_as(module: str) -> bool:
    """Whether this process runs ``module`` as its main module (``python -m module``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == module


def quiet_pre_init() -> None:
    """In a pre-init process: silences its standard output (PySpark's progress prints)."""
    if running_as(PRE_INIT_MODULE):
        silence_stdout()


def quiet_daemon_child() -> None:
    """In a worker forked by PySpark's own daemon: its next tasks end quietly on a closed socket.

    The daemon's loop looks ``worker`` up again for every task the fork serves, so the
    wrapper applies from the next one: the wait in which an idle worker's socket is closed.
    """
    main = sys.modules.get("__main__")
    if running_as(PLAIN_DAEMON_MODULE) and callable(getattr(main, "worker", None)):
        main.worker = quiet_on_closed_socket(main.worker)  # type: ignore[union-attr]
