"""Bytes the streaming query moves and keeps, compressed: rows' element cells and state.

Buffered elements and shard states compress well (their encodings repeat class names,
field names, windows and keys): Zstandard at level 1, which pyarrow ships, made a
megabyte of Nexmark q7's waiting bids (pickled, about 300 bytes each) 16 times smaller at
more than a gigabyte a second. Two places pay for every byte:

* **State.** What a ``transformWithState`` processor reads back from its state crosses
  from the JVM to Python through Pyrolite's pickler, which writes a binary value a
  character at a time: q7's micro-batch that fired a window spent 5.8 s of task time
  handing the window's waiting bids back (3.3 s compressed). A shard's state value and its
  buffered chunks are written packed.
* **Rows.** A row's element cell (``rows.packed``: up to a megabyte of elements bound for
  one target and shard) is copied into Arrow and out of it at every step it passes, Python
  and JVM, and through every shuffle on its way, levels it only passes through included:
  the cells ``rows`` packs are packed too, and their readers unpack them.

``pack`` compresses a value of ``PACK_AT_LEAST`` bytes or more where that makes it
smaller; ``unpack`` gives back what ``pack`` was given, and takes a value that was not
packed (written by an earlier runner version, or short) as it is.

A packed value starts with ``_MAGIC``, which nothing the runner writes unpacked starts with:
shard states are pickles (``0x80``, the protocol opcode, first); a framed or keyed run
starts with a length in four big-endian bytes, and no element or key is 4 GiB (a Spark
binary value is at most 2 GiB); a run of Beam's windowed values starts with the first one's
timestamp (milliseconds, sign bit flipped: ``0x7f`` or ``0x80`` for every time Beam has); a
Spark stream's columns (Arrow IPC) start with ``0xffffffff``.
"""

from __future__ import annotations

import functools
import struct

import pyarrow as pa

_MAGIC = b"\xffZS1"
_SIZE = struct.Struct("<Q")
_HEADER = len(_MAGIC) + _SIZE.size

# Values shorter than this are kept as they are (a Zstandard frame costs ~10 bytes, and the
# call more than a short value's copies).
PACK_AT_LEAST = 512


@functools.cache
def _codec() -> pa.Codec:
    return pa.Codec("zstd", compression_level=1)


def pack(data: bytes) -> bytes:
    """``data`` as stored or sent: compressed when long enough and that makes it smaller."""
    if len(data) < PACK_AT_LEAST:
        return data
    compressed = _codec().compress(data, asbytes=True)
    if len(compressed) + _HEADER >= len(data):
        return data
    return _MAGIC + _SIZE.pack(len(data)) + compressed


def unpack(data: bytes) -> bytes:
    """What ``pack`` was given (a value written before packing, unchanged)."""
    if not data.startswith(_MAGIC):
        return data
    (size,) = _SIZE.unpack_from(data, len(_MAGIC))
    result = _codec().decompress(memoryview(data)[_HEADER:], decompressed_size=size, asbytes=True)
    assert isinstance(result, bytes)
    return result
