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
errors go too (and from there into the query's failure). The runner's worker daemon uses
:func:`closed_socket` too, for its forked workers' ``BrokenPipeError`` when a task is killed
or the session stops. This module imports no Beam.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import TracebackType

# The modules PySpark runs those processes as (``python -m``).
PRE_INIT_MODULE = "pyspark.sql.streaming.transform_with_state_driver_worker"
SOURCE_RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"

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
