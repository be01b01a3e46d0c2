"""PySpark's ``ListState`` as a ``transformWithState`` processor sees it, in memory."""

from __future__ import annotations

from collections.abc import Iterator


class ListState:
    """A list state of (tag, chunk) rows; ``writes`` counts the rows written."""

    def __init__(self) -> None:
        self.rows: list[tuple[bytes, bytes]] | None = None
        self.writes = 0

    def exists(self) -> bool:
        return self.rows is not None

    def get(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.rows or [])

    def put(self, rows: list[tuple[bytes, bytes]]) -> None:
        self.rows = list(rows)
        self.writes += len(rows)

    def appendList(self, rows: list[tuple[bytes, bytes]]) -> None:  # noqa: N802 - PySpark's
        self.rows = [*(self.rows or []), *rows]
        self.writes += len(rows)

    def clear(self) -> None:
        self.rows = None
