"""Spark's own streaming sources (``io.ReadFromSparkStream``) as roots of the query.

Each read is ``spark.readStream.format(...)`` and a ``mapInArrow`` that turns its rows into
routed rows for the root's readers: each row a Beam element (in the global window, at its
event time) and, per task that read anything, a marker with the latest event time it read
less the read's delay. Stateful shards keep each producer's largest watermark, so the
source's watermark never goes back and stays put while nothing arrives. The reads are
unioned with the runner's own source (which says -inf for them, so every stateful shard
downstream still runs each micro-batch): the query's chain never forks.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.arrow_columns import packed_bytes
from beam_spark_runner.coders.row_columns import RowColumnsEncoder, timestamp_micros
from beam_spark_runner.coders.row_values import RowValues
from beam_spark_runner.errors import SparkRunnerError
from beam_spark_runner.io.spark_stream import TIMESTAMP_TYPES, SparkStreamSpec
from beam_spark_runner.planning import SPARK_STREAM_BUFFER_KIND, SPARK_STREAM_URN, Plan
from beam_spark_runner.spark.compat import named_function
from beam_spark_runner.spark.map_in_arrow import ArrowFunction, map_in_arrow, then
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.topology import Topology
from beam_spark_runner.streaming.watermarks import MIN_MICROS, Marker
from beam_spark_runner.translators.base import spark_function_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_LOGGER = logging.getLogger(__name__)
# The rows of a read's first batch encoded both ways, to check the column-wise encoding.
_PROBE_ROWS = 16


class SparkStreamError(SparkRunnerError, RuntimeError):
    """A Spark streaming source could not be opened, or gave a row Beam cannot take."""


@dataclasses.dataclass(frozen=True)
class SparkStreamRoot:
    """One ``ReadFromSparkStream`` of the plan: its producer id, name, spec and coder."""

    producer: str
    name: str
    spec: SparkStreamSpec
    coder_id: str


def spark_stream_roots(plan: Plan) -> list[SparkStreamRoot]:
    """The plan's Spark stream reads, in a stable order."""
    roots = []
    for transform in plan.components.transforms.values():
        if transform.spec.urn != SPARK_STREAM_URN:
            continue
        pcoll = bi.only_element(list(transform.outputs.values()))
        roots.append(
            SparkStreamRoot(
                producer=bi.create_buffer_id(pcoll, kind=SPARK_STREAM_BUFFER_KIND).decode(),
                name=transform.unique_name,
                spec=SparkStreamSpec.decode(transform.spec.payload),
                coder_id=plan.data_channel_coders[pcoll],
            )
        )
    return sorted(roots, key=lambda root: root.producer)


@dataclasses.dataclass(frozen=True)
class StreamColumns:
    """A read's rows as Beam elements: encoded, or made as windowed values directly.

    Its column-wise encoder (``coders.row_columns``) and maker (``coders.row_values``)
    are each checked on the first rows of a process against Beam's own coder: where one
    disagrees, rows are encoded one by one with Beam's coder, or decoded from that
    encoding.
    """

    name: str
    spec: SparkStreamSpec
    # The root's data-channel coder (a windowed-value coder of Beam rows).
    coder: Any

    @functools.cached_property
    def _row_class(self) -> Any:
        return collections.namedtuple("SparkStreamRow", self.spec.schema.names)  # type: ignore[misc]

    @functools.cached_property
    def _timestamp_columns(self) -> frozenset[int]:
        return frozenset(
            i
            for i, field in enumerate(self.spec.schema.fields)
            if type(field.dataType).__name__ in TIMESTAMP_TYPES
        )

    @functools.cached_property
    def _columns(self) -> _ColumnEncoding:
        return _ColumnEncoding(RowColumnsEncoder.for_coder(self.coder))

    @functools.cached_property
    def _values(self) -> _ValueMaking:
        return _ValueMaking(RowValues.for_coder(self.coder))

    def event_micros(self, batch: pa.RecordBatch) -> np.ndarray:
        """The rows' event times, microseconds; an error naming the read for a null one."""
        times = timestamp_micros(batch.column(self.spec.timestamp_column))
        if times.null_count:
            raise SparkStreamError(
                f"ReadFromSparkStream '{self.name}': expected every row to have an event "
                f"time in column {self.spec.timestamp_column!r}; found "
                f"{times.null_count} row(s) where it is null. Filter them out or fill "
                "the column in the source."
            )
        return times.to_numpy().astype(np.int64)

    def encode(self, batch: pa.RecordBatch, micros: np.ndarray) -> pa.Array:
        """The rows as Beam-encoded elements: column-wise once checked, else one by one."""
        columns = self._columns
        if columns.encoder is not None and not columns.checked:
            probe = batch.slice(0, _PROBE_ROWS)
            expected = self._encode_rows(probe, micros[:_PROBE_ROWS])
            if not columns.encoder.agrees(probe, micros[:_PROBE_ROWS], expected):
                _LOGGER.warning(
                    "ReadFromSparkStream '%s': its rows are encoded one by one (the "
                    "column-wise encoding did not give Beam's bytes for its first rows).",
                    self.name,
                )
                columns.encoder = None
            columns.checked = True
        if columns.encoder is not None:
            return columns.encoder.encode(batch, micros)
        return pa.array(self._encode_rows(batch, micros), pa.binary())

    def windowed_values(self, batch: pa.RecordBatch, micros: np.ndarray) -> list[Any] | None:
        """The rows as the windowed values Beam decodes from their encoding.

        Made from the columns once checked; None where they cannot be (the caller decodes
        instead).
        """
        making = self._values
        if making.maker is None:
            return None
        if making.probed is None:
            probe = batch.slice(0, _PROBE_ROWS)
            expected = list(
                self.coder.get_impl().decode_all(
                    b"".join(self._encode_rows(probe, micros[:_PROBE_ROWS]))
                )
            )
            made = None
            try:
                made = making.maker.make(
                    probe, micros[:_PROBE_ROWS], *_row_type_windows_pane(expected[0])
                )
            except (pa.ArrowException, TypeError, ValueError) as error:
                _LOGGER.warning("Making rows from columns failed on a probe: %s", error)
            if made is None or not _same_values(made, expected):
                _LOGGER.warning(
                    "ReadFromSparkStream '%s': its rows are decoded from their encoding (the "
                    "values made from its columns differed from Beam's for its first rows).",
                    self.name,
                )
                making.maker = None
                return None
            making.probed = _row_type_windows_pane(expected[0])
        return making.maker.make(batch, micros, *making.probed)

    def _encode_rows(self, batch: pa.RecordBatch, micros: np.ndarray) -> list[bytes]:
        encode = self.coder.get_impl().encode_nested
        values = [
            _timestamps(column) if i in self._timestamp_columns else column.to_pylist()
            for i, column in enumerate(batch.columns)
        ]
        return [
            encode(GlobalWindows.windowed_value(self._row_class(*row), Timestamp(micros=m)))
            for row, m in zip(zip(*values, strict=True), micros.tolist(), strict=True)
        ]


def _row_type_windows_pane(value: Any) -> tuple[Any, Any, Any]:
    return type(value.value), value.windows, value.pane_info


def _same_values(made: list[Any], expected: list[Any]) -> bool:
    """Whether windowed rows are equal, field types included (``1 == 1.0``)."""
    return len(made) == len(expected) and all(
        type(m.value) is type(e.value)
        and m.value == e.value
        and [type(f) for f in m.value] == [type(f) for f in e.value]
        and m.timestamp == e.timestamp
        and m.windows == e.windows
        and m.pane_info == e.pane_info
        for m, e in zip(made, expected, strict=True)
    )


class _ColumnEncoding:
    """A read's column-wise encoder (None: one element at a time).

    ``checked``: whether its first rows were checked against Beam's own encoding.
    """

    def __init__(self, encoder: RowColumnsEncoder | None) -> None:
        self.encoder = encoder
        self.checked = False


class _ValueMaking:
    """A read's maker of windowed values (None: decode Beam's encoding).

    With the row type, windows and pane of Beam's decoding of its first rows (None until
    they are checked).
    """

    def __init__(self, maker: RowValues | None) -> None:
        self.maker = maker
        self.probed: tuple[Any, Any, Any] | None = None


class ColumnsInput:
    """A stage's bundle input: a read's record batches (``rows.COLUMNS`` cells).

    Iterated, it gives their elements encoded, a batch at a time (the bundle processor's
    data input reads them so); the batched steps ask for the windowed values instead
    (``execution.batched_steps.ValuesInput``), made without encoding and decoding.
    """

    def __init__(self, columns: StreamColumns, batches: list[pa.RecordBatch]) -> None:
        self.columns = columns
        self.batches = batches

    def __bool__(self) -> bool:
        return any(batch.num_rows for batch in self.batches)

    def __iter__(self) -> Iterator[bytes]:
        for batch in self.batches:
            if batch.num_rows:
                encoded = self.columns.encode(batch, self.columns.event_micros(batch))
                yield packed_bytes(encoded)

    def windowed_values(self) -> Iterator[Any] | None:
        """The windowed values, or None where the read's cannot be made from columns."""
        batches = [b for b in self.batches if b.num_rows]
        if not batches:
            return iter(())
        first = self.columns.windowed_values(batches[0], self.columns.event_micros(batches[0]))
        if first is None:
            return None

        def made(batch: pa.RecordBatch) -> list[Any]:
            values = self.columns.windowed_values(batch, self.columns.event_micros(batch))
            assert values is not None  # checked on the first batch
            return values

        # A batch's values are made when the steps reach it; each is handed on by the
        # chain, not by a Python generator per value.
        return itertools.chain(first, itertools.chain.from_iterable(map(made, batches[1:])))


def columns_cell(batch: pa.RecordBatch) -> bytes:
    """A record batch as a ``rows.COLUMNS`` cell: an Arrow IPC stream of it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def cell_batches(cell: bytes) -> list[pa.RecordBatch]:
    """The record batches of a ``rows.COLUMNS`` cell."""
    return list(pa.ipc.open_stream(cell))


@dataclasses.dataclass(frozen=True)
class RowsToElements:
    """What a read's tasks need to turn Spark rows into routed rows.

    When every reader is a stateless stage (a router's), a batch travels as its columns
    (``rows.COLUMNS``; the router makes the elements, see ``ColumnsInput``); else as
    encoded elements.
    """

    name: str
    producer: str
    topology: Topology
    spec: SparkStreamSpec
    # The root's data-channel coder (a windowed-value coder of Beam rows).
    coder: Any

    @functools.cached_property
    def columns(self) -> StreamColumns:
        return StreamColumns(self.name, self.spec, self.coder)

    @functools.cached_property
    def _as_columns(self) -> bool:
        return sends_columns(self.topology, self.producer)

    def convert(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The body of the read's ``mapInArrow`` (see the module doc)."""
        targets = self.topology.roots[self.producer]
        latest: int | None = None
        for batch in batches:
            if not batch.num_rows:
                continue
            micros = self.columns.event_micros(batch)
            if self._as_columns:
                cell = columns_cell(batch)
                yield routed.to_batch(routed.columns_row(t, self.producer, cell) for t in targets)
            else:
                elements = self.columns.encode(batch, micros)
                for target in targets:
                    yield routed.element_batch(self.topology, target, elements)
            newest = int(micros.max())
            latest = newest if latest is None else max(latest, newest)
        if latest is not None:
            watermark = max(MIN_MICROS, latest - self.spec.watermark_delay_micros)
            marker = Marker(self.producer, watermark, MIN_MICROS)
            yield routed.to_batch(
                row for t in targets for row in routed.marker_rows(self.topology, t, marker)
            )


def _timestamps(column: pa.Array) -> list[Timestamp | None]:
    return [
        None if m is None else Timestamp(micros=m) for m in timestamp_micros(column).to_pylist()
    ]


def read_frame(
    spark: SparkSession,
    root: SparkStreamRoot,
    topology: Topology,
    coder: Any,
    router: ArrowFunction | None = None,
) -> DataFrame:
    """The read's routed rows, as a streaming DataFrame.

    Through ``router`` (the query's first router, in the same ``mapInArrow``) if given.
    """
    spec = root.spec
    reader = spark.readStream.format(spec.format).options(**dict(spec.options))
    if spec.user_schema:
        reader = reader.schema(spec.schema)
    try:
        frame = reader.load(spec.path) if spec.path is not None else reader.load()
        frame = frame.select(*(f"`{name}`" for name in spec.schema.names))
    except Exception as error:  # pyspark's AnalysisException and friends
        raise SparkStreamError(
            f"ReadFromSparkStream '{root.name}' could not open Spark's streaming source "
            f"{spec.format!r} with options {dict(spec.options)} and columns "
            f"{spec.schema.simpleString()}: {type(error).__name__}: {error}. Check the format "
            "and options; a source outside Spark's core (Kafka: "
            "org.apache.spark:spark-sql-kafka-0-10_2.13) needs its connector on the cluster "
            "(spark.jars.packages)."
        ) from None
    body: ArrowFunction = RowsToElements(root.name, root.producer, topology, spec, coder).convert
    name = spark_function_name(root.name)
    if router is not None:
        body, name = then(body, router), f"{name}_then_{router.__name__}"
    return map_in_arrow(frame, named_function(body, name), routed.routed_type())


def sends_columns(topology: Topology, producer: str) -> bool:
    """Whether a read sends its rows as columns: when only stateless stages read them.

    (Fusion puts a read's readers in stages of their own, stateless: a stateful reader, a
    side-input stage or a GroupByKey, reads the rows from one of those.)
    """
    return not any(topology.nodes[t].stateful for t in topology.roots[producer])


def stream_columns(plan: Plan, topology: Topology) -> dict[str, StreamColumns]:
    """The reads that send their rows as columns to routers, by producer id."""
    context = bi.PipelineContext(plan.components)
    return {
        root.producer: StreamColumns(root.name, root.spec, context.coders[root.coder_id])
        for root in spark_stream_roots(plan)
        if root.producer in topology.roots and sends_columns(topology, root.producer)
    }


def union_spark_streams(
    frame: DataFrame,
    spark: SparkSession,
    plan: Plan,
    topology: Topology,
    router: ArrowFunction | None = None,
) -> DataFrame:
    """``frame`` (the runner's source) with every Spark stream the topology reads.

    Each read through ``router`` (the query's first router) if given.
    """
    context = bi.PipelineContext(plan.components)
    for root in spark_stream_roots(plan):
        if root.producer in topology.roots:
            coder = context.coders[root.coder_id]
            frame = frame.unionByName(read_frame(spark, root, topology, coder, router))
    return frame
