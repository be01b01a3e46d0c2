"""A warm process on the driver that forks each stateful level's pre-init.

At a query's start PySpark runs each ``transformWithState`` processor's ``init`` on the
driver (its "pre-init") in a fresh Python process, one after the other. This server imports
what a pre-init runs once, then forks a child per pre-init: the runner's start-up hook in
the process the JVM starts finds the server's socket (``_startup_hook.pre_init_socket_path``),
hands over its environment, working directory and standard error
(``_startup_hook.forked_pre_init``), then waits for the child and exits with its code; with
no server answering, or another interpreter, it runs the pre-init itself. One server per
driver JVM, from its first stateful streaming query (:func:`start`) until the driver or the
JVM ends. ``BEAM_SPARK_FORKED_PRE_INIT=0`` turns it off. This module imports no Beam.
"""

from __future__ import annotations

import logging
import marshal
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

from beam_spark_runner._startup_hook import (
    PRE_INIT_MODULE,
    pre_init_socket_path,
    prefer_installed_pyspark,
)
from beam_spark_runner.spark import internals as spark_internals
from beam_spark_runner.workers import handover

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOGGER = logging.getLogger(__name__)

# Set to 0 in the driver's environment: no server; each pre-init starts as PySpark starts it.
SWITCH_ENV = "BEAM_SPARK_FORKED_PRE_INIT"
# What the server answers a request with: it forked the pre-init, or the caller runs it.
STARTED = b"S"
DECLINED = b"F"

_servers: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def supported() -> bool:
    """Whether this platform forks and passes descriptors, and PySpark has a pre-init."""
    import importlib.util

    return (
        hasattr(os, "fork")
        and hasattr(socket, "AF_UNIX")
        and hasattr(socket, "send_fds")
        and importlib.util.find_spec(PRE_INIT_MODULE) is not None
    )


def start(spark: SparkSession) -> None:
    """Starts the server for the session's JVM, unless it runs or is switched off."""
    if os.environ.get(SWITCH_ENV) == "0" or not supported():
        return
    jvm = spark_internals.session_jvm(spark)
    if jvm is not None:
        start_for(int(jvm.java.lang.ProcessHandle.current().pid()))


def start_for(jvm_pid: int) -> None:
    """Starts the server for the pre-inits of process ``jvm_pid``, unless it runs."""
    with _lock:
        running = _servers.get(jvm_pid)
        if running is not None and running.poll() is None:
            return
        path = pre_init_socket_path(jvm_pid)
        # Its standard input is the driver's end of a pipe: closed when the driver ends.
        _servers[jvm_pid] = subprocess.Popen(  # noqa: S603 - this interpreter, this module
            [sys.executable, "-m", __name__, path, str(jvm_pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
    _LOGGER.debug("Pre-init server for process %d starting at %s", jvm_pid, path)


def server_pid(jvm_pid: int) -> int | None:
    """The pid of the running server for process ``jvm_pid``, if any."""
    with _lock:
        server = _servers.get(jvm_pid)
    return server.pid if server is not None and server.poll() is None else None


def stop(jvm_pid: int | None = None) -> None:
    """Ends the server for ``jvm_pid``, or all this process started (the driver's exit does)."""
    with _lock:
        pids = list(_servers) if jvm_pid is None else [jvm_pid]
        servers = [_servers.pop(pid) for pid in pids if pid in _servers]
    for server in servers:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (also one of another user's, which this one cannot signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _receive(conn: socket.socket) -> tuple[tuple[Any, ...], list[int]]:
    """A request: (executable, version, working directory, environment), and its stderr."""
    payload, fds = handover.receive(conn, 1)
    return marshal.loads(payload), fds


def _run_child(stderr_fd: int, cwd: str, env: dict[str, str]) -> None:
    """In the fork: becomes the pre-init process the JVM started, and ends with its code."""
    code = 1
    try:
        os.dup2(stderr_fd, 2)
        os.close(stderr_fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)  # the pre-init's prints: silenced, as the start-up hook does
        os.close(devnull)
        path = handover.take_over(env, cwd)
        prefer_installed_pyspark(path)
        sys.path[:] = path
        import runpy

        # The server imported the module for its imports; run as ``__main__`` it is run
        # anew, and runpy warns on stderr of a module it finds already imported.
        sys.modules.pop(PRE_INIT_MODULE, None)
        runpy.run_module(PRE_INIT_MODULE, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the code
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - ending anyway
                pass
        os._exit(code)


def serve(path: str, jvm_pid: int) -> None:
    """Serves pre-init requests at ``path`` until the driver or its JVM ends."""
    # What each fork runs and talks in, imported once here.
    spark_internals.import_pre_init_modules()
    import beam_spark_runner.streaming.level_shell  # noqa: F401 - what a fork unpickles

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous_umask = os.umask(0o077)  # the socket: this user's only
    try:
        listener.bind(path)
    finally:
        os.umask(previous_umask)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "driver")
    children: dict[int, socket.socket] = {}
    try:
        while True:
            for key, _ in selector.select(timeout=0.005 if children else 5.0):
                if key.data == "accept":
                    conn, _ = listener.accept()
                    pid = _fork(conn, listener, selector, children)
                    if pid is None:
                        conn.close()
                    else:
                        children[pid] = conn
                        selector.register(conn, selectors.EVENT_READ, pid)
                elif key.data == "driver":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return
                else:
                    # The waiting process closed its end (the JVM ended it): so does its fork.
                    selector.unregister(key.fileobj)
                    try:
                        os.kill(key.data, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            for pid, conn in list(children.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if not done:
                    continue
                del children[pid]
                try:
                    selector.unregister(conn)
                except KeyError:
                    pass
                try:
                    conn.sendall(os.waitstatus_to_exitcode(status).to_bytes(4, "big", signed=True))
                except OSError:
                    pass
                conn.close()
            if not children and not _alive(jvm_pid):
                return
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _fork(
    conn: socket.socket,
    listener: socket.socket,
    selector: selectors.BaseSelector,
    children: dict[int, socket.socket],
) -> int | None:
    """Forks the pre-init a request asks for; its pid, or None where it was declined."""
    try:
        (executable, version, cwd, env), fds = _receive(conn)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if len(fds) != 1 or executable != sys.executable or version != sys.version:
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(DECLINED)
        except OSError:
            pass
        return None
    pid = os.fork()
    if pid == 0:
        selector.close()
        listener.close()
        for other in children.values():
            other.close()
        conn.close()
        _run_child(fds[0], cwd, env)
    os.close(fds[0])
    try:
        conn.sendall(STARTED)
    except OSError:
        os.kill(pid, signal.SIGKILL)
    return pid


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
