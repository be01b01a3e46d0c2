"""A launched process handing itself over to a warm process's fork.

Spark's JVM launches Python processes that would each import much before doing little: a
streaming level's pre-init (``streaming.pre_init_server``), a local session's worker daemon
(``worker_zygote``). Where a warm process is at hand, the launched one sends it a request
with its standard descriptors (:func:`send`); the warm process reads it (:func:`receive`)
and forks a copy that takes over the launched process's environment, working directory and
import path (:func:`take_over`).

Imports only what the interpreter has loaded at start: the start-up hook imports it in every
pre-init process, and a launched worker daemon before anything else.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from socket import socket

HEADER = 4  # bytes of the request's length, sent with the descriptors


def send(connection: socket, payload: bytes, descriptors: Sequence[int]) -> None:
    """Sends ``payload`` and copies of ``descriptors`` over a Unix socket."""
    import socket

    socket.send_fds(connection, [len(payload).to_bytes(HEADER, "big")], list(descriptors))
    connection.sendall(payload)


def receive(connection: socket, descriptors: int) -> tuple[bytes, list[int]]:
    """A request :func:`send` sent with ``descriptors`` descriptors.

    Raises ``EOFError`` where it is cut short or has another number of descriptors (those
    it had are closed).
    """
    import socket

    header, received, _, _ = socket.recv_fds(connection, HEADER, descriptors)
    payload = bytearray()
    if len(header) == HEADER and len(received) == descriptors:
        size = int.from_bytes(header, "big")
        while len(payload) < size:
            chunk = connection.recv(size - len(payload))
            if not chunk:
                break
            payload += chunk
        if len(payload) == size:
            return bytes(payload), list(received)
    for descriptor in received:
        os.close(descriptor)
    raise EOFError("a hand-over request cut short")


def take_over(environment: Mapping[str, str], cwd: str) -> list[str]:
    """In the fork: takes the launched process's environment and working directory.

    Returns its import path: ``PYTHONPATH``'s entries first, as an interpreter puts them at
    start, then this process's own (the caller sets ``sys.path`` to it).
    """
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    extra = [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    return extra + [p for p in sys.path if p not in extra]
