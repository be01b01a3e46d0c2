"""Metrics of failed task attempts, sent to the driver through a side channel.

Spark merges accumulator updates only from successful attempts, so the metrics accumulator
holds Beam's *committed* metrics. For Beam's *attempted* ones a failing task sends its
metrics (:func:`report_failed_attempt`) to :class:`AttemptCollector`, a small TCP server the
driver runs for one pipeline run at the address executors reach it
(``spark.driver.bindAddress`` / ``spark.driver.host``). Best effort: an undeliverable report
is logged and dropped, never replacing the task's own error, so attempted metrics are a
lower bound (never below the committed ones). Frames are Beam-encoded (no pickle, see
``_REPORT_CODER``) and carry the run's random token; frames without it are rejected.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import secrets
import selectors
import socket
import socketserver
import struct
import threading
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from apache_beam.coders import coders

_LOGGER = logging.getLogger(__name__)

_MAGIC = b"BSRA1"
_HEADER = struct.Struct(">5sI")  # magic, payload length
_ACK = b"\x01"
# A failed attempt's metrics are a few kilobytes; refuse anything absurd.
_MAX_PAYLOAD = 64 * 1024 * 1024
_TOKEN_BYTES = 16
# How long a failing task waits for the driver before giving up on its report.
REPORT_TIMEOUT_SECONDS = 10.0

_REPORT_CODER = coders.TupleCoder(
    [
        coders.BytesCoder(),  # token
        coders.StrUtf8Coder(),  # stage name
        coders.VarIntCoder(),  # Spark partition id (-1 when unknown)
        coders.VarIntCoder(),  # attempt number (-1 when unknown)
        coders.IterableCoder(coders.BytesCoder()),  # serialized monitoring infos
    ]
)


@dataclasses.dataclass(frozen=True)
class AttemptReportAddress:
    """Where tasks send failed attempts' metrics. Pickled into every task's closure."""

    host: str
    port: int
    token: bytes


@dataclasses.dataclass(frozen=True)
class FailedAttempt:
    """One failed task attempt's report."""

    stage: str
    partition: int
    attempt: int
    infos: list[bytes]


def encode_report(address: AttemptReportAddress, attempt: FailedAttempt) -> bytes:
    """The frame a task sends for ``attempt``."""
    payload = _REPORT_CODER.encode(
        (address.token, attempt.stage, attempt.partition, attempt.attempt, attempt.infos)
    )
    return _HEADER.pack(_MAGIC, len(payload)) + payload


def _read_exactly(stream: Any, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise ConnectionError(f"expected {size} bytes, the connection gave {len(data or b'')}")
    return data


def _spark_task_identity() -> tuple[int, int]:
    """(partition id, attempt number) of the running Spark task, or (-1, -1)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except Exception:  # noqa: BLE001 - only used to label a report
        return -1, -1
    if context is None:
        return -1, -1
    return context.partitionId(), context.attemptNumber()


def report_failed_attempt(
    address: AttemptReportAddress,
    stage: str,
    infos: Iterable[bytes],
    timeout: float = REPORT_TIMEOUT_SECONDS,
) -> bool:
    """Sends a failed attempt's serialized monitoring infos to the driver; never raises.

    Returns whether the driver acknowledged the report. The driver records a report before
    acknowledging it, so one acknowledged before the task fails is counted in the run's
    attempted metrics.
    """
    partition, attempt = _spark_task_identity()
    try:
        frame = encode_report(address, FailedAttempt(stage, partition, attempt, list(infos)))
        with socket.create_connection((address.host, address.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(frame)
            acknowledged = sock.recv(1) == _ACK
    except Exception as error:  # noqa: BLE001 - best effort: the task's own error matters
        _LOGGER.warning(
            "Could not send the metrics of this failed task attempt (stage %s) to the driver "
            "at %s:%d: %s. The run's attempted metrics will not include them.",
            stage,
            address.host,
            address.port,
            error,
        )
        return False
    if not acknowledged:
        _LOGGER.warning(
            "The driver at %s:%d did not acknowledge this failed attempt's metrics (stage %s)",
            address.host,
            address.port,
            stage,
        )
    return acknowledged


class _ReportHandler(socketserver.StreamRequestHandler):
    server: _ReportServer
    timeout = REPORT_TIMEOUT_SECONDS

    def handle(self) -> None:
        collector = self.server.collector
        try:
            magic, length = _HEADER.unpack(_read_exactly(self.rfile, _HEADER.size))
            if magic != _MAGIC or length > _MAX_PAYLOAD:
                raise ValueError(
                    f"expected a frame starting with {_MAGIC!r} of at most {_MAX_PAYLOAD} "
                    f"bytes, got {magic!r} with {length} bytes"
                )
            token, stage, partition, attempt, infos = _REPORT_CODER.decode(
                _read_exactly(self.rfile, length)
            )
            if not hmac.compare_digest(token, collector.address.token):
                raise ValueError("the report does not carry this run's token")
        except Exception as error:  # noqa: BLE001 - a bad client must not stop the server
            _LOGGER.warning(
                "Ignored a malformed failed-attempt report from %s: %s", self.client_address, error
            )
            return
        collector.add(FailedAttempt(stage, partition, attempt, list(infos)))
        self.wfile.write(_ACK)


class _ReportServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, bind: tuple[str, int], collector: AttemptCollector) -> None:
        self.collector = collector
        self.address_family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        super().__init__(bind, _ReportHandler)


def driver_addresses(spark_conf: Any) -> tuple[str, str]:
    """(address to bind, address executors connect to), from the driver's Spark conf."""
    host = spark_conf.get("spark.driver.host", None) or socket.gethostname()
    bind = spark_conf.get("spark.driver.bindAddress", None) or host
    return bind, host


class AttemptCollector:
    """The driver's end of the side channel for one pipeline run. A context manager."""

    def __init__(self, bind_host: str, advertised_host: str) -> None:
        self._lock = threading.Lock()
        self._attempts: list[FailedAttempt] = []
        self._server = _ReportServer((bind_host, 0), self)
        port = self._server.server_address[1]
        self.address = AttemptReportAddress(
            advertised_host, port, secrets.token_bytes(_TOKEN_BYTES)
        )
        # close() wakes the listener through this pair at once, not at serve_forever's next poll.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread = threading.Thread(
            target=self._serve, name=f"beam-failed-attempts-{port}", daemon=True
        )
        self._thread.start()
        _LOGGER.debug("Collecting failed task attempts' metrics on %s:%d", bind_host, port)

    @classmethod
    def start(cls, spark_conf: Any) -> AttemptCollector | None:
        """A collector on the driver's address, or None (logged) if it cannot listen."""
        bind, host = driver_addresses(spark_conf)
        try:
            return cls(bind, host)
        except OSError as error:
            _LOGGER.warning(
                "Cannot listen on %s for failed task attempts' metrics (%s); attempted "
                "metrics will equal committed ones for this run.",
                bind,
                error,
            )
            return None

    def add(self, attempt: FailedAttempt) -> None:
        """Records one failed attempt."""
        _LOGGER.info(
            "A task attempt of stage %s failed (partition %d, attempt %d); its metrics count "
            "as attempted only",
            attempt.stage,
            attempt.partition,
            attempt.attempt,
        )
        with self._lock:
            self._attempts.append(attempt)

    @property
    def attempts(self) -> list[FailedAttempt]:
        """The failed attempts reported so far."""
        with self._lock:
            return list(self._attempts)

    def _serve(self) -> None:
        """Handles reports, one connection at a time accepted, until :meth:`close`."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while True:
                ready = [key.fileobj for key, _ in selector.select()]
                if self._wake_reader in ready:
                    return
                self._server.handle_request()  # accepts; a thread per connection handles it

    def close(self) -> None:
        """Stops listening (again: nothing)."""
        if self._wake_writer.fileno() < 0:
            return
        self._wake_writer.send(b"\0")
        self._thread.join(timeout=5)
        self._server.server_close()
        self._wake_reader.close()
        self._wake_writer.close()

    def __enter__(self) -> AttemptCollector:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
