"""In-memory stand-ins for a ``transformWithState`` level's value and list state."""

from __future__ import annotations

from collections.abc import Iterator


class MemoryValue:
    """A value state in memory."""

    def __init__(self) -> None:
        self.value: tuple[bytes] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[bytes] | None:
        # Spark's state server logs a WARN for this (a user sees it): exists() comes first.
        assert self.value is not None, "read of a value state that holds none"
        return self.value

    def update(self, value: tuple[bytes]) -> None:
        self.value = value


class MemoryList:
    """A list state in memory, counting its calls."""

    def __init__(self) -> None:
        self.rows: list[tuple[bytes]] = []
        self.reads = self.puts = self.appends = 0

    def get(self) -> Iterator[tuple[bytes]]:
        self.reads += 1
        return iter(list(self.rows))

    def put(self, rows: list[tuple[bytes]]) -> None:
        self.puts += 1
        self.rows = list(rows)

    def appendList(self, rows: list[tuple[bytes]]) -> None:  # noqa: N802 - PySpark's name
        self.appends += 1
        self.rows.extend(rows)
