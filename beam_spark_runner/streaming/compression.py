"""Bytes the streaming query moves and keeps, compressed: rows' element cells and state.

Buffered elements and shard states compress well (their encodings repeat class names,
fields, windows and keys), and both cross between the JVM and Python at every step: state
through Pyrolite's pickler, row cells (``rows.packed``) through Arrow and every shuffle.
``pack`` compresses (Zstandard level 1, shipped with pyarrow) a value of ``PACK_AT_LEAST``
bytes or more where that makes it smaller; ``unpack`` gives back what ``pack`` was given,
and takes an unpacked value as it is. So a packed value starts with ``_MAGIC``, which
nothing the runner writes unpacked may start with: shard states are pickles (``0x80``),
framed or keyed runs a 4-byte big-endian length under 2 GiB, Beam's windowed values a
timestamp (``0x7f`` or ``0x80``), Arrow IPC columns ``0xffffffff``.
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
