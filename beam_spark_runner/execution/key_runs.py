"""Runs of equal keys in key-sorted Arrow batches.

GroupByKey and stateful stages read partitions that Spark shuffled on the ``key`` column and
sorted by it. A key's run of rows may span batches; these helpers cut batches at key
changes with Arrow compute, without a Python call per row.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_spark_runner.coders import packed_bytes


def run_starts(keys: pa.Array) -> list[int]:
    """Row indexes where each run of equal keys starts, then the row count."""
    rows = len(keys)
    if rows == 0:
        return [0]
    changes = pc.not_equal(keys.slice(1), keys.slice(0, rows - 1))
    return [0, *(int(i) + 1 for i in np.flatnonzero(changes.to_numpy(zero_copy_only=False))), rows]


def key_run_cells(keys: pa.Array, elements: pa.Array) -> list[tuple[bytes | None, bytes]]:
    """Each run of equal keys of a sorted batch: its key and its elements concatenated.

    One copy of each run's bytes out of the Arrow data buffer; no Arrow call per run.
    """
    starts = run_starts(keys)
    if len(starts) < 2:
        return []
    run_keys = keys.take(pa.array(starts[:-1], type=pa.int64())).to_pylist()
    if elements.null_count or elements.type not in (pa.binary(), pa.large_binary()):
        return [
            (key, packed_bytes(elements.slice(start, end - start)))
            for key, (start, end) in zip(run_keys, itertools.pairwise(starts), strict=True)
        ]
    offsets_type = np.int64 if elements.type == pa.large_binary() else np.int32
    _, offsets_buffer, data_buffer = elements.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offsets_type)[elements.offset :]
    bounds = offsets[np.asarray(starts)].tolist()
    if data_buffer is None:
        return [(key, b"") for key in run_keys]
    data = memoryview(data_buffer)
    return [
        (key, data[start:end].tobytes())
        for key, (start, end) in zip(run_keys, itertools.pairwise(bounds), strict=True)
    ]


def complete_key_groups(batches: Iterable[tuple[pa.Array, pa.Array]]) -> Iterator[bytes]:
    """Concatenated encoded elements of whole keys, from (keys, elements) sorted batches.

    Each yielded chunk holds every element of the keys in it, and no key appears in two
    chunks: the last key run of a batch is held back until a later batch shows it ended.
    One chunk per batch, so a chunk is about a batch's size, except for a key whose run
    is longer than a batch (its elements are held until the run ends).
    """
    carry: list[bytes] = []
    carry_key: bytes | None = None
    for keys, elements in batches:
        rows = len(keys)
        if rows == 0:
            continue
        last_start = run_starts(keys)[-2]
        if last_start > 0:
            # Everything before the last run is complete, and so is the carried run.
            yield b"".join([*carry, packed_bytes(elements.slice(0, last_start))])
            carry = []
        elif carry and keys[0].as_py() != carry_key:
            yield b"".join(carry)
            carry = []
        carry.append(packed_bytes(elements.slice(last_start)))
        carry_key = keys[last_start].as_py()
    if carry:
        yield b"".join(carry)


def pack_by_key(keys: pa.Array, elements: pa.Array) -> tuple[pa.Array, pa.Array]:
    """One row per distinct key: its elements' encodings concatenated into one cell.

    Sorts a bundle's keyed output by key (stable) and cuts it into runs; after the sort a
    run's elements are contiguous in the data buffer, so each packed cell is a slice of it
    and nothing is copied twice. Fewer, larger rows make Spark's shuffle and sort cheaper;
    GroupByKey and stateful stages read packed cells as they read single elements (a stage
    with streamed side inputs does not: ``BundleOutputs.record_batches``' ``unpacked``).
    """
    if len(keys) < 2:
        return keys, elements
    order = pc.sort_indices(keys)
    sorted_keys = keys.take(order)
    starts = run_starts(sorted_keys)
    if len(starts) - 1 == len(keys):  # every key distinct: nothing to pack
        return keys, elements
    sorted_elements = elements.take(order)
    _, offsets_buffer, data_buffer = sorted_elements.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[sorted_elements.offset :]
    packed_offsets = offsets[np.asarray(starts)].astype(np.int32)
    packed = pa.Array.from_buffers(
        pa.binary(), len(starts) - 1, [None, pa.py_buffer(packed_offsets), data_buffer]
    )
    return sorted_keys.take(pa.array(starts[:-1], type=pa.int64())), packed
