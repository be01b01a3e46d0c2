"""The Python processes PySpark starts beside the driver for a streaming query, kept quiet.

For each query PySpark starts, on the driver's machine, one "pre-init" process per stateful
level (``level_shell.LevelShell``: its state variables). Its standard output goes to the
driver's standard error, where PySpark printed four lines about "TransformWithStateInPandas"
per level and query: noise a Beam user cannot act on. The runner's start-up hook silences
the process as it starts (``_startup_hook.quiet_pre_init``); where the hook is not
installed, the level shell, unpickled there, calls :func:`quiet_pre_init` (the first line
is printed by then). The process sends its real errors to the JVM over its socket.

The runner's worker daemon ends its workers quietly when the JVM closes their socket
(``workers.closed_socket``). The worker that looks up
statically installed Python data sources (a user's ``ReadFromSparkStream`` over one) is
forked from PySpark's own daemon, which no setting replaces: the top-level module
``pyspark_beam_spark_runner``, imported there, wraps it with :func:`quiet_daemon_child`.
This module imports no Beam.
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
