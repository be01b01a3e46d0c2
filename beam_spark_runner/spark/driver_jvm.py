"""Whether the Spark driver JVM this process launched still runs, and if not, how it ended.

PySpark starts the driver JVM as a child of the Python process (``spark-submit``, which
replaces itself with ``java``) and reaches it over Py4J. Once that JVM has exited, every
call fails with Py4J's ``ConnectionRefusedError``, which says nothing of the JVM: not
whether the kernel's out-of-memory killer took it, Spark ended it on a fatal error in a
task (local mode runs tasks in the driver), or it crashed. ``how_it_ended`` says which, for
the error of the pipeline that was running (``job.describe_failure``), and ``forget`` lets
PySpark launch a new JVM for the next one (``session.obtain_session``).

A JVM this process did not launch (``PYSPARK_GATEWAY_PORT``: a notebook kernel, a
``spark-submit`` job) is not this process's child; nothing is known of it here.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

# Spark's own exit codes (org.apache.spark.util.SparkExitCode) for a fatal error in one of
# the driver's threads (SparkUncaughtExceptionHandler).
_SPARK_EXIT_CODES = {
    50: "Spark ended it on an uncaught fatal error in one of its threads (in local mode "
    "tasks run in the driver: a StackOverflowError, say); the first lines it wrote to "
    "standard error name the error",
    51: "Spark ended it on an uncaught error raised while it handled another one",
    52: "Spark ended it on a java.lang.OutOfMemoryError: the heap (spark.driver.memory) "
    "was too small for what ran in it. Give the driver more, "
    "e.g. --spark_conf spark.driver.memory=8g",
}


def _process() -> Any | None:
    """The driver JVM's ``Popen``, where this process launched it."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway  # where PySpark keeps the JVM's process
    return getattr(gateway, "proc", None)


def _exit_status(grace: float = 0.0) -> tuple[int, int] | None:
    """The exit status and pid of the driver JVM this process launched, once it exited.

    ``grace``: seconds to wait for it to end. None while it runs, and where no JVM was
    launched by this process.
    """
    process = _process()
    if process is None:
        return None
    try:
        status = process.wait(timeout=grace) if grace > 0 else process.poll()
    except subprocess.TimeoutExpired:
        return None
    return None if status is None else (status, process.pid)


def running() -> bool:
    """False once the driver JVM this process launched has exited; True otherwise."""
    return _exit_status() is None


def how_it_ended(grace: float = 0.0) -> str | None:
    """How the driver JVM this process launched ended (``describe``); None while it runs.

    ``grace``: seconds to wait for it to end, for a caller that has just lost its
    connection to it (a dying process closes its sockets a moment before it can be
    reaped). None too where no JVM was launched by this process.
    """
    ended = _exit_status(grace)
    return None if ended is None else describe(*ended)


def describe(status: int, pid: int, directory: str | None = None) -> str:
    """What an exit ``status`` of the driver JVM ``pid`` means (and what to do, where known)."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        how = f"it was killed by {name}"
        if -status == signal.SIGKILL:
            how += (
                ": on Linux, most often the kernel's out-of-memory killer when the machine "
                "ran short of memory (the kernel log says: dmesg | grep -i 'killed process')"
            )
    elif status in _SPARK_EXIT_CODES:
        how = f"exit code {status}: {_SPARK_EXIT_CODES[status]}"
    elif status == 0:
        how = (
            "it exited normally: its standard input, a pipe from this process, was closed, "
            "or something in it called System.exit(0)"
        )
    else:
        how = f"exit code {status}"
    crash_log = os.path.join(directory or os.getcwd(), f"hs_err_pid{pid}.log")
    if os.path.exists(crash_log):
        how += f". The JVM wrote a crash report: {crash_log}"
    return f"The Spark driver JVM this process started (pid {pid}) has exited; {how}."


def forget() -> None:
    """Drops PySpark's handles on an exited driver JVM: the next session launches a new one.

    PySpark keeps its gateway, context and sessions in class attributes and launches a JVM
    only while it has no gateway; none of them can reach an exited JVM again. Their
    Python-side servers (Py4J's callback server, the context's accumulator server) are
    shut down. Only call it once ``how_it_ended`` has said the JVM ended.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.context import SQLContext

    with SparkContext._lock:  # PySpark's own lock over these attributes
        context = SparkContext._active_spark_context
        server = getattr(context, "_accumulatorServer", None)
        if server is not None:
            server.shutdown()
            server.server_close()
        if context is not None:
            context._accumulatorServer = None  # type: ignore[assignment]
            context._jsc = None  # what PySpark's stop() leaves
        gateway = SparkContext._gateway
        if gateway is not None:
            gateway.shutdown()  # Python side only: errors reaching the JVM are logged
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    SQLContext._instantiatedContext = None
