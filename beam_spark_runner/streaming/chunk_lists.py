"""A shard's buffered elements in a ``transformWithState`` list state: appended, read when due.

A shard's state value is read and written whole every micro-batch. What a shard buffers
for a later batch (a GroupByKey's values until their window fires, a side-input stage's
main elements until their side inputs are ready) is most of its state, so it lives beside
the value, in a list state of (tag, chunk) rows: each micro-batch appends one chunk per
tag that got elements (one ``appendList`` call), and only a batch in which some tags are
due reads the list, takes their chunks and puts the rest back. The tag says what a chunk
waits for (a window, a side input's watermarks); the chunk is whatever its node encodes,
compressed on the way in (``compression``: what the JVM reads back crosses to Python a
character at a time). Chunks put back are put back as they were stored.
"""

from __future__ import annotations

from typing import Any, Protocol

from beam_spark_runner.streaming.compression import pack, unpack


class ChunkStore(Protocol):
    """Where a shard keeps chunks of buffered elements between micro-batches."""

    def append(self, chunks: list[tuple[bytes, bytes]]) -> None:
        """Adds (tag, chunk) pairs, after those already kept."""

    def take(self, tags: set[bytes]) -> dict[bytes, list[bytes]]:
        """Removes the chunks of any of ``tags``; returns them per tag, in the order added."""


class ListStateChunks:
    """A ``ChunkStore`` in a ``transformWithState`` list state of (tag, chunk) rows."""

    def __init__(self, list_state: Any) -> None:
        self._list = list_state

    def append(self, chunks: list[tuple[bytes, bytes]]) -> None:
        if chunks:
            self._list.appendList([(tag, pack(chunk)) for tag, chunk in chunks])

    def take(self, tags: set[bytes]) -> dict[bytes, list[bytes]]:
        if not tags or not self._list.exists():
            return {}
        taken: dict[bytes, list[bytes]] = {}
        kept = []
        for row in self._list.get():
            tag = bytes(row[0])
            if tag in tags:
                taken.setdefault(tag, []).append(unpack(bytes(row[1])))
            else:
                kept.append((tag, bytes(row[1])))
        if kept:
            self._list.put(kept)
        else:
            self._list.clear()
        return taken
