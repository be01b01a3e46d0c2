"""Fails fast when a standalone Spark master (``spark://``) cannot be reached.

Spark's standalone client retries registering with an unreachable master three times, 20 s
apart, then stops the SparkContext; the next call fails with ``Cannot call methods on a
stopped SparkContext`` after about a minute, with the real cause only in the log. Before
it starts a session for a ``spark://`` master, the runner opens a TCP connection to each
of the master's host:port pairs (a high-availability URL lists several) and raises
:class:`~beam_spark_runner.errors.SparkMasterUnreachableError` with the connection's error
if none accepts.
"""

from __future__ import annotations

import socket

from beam_spark_runner.errors import SparkMasterUnreachableError

STANDALONE_PREFIX = "spark://"
DEFAULT_PORT = 7077
CONNECT_TIMEOUT_S = 5.0


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a ``spark://`` URL; empty for other masters."""
    if not master.startswith(STANDALONE_PREFIX):
        return []
    addresses = []
    for entry in master[len(STANDALONE_PREFIX) :].split(","):
        host, sep, port = entry.strip().rstrip("/").rpartition(":")
        if not sep:
            host, port = port, str(DEFAULT_PORT)
        addresses.append((host.strip("[]"), int(port) if port.isdecimal() else DEFAULT_PORT))
    return addresses


def check_master_reachable(master: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raises SparkMasterUnreachableError unless one of ``master``'s addresses accepts."""
    causes = []
    for host, port in master_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as error:
            causes.append(f"{host}:{port}: {error.strerror or error}")
    if causes:
        raise SparkMasterUnreachableError(
            f"Spark cannot reach the Spark master at {master} ({'; '.join(causes)}). Expected "
            "a standalone master listening there (started with sbin/start-master.sh, or "
            "`spark-class org.apache.spark.deploy.master.Master`). Check the host and port "
            "(the master's web UI shows its URL), the network and firewalls, or run locally "
            "with --spark_master=local[*]."
        )
