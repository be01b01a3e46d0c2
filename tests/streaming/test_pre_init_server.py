"""The server that forks a streaming query's pre-init processes (``streaming.pre_init_server``).

Here the test process plays the driver's JVM: it starts the pre-init module as the JVM
does (``python -m pyspark.sql.streaming.transform_with_state_driver_worker``, the JVM's
socket in the environment) and reads the pid the pre-init sends as it connects. No Spark.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from beam_spark_runner._startup_hook import PRE_INIT_MODULE, pre_init_socket_path
from beam_spark_runner.streaming import pre_init_server

pytestmark = pytest.mark.skipif(
    not pre_init_server.supported() or not Path("/proc/self/stat").exists(),
    reason="needs fork, Unix sockets, /proc (Linux) and PySpark's transformWithState pre-init",
)


def _wait(condition: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def server() -> Iterator[int]:
    """A server for this process's pre-inits, up and listening; its pid."""
    jvm_pid = os.getpid()
    pre_init_server.start_for(jvm_pid)
    try:
        assert _wait(lambda: os.path.exists(pre_init_socket_path(jvm_pid)))
        pid = pre_init_server.server_pid(jvm_pid)
        assert pid is not None
        yield pid
    finally:
        pre_init_server.stop(jvm_pid)


def _parent(pid: int) -> int:
    """The parent pid of a process (Linux ``/proc``); -1 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


_SECRET = "a-test-secret"


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the pre-init closed its socket")
        data += chunk
    return data


class _Jvm:
    """The JVM's side: the socket a pre-init connects and authenticates to, and the process.

    A local TCP port and a secret, as every PySpark version's pre-init reads them.
    """

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.listener.settimeout(60)
        env = {
            **os.environ,
            "PYTHON_WORKER_FACTORY_PORT": str(self.listener.getsockname()[1]),
            "PYTHON_WORKER_FACTORY_SECRET": _SECRET,
        }
        env.pop("PYTHON_WORKER_FACTORY_SOCK_PATH", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", PRE_INIT_MODULE],
            env=env,
            stderr=subprocess.PIPE,
        )

    def connected_pid(self) -> tuple[socket.socket, int]:
        """The pre-init's authenticated connection and the pid it says it runs as."""
        conn, _ = self.listener.accept()
        conn.settimeout(60)
        size = int.from_bytes(_read_exactly(conn, 4), "big")
        assert _read_exactly(conn, size).decode() == _SECRET
        conn.sendall((2).to_bytes(4, "big") + b"ok")
        return conn, int.from_bytes(_read_exactly(conn, 4), "big", signed=True)


def test_a_pre_init_runs_in_a_fork_of_the_server_and_its_process_exits_with_its_code(
    server: int,
) -> None:
    jvm = _Jvm()
    conn, pid = jvm.connected_pid()
    assert pid != jvm.process.pid
    assert _parent(pid) == server
    conn.close()  # as a JVM gone away: the pre-init fails reading its Python version
    forked_code = jvm.process.wait(timeout=60)
    assert jvm.process.stderr is not None
    forked_error = jvm.process.stderr.read()

    pre_init_server.stop(os.getpid())
    alone = _Jvm()
    conn, pid = alone.connected_pid()
    assert pid == alone.process.pid  # no server: the process runs the pre-init itself
    conn.close()
    assert alone.process.wait(timeout=60) == forked_code
    assert alone.process.stderr is not None
    assert alone.process.stderr.read().splitlines()[-1:] == forked_error.splitlines()[-1:]
    # Nothing on stderr a pre-init run alone would not write: runpy warned of the module the
    # server had imported, three lines a query of three levels, on the user's console.
    assert b"Warning" not in forked_error


def test_a_pre_init_process_ended_by_the_jvm_ends_its_fork(server: int) -> None:
    jvm = _Jvm()
    conn, pid = jvm.connected_pid()
    assert _parent(pid) == server
    jvm.process.send_signal(signal.SIGTERM)  # as the JVM ends a pre-init it is done with
    jvm.process.wait(timeout=60)
    assert _wait(lambda: _parent(pid) != server)
    conn.close()


def test_the_server_ends_with_its_driver_and_removes_its_socket(server: int) -> None:
    path = pre_init_socket_path(os.getpid())
    pre_init_server.stop(os.getpid())
    assert _wait(lambda: not Path(f"/proc/{server}").exists())
    assert not os.path.exists(path)


def test_the_server_has_pysparks_state_messages_loaded_before_it_forks(server: int) -> None:
    # Each fork's pre-init talks to the JVM in PySpark's protobuf messages; imported by the
    # server, a fork starts with them (25 ms a fork when each imported them).
    maps = Path(f"/proc/{server}/maps").read_text()
    assert "google/_upb/" in maps or "google/protobuf/" in maps
