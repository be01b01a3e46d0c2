r"""Reading ``ReadFromText``'s files in the stage worker, without Beam's per-line SDF path.

For a plain ``ReadFromText`` (planning.py decides which) the runner ships byte ranges of the
files to the stage that reads the lines, whose worker splits each range into the encoded
elements of the lines PCollection; its batched steps or bundle processor start after the
read. The lines are exactly Beam's (``textio._TextSource.read_records``, default
separator): a record starts at offset 0 and after every ``\n`` and ends before its ``\n``
or ``\r\n``; a last record without a separator keeps any ``\r``; an empty last record is
not one. A record belongs to the range holding its first byte. Each line is a value in the
global window at the minimum timestamp with an unknown pane, as Beam outputs it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator

from beam_spark_runner import beam_internals as bi

# Bytes read from a file at a time (Beam reads 8 KiB at a time).
BLOCK_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class TextRange:
    """The records of ``path`` whose first byte is in ``[start, end)``."""

    path: str
    start: int
    end: int

    def encode(self) -> bytes:
        """The range as a row's ``element`` cell."""
        return json.dumps([self.path, self.start, self.end]).encode()

    @classmethod
    def decode(cls, data: bytes) -> TextRange:
        """The inverse of :meth:`encode`."""
        path, start, end = json.loads(data)
        return cls(path, start, end)


def split_ranges(files: Iterable[tuple[str, int]], parallelism: int) -> list[TextRange]:
    """Byte ranges covering ``files`` ((path, size) pairs): about one per task.

    Ranges are at most 64 MiB and at least 1 MiB (except a file's last piece), so that a
    large input gives every task a share and a task's memory stays bounded.
    """
    files = [(path, size) for path, size in files if size > 0]
    total = sum(size for _, size in files)
    if not total:
        return []
    target = min(64 << 20, max(1 << 20, -(-total // max(1, parallelism))))
    ranges = []
    for path, size in files:
        pieces = -(-size // target)
        for index in range(pieces):
            ranges.append(TextRange(path, size * index // pieces, size * (index + 1) // pieces))
    return ranges


def _varint(value: int) -> bytes:
    """``value`` as the varint Beam's coders write (a string's length prefix)."""
    out = bi.create_OutputStream()
    out.write_var_int64(value)
    return bytes(out.get())


class LineEncoder:
    """Encodes lines as windowed ``str`` values: a constant header, a length, the bytes.

    ``header`` is the encoding of a windowed value in the global window at the minimum
    timestamp with an unknown pane, up to its value: what the stage's input coder (a
    windowed ``StrUtf8Coder``, maybe length-prefixed) writes before a string's length.
    """

    def __init__(self, header: bytes) -> None:
        self.header = header
        self._prefixes: list[bytes] = []

    def _grow(self, longest: int) -> list[bytes]:
        prefixes = self._prefixes
        header = self.header
        prefixes.extend(header + _varint(n) for n in range(len(prefixes), longest + 1))
        return prefixes

    def encode(self, lines: list[bytes]) -> bytes:
        """The concatenated encoded elements of ``lines``."""
        if not lines:
            return b""
        prefixes = self._prefixes
        longest = max(map(len, lines))
        if longest >= len(prefixes):
            prefixes = self._grow(longest)
        parts = [b""] * (2 * len(lines))
        parts[0::2] = [prefixes[len(line)] for line in lines]
        parts[1::2] = lines
        return b"".join(parts)


def read_lines(
    stream: object, start: int, end: int, block_bytes: int = BLOCK_BYTES
) -> Iterator[list[bytes]]:
    """The records (separators stripped) of a seekable binary file in ``[start, end)``.

    Yields them a block at a time. ``stream`` has ``seek`` and ``read`` (a file object).
    """
    if start >= end:
        return
    pos = 0
    carry = b""
    if start > 0:
        # The record holding byte start - 1 belongs to an earlier range: skip past its
        # separator (if byte start - 1 is a "\n", the record at start is ours).
        stream.seek(start - 1)  # type: ignore[attr-defined]
        pos = start - 1
        while True:
            chunk = stream.read(block_bytes)  # type: ignore[attr-defined]
            if not chunk:
                return
            found = chunk.find(b"\n")
            if found >= 0:
                pos += found + 1
                carry = chunk[found + 1 :]
                break
            pos += len(chunk)
    # Invariant: carry holds the bytes from offset pos on, and pos is a record start.
    while pos < end:
        chunk = stream.read(block_bytes)  # type: ignore[attr-defined]
        data = carry + chunk if carry else chunk
        last = data.rfind(b"\n")
        if last >= 0:
            complete = data[:last]
            carry = data[last + 1 :]
            lines = complete.split(b"\n")
            if pos + last + 1 >= end:
                # Only records starting before end: the first, and one after each "\n"
                # before byte end - 1.
                lines = lines[: complete.count(b"\n", 0, end - pos - 1) + 1]
            if b"\r" in complete:
                lines = [line[:-1] if line[-1:] == b"\r" else line for line in lines]
            yield lines
            pos += last + 1
        else:
            carry = data
        if not chunk:
            if carry and pos < end:
                yield [carry]  # a last record without a separator: nothing stripped
            return


class TextInput:
    """One bundle's input: the lines of ``ranges``, encoded, read a block at a time.

    The data channel hands the blocks to the bundle processor as it asks for them, so a
    task holds one block of a file in memory, not its whole range.
    """

    def __init__(self, ranges: list[TextRange], header: bytes) -> None:
        self.ranges = ranges
        self.header = header

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __iter__(self) -> Iterator[bytes]:
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        encoder = LineEncoder(self.header)
        for text_range in self.ranges:
            # Planning read only files whose compression resolves to uncompressed.
            with FileSystems.open(
                text_range.path, compression_type=CompressionTypes.UNCOMPRESSED
            ) as stream:
                # BLOCK_BYTES read here, not bound as a default: tests read in small blocks.
                for lines in read_lines(stream, text_range.start, text_range.end, BLOCK_BYTES):
                    yield encoder.encode(lines)
