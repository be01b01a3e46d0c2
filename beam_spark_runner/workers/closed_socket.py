"""PySpark's daemon workers, ending without a traceback when the JVM closed their socket.

Workers forked from a Python daemon print a ``BrokenPipeError`` traceback when the JVM
closes their socket while they wait for their next task: a worker idle for a minute, every
idle worker when the session stops, a killed task. (PySpark 4.1 lets that flush failure end
the worker with its traceback, SPARK-54344; before, it was swallowed.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Worker = Callable[[Any, bool], int]

# What a process sees when the JVM closed its socket.
_CLOSED = (EOFError, BrokenPipeError, ConnectionResetError)


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


def closed_socket(error: BaseException | None) -> bool:
    """Whether ``error`` and every error it was raised while handling are closed-socket errors."""
    found = False
    while error is not None:
        if not isinstance(error, _CLOSED):
            return False
        found, error = True, error.__cause__ or error.__context__
    return found
