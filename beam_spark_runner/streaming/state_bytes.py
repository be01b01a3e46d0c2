"""What a shard writes to Spark's state store, compressed on the way in.

Every byte a ``transformWithState`` processor reads back from its state crosses from the
JVM to Python through Pyrolite's pickler, which writes a binary value a character at a
time: on Nexmark q7 the micro-batch that fired a window spent seconds handing the
window's waiting bids (pickled, about 300 bytes each) back to Python. Buffered elements
and shard states compress well (their encodings repeat class names, field names, windows
and keys): Zstandard at level 1, which pyarrow ships, made a megabyte of q7's waiting bids
16 times smaller at more than a gigabyte a second. So a shard's state value and its
buffered chunks are written compressed (``pack``) once they are ``PACK_AT_LEAST`` bytes
or more, and read back by ``unpack``, which also takes what an earlier runner version
wrote uncompressed.

A packed value starts with ``_MAGIC``, which nothing the runner wrote before starts with:
shard states are pickles (``0x80``, the protocol opcode, first), and the only unpickled
chunks, a side-input stage's framed runs, start with their first element's length in
four big-endian bytes, and no element is 4 GiB (a Spark binary value is at most 2 GiB).
"""

from __future__ import annotations

import functools
import struct

import pyarrow as pa

_MAGIC = b"\xffZS1"
_SIZE = struct.Struct("<Q")
_HEADER = len(_MAGIC) + _SIZE.size

# Values shorter than this are written as they are (a Zstandard frame costs ~10 bytes, and
# the call more than a short value's copy through Pyrolite).
PACK_AT_LEAST = 512


@functools.cache
def _codec() -> pa.Codec:
    return pa.Codec("zstd", compression_level=1)


def pack(data: bytes) -> bytes:
    """``data`` as written to the state store: compressed when long enough."""
    if len(data) < PACK_AT_LEAST:
        return data
    compressed = _codec().compress(data, asbytes=True)
    return _MAGIC + _SIZE.pack(len(data)) + compressed


def unpack(data: bytes) -> bytes:
    """What ``pack`` was given (a value written before packing, unchanged)."""
    if not data.startswith(_MAGIC):
        return data
    (size,) = _SIZE.unpack_from(data, len(_MAGIC))
    result = _codec().decompress(memoryview(data)[_HEADER:], decompressed_size=size, asbytes=True)
    assert isinstance(result, bytes)
    return result
