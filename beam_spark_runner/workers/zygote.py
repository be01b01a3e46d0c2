"""A local session's Python worker daemon forked from the driver, not started afresh.

Just before the driver starts its JVM, :func:`start` forks the driver, which has imported
most of what the runner's worker daemon (``spark.worker_daemon``) needs, into an idle
*zygote* waiting on a Unix socket. When Spark launches the daemon (``python -m
beam_spark_runner.spark.worker_daemon``), that fresh interpreter only hands its standard
streams, environment, working directory and arguments to the zygote (:func:`hand_over`),
which forks the real daemon and stays its parent until it exits, so the daemon and its
workers remain in the driver's process tree. The launched interpreter stays as the daemon's
stand-in: Spark's signals to it are passed on, and it exits when the daemon does.

What a fresh interpreter would not have is reset in the forked daemon (:func:`_reset`): the
environment, working directory, arguments and import path are the launched interpreter's; its
``__main__`` is a new, empty module (a worker finds none of the main script's names, as on a
cluster: ``--save_main_session`` is still needed); the standard streams are new objects on
the launched interpreter's descriptors; signal handlers, ``atexit`` handlers, warning
filters and logging are a fresh interpreter's; and it always leaves through ``os._exit``, so
none of the driver's exit handlers run twice. What stays are the modules the driver had
imported, in the state the driver left them in, as in an in-process runner (DirectRunner):
a cluster's executors import them afresh from the pickled functions. In ``ps`` the daemon
and its workers show the driver's command line.

Only where it is safe and pays: a local session the runner creates (``worker_warmup``'s
daemon), on Linux, before the driver's JVM starts, from a driver with no other Python thread
and no native thread but those that fork safely (forking a process with other threads can
leave their locks held forever in the copy), whose memory is under
:data:`MAX_DRIVER_RSS_BYTES` (the daemon keeps the pages it was forked with), for a daemon
launched with the driver's own interpreter and environment. Anywhere else,
or if the zygote cannot be reached, the daemon starts as before.
``BEAM_SPARK_RUNNER_ZYGOTE=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

from beam_spark_runner.workers import handover
from beam_spark_runner.workers.preload import DAEMON_MODULE

# The launched daemon imports this module before anything heavy: its imports stay to what
# the interpreter has loaded at start; the rest is imported where used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from socket import socket
    from typing import Any

ENVIRONMENT = "BEAM_SPARK_RUNNER_ZYGOTE"
MAX_DRIVER_RSS_BYTES = 1 << 30
# Threads of native libraries that fork safely (they register fork handlers), as PySpark's
# own daemon forks its workers with them: pyarrow's jemalloc thread. Numerical libraries'
# pools (OpenBLAS, through numpy) carry the process's name.
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})
_STREAMS = 3  # stdin, stdout, stderr


def fork_safe() -> bool:
    """Whether forking this process leaves no other thread's locks held in the copy.

    True only with no Python thread but this one, and no native thread other than those
    of :data:`FORK_SAFE_THREADS` or those named as the process is (gRPC's, a JVM's and most
    others name theirs).
    """
    import threading

    if threading.active_count() != 1:
        return False
    try:
        with open("/proc/self/comm") as comm:
            own = comm.read().strip()
        names = []
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
    except OSError:
        return False
    return all(name == own or name in FORK_SAFE_THREADS for name in names)


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return MAX_DRIVER_RSS_BYTES


def start(socket_directory: str) -> bool:
    """Forks a zygote for the JVM about to start; whether it did.

    Call it just before the driver's JVM starts, and :func:`withdraw` once it has: the JVM
    inherits :data:`ENVIRONMENT` from this process, and the daemons it launches from it. A
    zygote forked for an earlier JVM that it never served leaves.
    """
    global _zygotes, _watch
    stop()
    if os.environ.get(ENVIRONMENT) == "0" or not sys.platform.startswith("linux"):
        return False
    if _resident_bytes() >= MAX_DRIVER_RSS_BYTES or not fork_safe():
        return False
    import socket

    _zygotes += 1
    name = f"beam-spark-zygote-{os.getpid()}-{_zygotes}.sock"
    path = os.path.join(socket_directory, name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if os.path.exists(path):
            os.unlink(path)
        listener.bind(path)
        listener.listen(4)
    except OSError:
        listener.close()
        return False
    # The zygote watches this pipe: the driver's end closes when the driver exits (or
    # calls :func:`stop`).
    watched, watch = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    import warnings

    with warnings.catch_warnings():
        # Python 3.12+ warns of any fork of a process with more than one thread; those
        # here are the pools fork_safe allows, and PySpark's daemon forks with them too.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the zygote: never returns into the driver's code
        try:
            os.close(watch)
            _serve(listener, watched, path)
        finally:
            os._exit(0)
    os.close(watched)
    listener.close()
    _watch = watch
    os.environ[ENVIRONMENT] = f"{os.getpid()}:{path}"
    return True


_zygotes = 0  # zygotes this process forked
_watch: int | None = None  # the driver's end of its zygote's pipe
_inherited: list[object] = []  # in a forked daemon: the driver's stream objects


def withdraw() -> None:
    """Takes :data:`ENVIRONMENT` out of this process's environment (the JVM has it)."""
    if os.environ.get(ENVIRONMENT, "0") != "0":
        del os.environ[ENVIRONMENT]


def stop() -> None:
    """Has a zygote that has not served a daemon leave (the JVM it was for did not start)."""
    global _watch
    if _watch is not None:
        os.close(_watch)
        _watch = None


def _serve(listener: socket, watched: int, path: str) -> None:
    """The zygote: forks one daemon and waits for it; or leaves, having forked none.

    The daemon is forked for the first well-formed request. The zygote stays its parent,
    so that the daemon and its workers remain in the driver's process tree (where tools
    that watch a job's processes look for them: the benchmarks' CPU and memory figures).
    """
    import json
    import select
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C in the driver's terminal is not its
    try:
        while True:
            ready, _, _ = select.select([listener.fileno(), watched], [], [])
            if watched in ready:
                return  # the driver is gone, or forked another zygote
            connection, _ = listener.accept()
            with connection:
                try:
                    payload, descriptors = handover.receive(connection, _STREAMS)
                except (OSError, EOFError):
                    continue
                request = json.loads(payload)
                if not _same_interpreter(request):
                    for descriptor in descriptors:
                        os.close(descriptor)
                    continue  # no answer: that daemon starts afresh, in its interpreter
                daemon = os.fork()
                if daemon == 0:
                    listener.close()
                    os.close(watched)
                    connection.sendall(str(os.getpid()).encode())
                    connection.close()
                    _become(request, descriptors)  # never returns
            for descriptor in descriptors:  # the daemon's, not this process's
                os.close(descriptor)
            break
    finally:
        listener.close()
        if os.path.exists(path):
            os.unlink(path)
    os.close(watched)
    os.waitpid(daemon, 0)


def _same_interpreter(request: dict[str, object]) -> bool:
    """Whether the launched daemon runs this interpreter and environment.

    A session's ``spark.pyspark.python`` or ``PYSPARK_PYTHON`` may name another.
    """
    return request.get("prefix") == sys.prefix and request.get("version") == sys.version


def _become(request: dict[str, Any], descriptors: list[int]) -> None:
    """In the forked daemon: takes over the launched interpreter's process state, runs."""
    code = 1
    try:
        for target, descriptor in enumerate(descriptors):
            os.dup2(descriptor, target)
            os.close(descriptor)
        _reset(request["environment"], request["cwd"], request["argv"])
        import importlib

        # By name: the daemon module imports this one to hand over.
        importlib.import_module(DAEMON_MODULE).serve()
        code = 0
    except SystemExit as exit_:  # PySpark's daemon leaves through sys.exit
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - said on the daemon's stderr, then it exits
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reset(environment: dict[str, str], cwd: str, argv: list[str]) -> None:
    """What a freshly started interpreter with this environment would have."""
    import atexit
    import io
    import signal
    import types
    import warnings

    atexit._clear()  # noqa: SLF001 - the driver's exit handlers are not this process's
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path[:] = handover.take_over(environment, cwd)
    sys.argv = list(argv)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    # New stream objects on descriptors 0-2: the driver's may be a test runner's captures.
    # The driver's are kept, never collected: one that owns its descriptor would close it.
    _inherited.extend([sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__])
    _inherited.append(sys.__stderr__)
    streams = (
        io.TextIOWrapper(io.FileIO(0, "r", closefd=False)),
        io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True),
        io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), line_buffering=True, errors="backslashreplace"
        ),
    )
    for name, stream in zip(("stdin", "stdout", "stderr"), streams, strict=True):
        # Both names, as at start (``sys.__stdout__`` is Final to type checkers).
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    warnings.resetwarnings()
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning):
        warnings.simplefilter("ignore", category)
    warnings.simplefilter("ignore", ResourceWarning)
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    _reset_logging()


def _reset_logging() -> None:
    """Logging as a fresh interpreter has it: no handlers, filters or levels set."""
    import logging

    root = logging.getLogger()
    loggers = [root, *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        if isinstance(logger, logging.Logger):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.filters.clear()
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
            logger.disabled = False
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)


def hand_over() -> None:
    """In a daemon Spark launched: the zygote forks the real one; this stands in for it.

    Returns only where there is no zygote to hand over to (then the caller starts as
    usual): none was offered, the driver that offered it is not this JVM's, or this daemon
    runs another interpreter or environment than the driver's.
    """
    offer = os.environ.get(ENVIRONMENT, "")
    driver, _, path = offer.partition(":")
    if not path or not _is_grandparent(driver):
        return
    pid = _ask(path, _request())
    if pid is not None:
        _stand_in(pid)


def _request() -> dict[str, object]:
    """What the forked daemon takes over from this launched one, and what it checks."""
    return {
        "environment": dict(os.environ),
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "prefix": sys.prefix,
        "version": sys.version,
    }


def _ask(path: str, request: dict[str, object]) -> int | None:
    """The pid of the daemon the zygote at ``path`` forked for ``request``; None if none."""
    import json
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(path)
            handover.send(connection, json.dumps(request).encode(), range(_STREAMS))
            connection.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := connection.recv(64):
                answer += chunk
        return int(answer)
    except (OSError, ValueError):
        # The zygote is gone (it served a daemon already, or the driver exited), or it
        # declined (another interpreter).
        return None


def _parent(pid: str) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[1]


def _is_grandparent(driver: str) -> bool:
    """Whether ``driver`` started the JVM that started this process."""
    try:
        return _parent(str(os.getppid())) == driver
    except (OSError, IndexError):
        return False


def _forward_to(pid: int) -> Callable[[int, object], None]:
    def forward(number: int, frame: object) -> None:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass

    return forward


def _stand_in(pid: int) -> None:
    """Passes Spark's signals on to the daemon ``pid``; exits when it does."""
    import select
    import signal

    forward = _forward_to(pid)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(number, forward)
    # The daemon reads Spark's requests on stdin and answers on stdout: not this process.
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1):
        os.dup2(devnull, target)
    os.close(devnull)
    try:
        waiter: int | None = os.pidfd_open(pid)
    except OSError:
        waiter = None
    while True:
        if waiter is not None:
            if select.select([waiter], [], [], 1.0)[0]:
                break
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        select.select([], [], [], 0.2)
    os._exit(0)
