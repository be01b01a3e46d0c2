"""The fixed-cost benchmark's PySpark line: a process and a session of its own."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any

from benchmarks import fixed_cost, peers


def _serve_pid(connection: Connection, master: str) -> None:
    """Stands in for the PySpark line's server: replies with its process id as the seconds."""
    while connection.recv():
        connection.send((float(os.getpid()), 0.0))


def test_the_pyspark_line_runs_in_a_process_of_its_own() -> None:
    line = fixed_cost.PySparkLine("local[2]", serve=_serve_pid)
    try:
        first, second = line(), line()
    finally:
        line.close()
    assert first == second  # one process serves every run
    assert first[0] != float(os.getpid())


class _Connection:
    def __init__(self) -> None:
        self.sent: list[object] = []

    def recv(self) -> bool:
        return False  # no run asked for: the server starts its session and stops it

    def send(self, value: object) -> None:
        self.sent.append(value)


def test_the_pyspark_lines_session_has_the_runners_settings(monkeypatch: Any) -> None:
    started: list[tuple[str, dict[str, str]]] = []
    stopped: list[bool] = []

    class _Session:
        def stop(self) -> None:
            stopped.append(True)

    def start(master: str, app_name: str, conf: dict[str, str]) -> _Session:
        started.append((master, dict(conf)))
        return _Session()

    monkeypatch.setattr(peers, "start_session", start)
    fixed_cost.serve_pyspark(_Connection(), "local[2]")  # type: ignore[arg-type]
    assert started == [("local[2]", peers.runner_conf("local[2]"))]
    assert stopped == [True]
