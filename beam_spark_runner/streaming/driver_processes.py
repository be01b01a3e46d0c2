"""The Python processes PySpark starts beside the driver for a streaming query, kept quiet.

For each query PySpark starts, on the driver's machine, a process serving the runner's
data source (``source.RunnerSource``: offsets, partitions) for the query's life, and one
"pre-init" process per stateful level (``level_shell.LevelShell``: its state variables).
Their standard output and error go to the driver's standard error. Two things there are
noise a Beam user cannot act on, at every query:

* the pre-init prints four lines about "TransformWithStateInPandas" per level;
* when the query stops, the JVM closes the data source process's socket and that process
  ends on a chain of ``EOFError`` and ``BrokenPipeError`` tracebacks (30 lines).

The runner's objects, unpickled in those processes, call :func:`quiet_pre_init` and
:func:`quiet_source_runner`. Both processes talk to the JVM over a socket, where their real
errors go too (and from there into the query's failure).

Workers forked from a Python daemon print a ``BrokenPipeError`` traceback when the JVM
closes their socket while they wait for their next task: a worker idle for a minute, every
idle worker when the session stops, a killed task. (PySpark 4.1 lets that flush failure end
the worker with its traceback, SPARK-54344; before, it was swallowed.) The runner's worker
daemon wraps its workers in :func:`quiet_on_closed_socket`. The workers that plan a query's
data source on the driver are forked from PySpark's own daemon, which no setting replaces;
the runner's source, created or unpickled there, wraps them with :func:`quiet_daemon_child`.
This module imports no Beam.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

# The modules PySpark runs those processes as (``python -m``).
PRE_INIT_MODULE = "pyspark.sql.streaming.transform_with_state_driver_worker"
SOURCE_RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"
# PySpark's own daemon, which forks the driver's data-source planning workers.
PLAIN_DAEMON_MODULE = "pyspark.daemon"

# What a process sees when the JVM closed its socket.
_CLOSED = (EOFError, BrokenPipeError, ConnectionResetError)


def running_as(module: str) -> bool:
    """Whether this process runs ``module`` as its main module (``python -m module``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == module


def quiet_pre_init() -> None:
    """In a pre-init process: silences its standard output (PySpark's progress prints)."""
    if running_as(PRE_INIT_MODULE) and getattr(sys.stdout, "name", None) != os.devnull:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the process's life


def quiet_source_runner() -> None:
    """In the data source's process: no traceback when it ends on its closed socket.

    Any other error it ends on is printed as before.
    """
    if running_as(SOURCE_RUNNER_MODULE) and not isinstance(sys.excepthook, _ClosedQuietly):
        sys.excepthook = _ClosedQuietly(sys.excepthook)


Worker = Callable[[Any, bool], int]


def quiet_on_closed_socket(worker: Worker) -> Worker:
    """PySpark's ``daemon.worker``, ending without a traceback when the JVM closed its socket.

    The worker still ends (a non-zero code: the daemon's fork exits); any other error is
    PySpark's to report.
    """
    if getattr(worker, "quiet_on_closed_socket", False):
        return worker

    def run(sock: Any, authenticated: bool) -> int:
        try:
            return worker(sock, authenticated)
        except BaseException as error:
            if closed_socket(error):
                return 1
            raise

    run.quiet_on_closed_socket = True  # type: ignore[attr-defined]
    return run


def quiet_daemon_child() -> None:
    """In a worker forked by PySpark's own daemon: its next tasks end quietly on a closed socket.

    The daemon's loop looks ``worker`` up again for every task the fork serves, so the
    wrapper applies from the next one: the wait in which an idle worker's socket is closed.
    """
    main = sys.modules.get("__main__")
    if running_as(PLAIN_DAEMON_MODULE) and callable(getattr(main, "worker", None)):
        main.worker = quiet_on_closed_socket(main.worker)  # type: ignore[union-attr]


class _ClosedQuietly:
    """An excepthook that prints nothing for an error made only of closed-socket errors."""

    def __init__(self, previous: Callable[..., object]) -> None:
        self.previous = previous

    def __call__(
        self,
        kind: type[BaseException],
        value: BaseException,
        traceback: TracebackType | None,
    ) -> None:
        if not closed_socket(value):
            self.previous(kind, value, traceback)


def closed_socket(error: BaseException | None) -> bool:
    """Whether ``error`` and every error it was raised while handling are closed-socket errors."""
    found = False
    while error is not None:
        if not isinstance(error, _CLOSED):
            return False
        found, error = True, error.__cause__ or error.__context__
    return found
