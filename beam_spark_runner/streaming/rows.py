"""The rows every step of the streaming query reads and writes.

One layout for elements and watermark markers alike, so a step passes on what is not
addressed to it without looking inside:

* ``target``, ``shard``, ``key``: the node (``topology.SINK`` for markers leaving the
  graph); a stateful target's shard (a stable hash of the key; unkeyed elements a stage
  outputs go in equal contiguous parts, ``addressed_column``), else 0; the key;
* ``element``: Beam-encoded elements, packed per target, shard and port (``packed``) and
  compressed (read them through ``cell``); null for a marker;
* ``producer``, ``watermark``, ``ptime``: a marker's sender, its output watermark and the
  micro-batch's processing time, in microseconds; null for elements;
* ``port``: 0 main input; n the n-th side input (sent to every shard); ``KEYED_RUN``
  elements framed with their keys (a GroupByKey's); ``FRAMED_RUN`` framed with their lengths
  (a stage with side inputs reads their headers first); ``COLUMNS`` a ``ReadFromSparkStream``
  batch as one Arrow IPC cell (``spark_sources.ColumnsInput``), ``producer`` naming the read;
  ``PICKLED_RUN`` pickled runs of a stage with side inputs' main elements
  (``coders.pickled_runs``), each framed with its length.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_spark_runner.coders import arrow_columns as stage_columns
from beam_spark_runner.coders import pickled_runs
from beam_spark_runner.streaming.compression import pack, unpack
from beam_spark_runner.streaming.topology import GROUP, SINK, Node, Topology
from beam_spark_runner.streaming.watermarks import Marker, producer_id

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

TARGET = "target"
SHARD = "shard"
KEY = "key"
ELEMENT = "element"
PRODUCER = "producer"
WATERMARK = "watermark"
PTIME = "ptime"
PORT = "port"

ROUTED_SCHEMA = pa.schema(
    [
        pa.field(TARGET, pa.int32()),
        pa.field(SHARD, pa.int32()),
        pa.field(KEY, pa.binary()),
        pa.field(ELEMENT, pa.binary()),
        pa.field(PRODUCER, pa.string()),
        pa.field(WATERMARK, pa.int64()),
        pa.field(PTIME, pa.int64()),
        pa.field(PORT, pa.int32()),
    ]
)

# A row as a tuple in ROUTED_SCHEMA's column order.
Row = tuple[int, int, "bytes | None", "bytes | None", "str | None", "int | None", "int | None", int]

# The most bytes of elements ``packed`` puts in one row (a run is cut after the element
# that reaches it).
PACKED_CELL_BYTES = 1 << 20

# The port of a keyed run: a GroupByKey shard's elements, each framed with its key
# (``_FRAME``: the key's and the element's lengths, then the key, then the element).
KEYED_RUN = -1
_FRAME = struct.Struct(">II")
# The port of a Spark stream's rows as columns (see the module doc).
COLUMNS = -2
# The port of a framed run: a stage with side inputs' main elements, each framed with its
# length (``_LENGTH``), then the element.
FRAMED_RUN = -3
_LENGTH = struct.Struct(">I")
# A framed run's element length, for its readers.
FRAMED_LENGTH = _LENGTH
# The port of pickled runs (``coders.pickled_runs``), each framed (``pickled_runs.frame``).
PICKLED_RUN = -4


@functools.cache
def routed_type() -> StructType:
    """``ROUTED_SCHEMA`` as a Spark type."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    return StructType(
        [
            StructField(TARGET, IntegerType()),
            StructField(SHARD, IntegerType()),
            StructField(KEY, BinaryType()),
            StructField(ELEMENT, BinaryType()),
            StructField(PRODUCER, StringType()),
            StructField(WATERMARK, LongType()),
            StructField(PTIME, LongType()),
            StructField(PORT, IntegerType()),
        ]
    )


@functools.cache
def routed_row() -> Any:
    """A Spark ``Row`` class with the routed columns (``transformWithState`` yields rows)."""
    from pyspark.sql import Row as SparkRow

    return SparkRow(*ROUTED_SCHEMA.names)


def shard_of(key: bytes | None, shards: int) -> int:
    """The shard of a key: a stable hash (Python's ``hash`` is salted per process)."""
    return zlib.crc32(key or b"") % shards


def element_row(topology: Topology, target: int, key: bytes | None, element: bytes) -> Row:
    """An element (or a packed run of elements) addressed to ``target``.

    A stateful target's shard is its key's; an unkeyed element (bound for a splittable
    DoFn or a stage with side inputs) goes to the shard its bytes hash to.
    """
    node = topology.nodes[target]
    shard = shard_of(key if key is not None else element, topology.shards) if node.stateful else 0
    return (target, shard, key, element, None, None, None, 0)


def columns_row(target: int, producer: str, cell: bytes) -> Row:
    """A Spark stream's rows, an Arrow IPC stream, for stateless ``target``."""
    return (target, 0, None, cell, producer, None, None, COLUMNS)


def element_batch(topology: Topology, target: int, elements: pa.Array) -> pa.RecordBatch:
    """A column of unkeyed elements addressed to ``target``, packed.

    Each is addressed as ``element_row`` would; one row per shard and run of up to
    ``PACKED_CELL_BYTES``.
    """
    if topology.nodes[target].stateful:
        values = elements.to_pylist()
        return to_batch(
            packed(addressed_rows(topology, target, [None] * len(values), values), topology)
        )
    cells = _runs(elements.cast(pa.binary()))
    count = len(cells)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.full(count, target, dtype=np.int32)),
            pa.array(np.zeros(count, dtype=np.int32)),
            pa.nulls(count, pa.binary()),
            pa.array(cells, pa.binary()),
            pa.nulls(count, pa.string()),
            pa.nulls(count, pa.int64()),
            pa.nulls(count, pa.int64()),
            pa.array(np.zeros(count, dtype=np.int32)),
        ],
        schema=ROUTED_SCHEMA,
    )


def addressed_rows(
    topology: Topology, target: int, keys: list[bytes | None], elements: list[bytes]
) -> list[Row]:
    """Elements (with their keys, or None) addressed to ``target``, in runs.

    The runs ``packed`` makes of their ``element_row`` rows: per shard, in their order, as
    a keyed run for a GroupByKey, a framed run for a stage with side inputs, else
    concatenated; a run cut once it reaches ``PACKED_CELL_BYTES``. Without a row per
    element (1.8 against about 0.6 us an element, Nexmark q7's bids). Not compressed yet:
    ``packed`` takes such rows as they are (joining those of an address) and compresses.
    """
    node = topology.nodes[target]
    if not node.stateful:
        return [_row((target, 0, 0), _joined(run)) for run in _cut(elements)]
    shards = topology.shards
    crc32 = zlib.crc32
    # ``_cut``'s rule counted per shard as pieces come, joined once per run: cheaper than ``_cut``.
    pieces: list[list[bytes]] = [[] for _ in range(shards)]
    sizes = [0] * shards
    cuts: list[list[bytes]] = [[] for _ in range(shards)]

    def cut(shard: int) -> None:
        cuts[shard].append(_joined(pieces[shard]))
        pieces[shard], sizes[shard] = [], 0

    if node.kind == GROUP:
        frame, framing = _FRAME.pack, _FRAME.size
        for key, element in zip(keys, elements, strict=True):
            assert key is not None, "a GroupByKey's element without its key"
            shard = crc32(key) % shards
            pieces[shard] += (frame(len(key), len(element)), key, element)
            sizes[shard] += framing + len(key) + len(element)
            if sizes[shard] >= PACKED_CELL_BYTES:
                cut(shard)
        port = KEYED_RUN
    elif node.side_expected:
        length, framing = _LENGTH.pack, _LENGTH.size
        for key, element in zip(keys, elements, strict=True):
            shard = crc32(key if key is not None else element) % shards
            pieces[shard] += (length(len(element)), element)
            sizes[shard] += framing + len(element)
            if sizes[shard] >= PACKED_CELL_BYTES:
                cut(shard)
        port = FRAMED_RUN
    else:
        for key, element in zip(keys, elements, strict=True):
            shard = crc32(key if key is not None else element) % shards
            pieces[shard].append(element)
            sizes[shard] += len(element)
            if sizes[shard] >= PACKED_CELL_BYTES:
                cut(shard)
        port = 0
    for shard in range(shards):
        if pieces[shard]:
            cut(shard)
    return [_row((target, shard, port), run) for shard in range(shards) for run in cuts[shard]]


def addressed_column(topology: Topology, target: int, column: pa.Array) -> list[Row]:
    """Unkeyed elements (an Arrow column) addressed to ``target``, in runs, made in Arrow.

    A stateless target gets the runs ``addressed_rows`` makes. A stateful one (a splittable
    DoFn's or a stage with side inputs' shards, which may process any element) gets the
    column in equal contiguous parts, the first to shard 0: no element is hashed or turned
    into a Python value, and a batch's shards are as busy as each other. Each part is
    framed for a stage with side inputs (which reads each element's length) and cut into
    runs where ``_runs`` cuts. Not for a GroupByKey, whose elements have keys.
    """
    node = topology.nodes[target]
    if node.kind == GROUP:
        raise ValueError(f"expected a target without keys; found GroupByKey node {target}")
    column = column.cast(pa.binary())
    if not node.stateful:
        return [_row((target, 0, 0), run) for run in _runs(column)]
    port = FRAMED_RUN if node.side_expected else 0
    if port == FRAMED_RUN:
        column = _framed(column)
    shards = topology.shards
    each, more = divmod(len(column), shards)
    rows: list[Row] = []
    start = 0
    for shard in range(shards):
        count = each + (shard < more)
        if count:
            part = column.slice(start, count)
            rows.extend(_row((target, shard, port), run) for run in _runs(part))
        start += count
    return rows


def _framed(elements: pa.BinaryArray) -> pa.BinaryArray:
    """Each element with its length before it (``_LENGTH``), as one column."""
    offsets = np.frombuffer(elements.buffers()[1], dtype=np.int32)[
        elements.offset : elements.offset + len(elements) + 1
    ]
    lengths = np.diff(offsets).astype(">u4")  # _LENGTH's layout
    headers = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(_LENGTH.size), len(elements), [None, pa.py_buffer(lengths.tobytes())]
    )
    return pc.binary_join_element_wise(headers.cast(pa.binary()), elements, b"")


def _cut(elements: list[bytes]) -> list[list[bytes]]:
    """``elements`` in runs, each cut after the element that reaches ``PACKED_CELL_BYTES``."""
    runs: list[list[bytes]] = []
    run: list[bytes] = []
    size = 0
    for element in elements:
        run.append(element)
        size += len(element)
        if size >= PACKED_CELL_BYTES:
            runs.append(run)
            run, size = [], 0
    if run:
        runs.append(run)
    return runs


def framed_outputs(topology: Topology, node: Node) -> frozenset[int]:
    """The outputs of ``node`` that a stage with streamed side inputs reads as main input.

    Such a stage reads each main element's header for the side windows it waits for
    (``FRAMED_RUN``), so these outputs go one element a row, never packed by key.
    """
    return frozenset(
        index
        for index, targets in enumerate(node.targets)
        if any(topology.nodes[target].side_expected for target in targets)
    )


def run_outputs(
    topology: Topology, node: Node, run_readers: Collection[int], local: Collection[int]
) -> dict[int, int]:
    """The outputs of ``node`` that may go in pickled runs, each with its number of parts.

    Those whose every reader (none a side input, none in ``local``) is in ``run_readers``:
    stages with side inputs that read their main elements in runs. A run per shard.
    """
    return {
        index: topology.shards
        for index, targets in enumerate(node.targets)
        if targets
        and all(t in run_readers and t not in local for t in targets)
        and not (node.side_targets and node.side_targets[index])
    }


def _holds_runs(column: pa.BinaryArray) -> bool:
    """Whether a stage output's column holds pickled runs.

    Else it holds elements Beam's windowed-value coder encoded, which never start as a run.
    """
    if not len(column) or column.null_count:
        return False
    first = column.slice(0, 1).cast(pa.binary())
    offsets = np.frombuffer(first.buffers()[1], dtype=np.int32)[first.offset : first.offset + 2]
    start, end = int(offsets[0]), int(offsets[1])
    return end > start and pickled_runs.is_run(first.buffers()[2][start : start + 1].to_pybytes())


def run_rows(topology: Topology, target: int, column: pa.BinaryArray) -> list[Row]:
    """Pickled runs addressed to ``target``, the i-th to shard i modulo the shards."""
    frame, shards = pickled_runs.frame, topology.shards
    return [
        _row((target, index % shards, PICKLED_RUN), frame(run))
        for index, run in enumerate(column.to_pylist())
    ]


def stage_output_rows(
    topology: Topology,
    node: Node,
    output: pa.RecordBatch,
    local: Collection[int] = (),
    data: dict[int, list[bytes]] | None = None,
    runs: Collection[int] = (),
) -> list[Row]:
    """A stage's output batch addressed to the readers of its output.

    The batch is in the stage output layout (``arrow_columns``: tag, key, element). The
    outputs in ``runs`` may hold pickled runs: those go as they are (``run_rows``). Rows go
    in runs per reader (``addressed_rows``;
    unkeyed elements for any but a GroupByKey from their column, ``addressed_column``), a
    side input's per element and shard.
    Readers in ``local`` (a router's own stages) get the elements in ``data`` instead.
    """
    tags = output.column(stage_columns.TAG)
    distinct = pc.unique(tags).to_pylist()  # one: each batch a stage worker makes
    rows: list[Row] = []
    for tag in distinct:
        part = output if len(distinct) == 1 else output.filter(pc.equal(tags, tag))
        column = part.column(stage_columns.ELEMENT)
        if tag in runs and _holds_runs(column):
            for target in node.targets[tag]:
                rows.extend(run_rows(topology, target, column))
            continue
        unkeyed = part.column(stage_columns.KEY).null_count == part.num_rows
        values: list[bytes] | None = None
        keys: list[bytes | None] | None = None
        for target in node.targets[tag]:
            if unkeyed and target not in local and topology.nodes[target].kind != GROUP:
                rows.extend(addressed_column(topology, target, column))
                continue
            if values is None:
                values = column.to_pylist()
            if target in local:
                assert data is not None, "a router's own stages read their elements in data"
                data[target].extend(values)
                continue
            if keys is None:
                keys = part.column(stage_columns.KEY).to_pylist()
            rows.extend(addressed_rows(topology, target, keys, values))
        if node.side_targets:
            for target, port in node.side_targets[tag]:
                if target not in local:
                    if values is None:
                        values = column.to_pylist()
                    for element in values:
                        rows.extend(side_element_rows(topology, target, port, element))
    return rows


def _runs(elements: pa.BinaryArray) -> list[bytes]:
    """The elements of an Arrow column concatenated, in runs of about ``PACKED_CELL_BYTES``.

    Their bytes are contiguous in the column's data buffer: no copy per element.
    """
    if elements.null_count:
        raise ValueError(f"expected encoded elements, found {elements.null_count} null(s)")
    offsets = np.frombuffer(elements.buffers()[1], dtype=np.int32)[
        elements.offset : elements.offset + len(elements) + 1
    ]
    data = elements.buffers()[2]
    cells: list[bytes] = []
    start = 0
    while start < len(elements):
        # The first element boundary at or past a cell's worth of bytes from ``start``.
        end = int(np.searchsorted(offsets, offsets[start] + PACKED_CELL_BYTES, side="left"))
        end = min(max(end, start + 1), len(elements))
        cells.append(data[int(offsets[start]) : int(offsets[end])].to_pybytes())
        start = end
    return cells


def packed(rows: Iterable[Row], topology: Topology) -> list[Row]:
    """``rows`` with the elements of each target, shard and port in one row.

    The elements are concatenated in their order; a run is cut once it reaches
    ``PACKED_CELL_BYTES``. Only a GroupByKey's shard reads the key column (a stateful
    stage's elements carry their keys; the key chose the shard): a GroupByKey's elements
    are packed as a keyed run (``keyed_run_elements`` reads one back), the others' without
    their keys. A stage with side inputs gets its main elements as a framed run
    (``framed_run_elements`` reads one back). Each row's cell is compressed (``cell``
    reads it back); ``rows`` must hold none compressed. Markers are kept as they are,
    after the elements.
    """
    runs: dict[tuple[int, int, int], list[bytes]] = {}
    grouped = {node.index for node in topology.nodes if node.kind == GROUP}
    waiting = {node.index for node in topology.nodes if node.side_expected}
    frame = _FRAME.pack
    length = _LENGTH.pack
    markers: list[Row] = []
    for row in rows:
        target, shard, key, element = row[0], row[1], row[2], row[3]
        if element is None:
            markers.append(row)
            continue
        port = row[7]
        if port == 0 and target in grouped:
            assert key is not None, "a GroupByKey's element without its key"
            element = frame(len(key), len(element)) + key + element
            port = KEYED_RUN
        elif port == 0 and target in waiting:
            element = length(len(element)) + element
            port = FRAMED_RUN
        address = (target, shard, port)
        run = runs.get(address)
        if run is None:
            run = runs[address] = []
        run.append(element)
    out = [_row(address, pack(_joined(cut))) for address, run in runs.items() for cut in _cut(run)]
    out.extend(markers)
    return out


def _joined(run: list[bytes]) -> bytes:
    return run[0] if len(run) == 1 else b"".join(run)


def _row(address: tuple[int, int, int], cell: bytes) -> Row:
    target, shard, port = address
    return (target, shard, None, cell, None, None, None, port)


def cell(value: Any) -> bytes:
    """A row's element cell as its reader reads it: the elements ``packed`` packed."""
    return unpack(bytes(value))


def keyed_run_elements(run: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The (key, element) pairs of a keyed run, in order."""
    unpack = _FRAME.unpack_from
    position, end = 0, len(run)
    while position < end:
        key_length, element_length = unpack(run, position)
        position += _FRAME.size
        key_end = position + key_length
        element_end = key_end + element_length
        yield run[position:key_end], run[key_end:element_end]
        position = element_end


def framed_run_elements(run: bytes) -> Iterator[bytes]:
    """The elements of a framed run, in order."""
    unpack = _LENGTH.unpack_from
    position, end = 0, len(run)
    while position < end:
        (length,) = unpack(run, position)
        position += _LENGTH.size
        yield run[position : position + length]
        position += length


def output_rows(
    topology: Topology, node: Node, output: int, key: bytes | None, element: bytes
) -> list[Row]:
    """An output element of ``node``, addressed to each reader of its output ``output``."""
    rows = [element_row(topology, target, key, element) for target in node.targets[output]]
    if node.side_targets:
        for target, port in node.side_targets[output]:
            rows.extend(side_element_rows(topology, target, port, element))
    return rows


def side_element_rows(topology: Topology, target: int, port: int, element: bytes) -> list[Row]:
    """An element of ``target``'s side input ``port``, for each of its shards."""
    return [(target, s, None, element, None, None, None, port) for s in range(topology.shards)]


def marker_rows(topology: Topology, target: int, marker: Marker) -> Iterator[Row]:
    """A marker addressed to ``target``: one row per shard of a stateful target."""
    shards = topology.shards if target >= 0 and topology.nodes[target].stateful else 1
    for shard in range(shards):
        yield (
            target,
            shard,
            None,
            None,
            marker.producer,
            marker.watermark,
            marker.processing_time,
            0,
        )


def routed_marker(topology: Topology, node: Node, shard: int, output: int, now: int) -> list[Row]:
    """A stateful shard's output watermark as markers to its readers (or the sink)."""
    marker = Marker(producer_id(node.index, shard), output, now)
    rows: list[Row] = []
    # Readers or not, the driver hears every shard's watermark (progress reports).
    for target in (*node.all_targets, SINK):
        rows.extend(marker_rows(topology, target, marker))
    return rows


def to_batch(rows: Iterable[Row]) -> pa.RecordBatch:
    """Rows as one Arrow batch in ``ROUTED_SCHEMA``."""
    columns: list[list[Any]] = [[] for _ in ROUTED_SCHEMA]
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, ROUTED_SCHEMA, strict=True)],
        schema=ROUTED_SCHEMA,
    )


def elements_and_markers(rows: Iterable[Any]) -> tuple[list[bytes], list[Marker]]:
    """A shard's rows split into element cells and markers."""
    cells: list[bytes] = []
    markers: list[Marker] = []
    for row in rows:
        if row[ELEMENT] is not None:
            cells.append(cell(row[ELEMENT]))
        else:
            markers.append(marker_of(row))
    return cells, markers


def marker_of(row: dict[str, Any] | Any) -> Marker:
    """The marker a row (a mapping or a Spark ``Row``) holds."""
    return Marker(row[PRODUCER], row[WATERMARK], row[PTIME])
