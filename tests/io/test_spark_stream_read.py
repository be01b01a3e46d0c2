"""``ReadFromSparkStream`` without Spark: schemas, the transform's proto, rows to elements."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import itertools
from typing import Any, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from pyspark.sql import types

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.execution.stage_worker import NO_SINKS
from beam_spark_runner.io import ReadFromSparkStream
from beam_spark_runner.io.spark_stream import (
    SparkStreamRunnerError,
    SparkStreamSchemaError,
    SparkStreamSpec,
    beam_row_type,
    parse_schema,
)
from beam_spark_runner.planning import SPARK_STREAM_URN, Plan, build_plan
from beam_spark_runner.planning.capabilities import check_pipeline
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.streaming.watermarks import MIN_MICROS

T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds


def test_a_ddl_schema_parses_to_spark_types() -> None:
    schema = parse_schema(
        "user STRING, `ts` TIMESTAMP NOT NULL, amount DECIMAL(10, 2), n: bigint, day DATE"
    )
    assert schema == types.StructType(
        [
            types.StructField("user", types.StringType()),
            types.StructField("ts", types.TimestampType(), nullable=False),
            types.StructField("amount", types.DecimalType(10, 2)),
            types.StructField("n", types.LongType()),
            types.StructField("day", types.DateType()),
        ]
    )


def test_a_schema_it_cannot_read_says_what_to_pass_instead() -> None:
    with pytest.raises(SparkStreamSchemaError, match=r"'tags ARRAY<STRING>'.*StructType"):
        parse_schema("user STRING, tags ARRAY<STRING>")
    nested = types.StructType([types.StructField("tags", types.ArrayType(types.StringType()))])
    with pytest.raises(SparkStreamSchemaError, match=r"column 'tags' is array<string>"):
        beam_row_type(nested)


def test_columns_map_onto_beam_schema_types() -> None:
    schema = parse_schema(
        "s STRING NOT NULL, l BIGINT, i INT, h SMALLINT, b TINYINT, d DOUBLE, f FLOAT, "
        "ok BOOLEAN, raw BINARY, ts TIMESTAMP, day DATE, money DECIMAL(5,1)"
    )
    fields = dict(beam_row_type(schema)._fields)
    assert fields["s"] is str
    assert fields["l"] == Optional[int]  # noqa: UP045 - what Beam's type hints hold
    assert fields["i"] == Optional[np.int32]  # noqa: UP045
    assert fields["h"] == Optional[np.int16]  # noqa: UP045
    assert fields["b"] == Optional[np.int8]  # noqa: UP045
    assert fields["d"] == Optional[float]  # noqa: UP045
    assert fields["f"] == Optional[np.float32]  # noqa: UP045
    assert fields["ok"] == Optional[bool]  # noqa: UP045
    assert fields["raw"] == Optional[bytes]  # noqa: UP045
    assert fields["ts"] == Optional[Timestamp]  # noqa: UP045
    assert fields["day"] == Optional[datetime.date]  # noqa: UP045
    assert fields["money"] == Optional[decimal.Decimal]  # noqa: UP045


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"format": "rate", "schema": "x INT"}, r"'rate' source has fixed columns"),
        ({"format": "json"}, r"Expected a schema for Spark's 'json' source"),
        ({"format": "rate", "timestamp_column": "ts"}, r"'ts'.*found no such column"),
        (
            {"format": "rate", "timestamp_column": "value"},
            r"'value' to be a TIMESTAMP column.*found bigint",
        ),
        ({"format": "rate", "watermark_delay": -1}, r"watermark_delay >= 0"),
    ],
)
def test_the_transform_refuses_what_it_cannot_read(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(SparkStreamSchemaError, match=message):
        ReadFromSparkStream(**arguments)


def _streaming_options() -> PipelineOptions:
    """A streaming pipeline of SparkStructuredRunner's (the read is its primitive there)."""
    return PipelineOptions(["--runner=SparkStructuredRunner", "--streaming"])


def _pipeline() -> tuple[beam.Pipeline, beam.PCollection]:
    pipeline = beam.Pipeline(options=_streaming_options())
    rows = pipeline | "Orders" >> ReadFromSparkStream(
        "json",
        "user STRING, ts TIMESTAMP, amount DOUBLE",
        options={"maxFilesPerTrigger": 2},
        timestamp_column="ts",
        watermark_delay=2.5,
        path="/data/orders",
    )
    _ = rows | "Amount" >> beam.Map(lambda row: (row.user, row.amount))
    return pipeline, rows


def _plan(pipeline: beam.Pipeline) -> Plan:
    proto = bi.prepare_pipeline_proto(
        pipeline.to_runner_api(default_environment=bi.default_environment())
    )
    return build_plan(proto, streaming=True)


def test_the_read_is_an_unbounded_runner_primitive_with_its_spec_as_payload() -> None:
    pipeline, rows = _pipeline()
    proto = pipeline.to_runner_api()
    (read,) = [t for t in proto.components.transforms.values() if t.unique_name == "Orders"]
    assert read.spec.urn == SPARK_STREAM_URN and not read.subtransforms
    spec = SparkStreamSpec.decode(read.spec.payload)
    assert spec == SparkStreamSpec(
        format="json",
        options=(("maxFilesPerTrigger", "2"),),
        schema_json=parse_schema("user STRING, ts TIMESTAMP, amount DOUBLE").json(),
        user_schema=True,
        timestamp_column="ts",
        watermark_delay_micros=2_500_000,
        path="/data/orders",
    )
    (output,) = read.outputs.values()
    unbounded = bi.beam_runner_api_pb2.IsBounded.UNBOUNDED
    assert proto.components.pcollections[output].is_bounded == unbounded
    # Beam round-trips pipelines through their protos: the transform comes back whole.
    again = beam.Pipeline.from_runner_api(proto, pipeline.runner, pipeline._options)
    assert (
        again.to_runner_api()
        .components.transforms[
            next(k for k, t in proto.components.transforms.items() if t.unique_name == "Orders")
        ]
        .spec.payload
        == read.spec.payload
    )


def test_a_batch_run_refuses_the_read_naming_it() -> None:
    pipeline, _ = _pipeline()
    with pytest.raises(UnsupportedFeatureError, match=r"'Orders' is a ReadFromSparkStream"):
        check_pipeline(pipeline.to_runner_api())


@pytest.mark.parametrize("streaming", [False, True])
def test_another_runner_fails_saying_it_needs_spark_structured_runner(streaming: bool) -> None:
    """On DirectRunner the read fails when the pipeline runs, rather than reading nothing."""
    options = PipelineOptions(["--runner=DirectRunner", *(["--streaming"] * streaming)])
    pipeline = beam.Pipeline(options=options)
    rows = pipeline | "Ticks" >> ReadFromSparkStream("rate")
    assert not rows.is_bounded  # the pipeline still reads as a streaming one
    _ = rows | beam.Map(print)
    with pytest.raises(
        SparkStreamRunnerError,
        match=r"ReadFromSparkStream 'Ticks' .* only SparkStructuredRunner can run; the pipeline "
        r"was built for SwitchingDirectRunner.* --runner=SparkStructuredRunner",
    ):
        pipeline.run().wait_until_finish()


def test_on_another_runner_the_read_is_no_runner_primitive() -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    _ = pipeline | "Ticks" >> ReadFromSparkStream("rate")
    urns = {t.spec.urn for t in pipeline.to_runner_api().components.transforms.values()}
    assert SPARK_STREAM_URN not in urns


needs_streaming = pytest.mark.skipif(
    pyspark_version() < OLDEST_STREAMING_SPARK,
    reason="the streaming modules need PySpark 3.5+ (transformWithState)",
)


def _orders(seconds: list[int | None], users: list[str | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(users, pa.string()),
            pa.array(
                [None if s is None else T0 + s * 1_000_000 for s in seconds],
                pa.timestamp("us", tz="UTC"),
            ),
            pa.array([float(i) for i in range(len(users))], pa.float64()),
        ],
        names=["user", "ts", "amount"],
    )


def _with_stateful_readers(convert: Any) -> Any:
    """``convert`` with its readers made stateful nodes (fusion makes the read's readers
    stateless stages; a stateful reader is kept working all the same)."""
    topology = convert.topology
    readers = topology.roots[convert.producer]
    nodes = tuple(
        dataclasses.replace(n, stateful=True) if n.index in readers else n for n in topology.nodes
    )
    return dataclasses.replace(convert, topology=dataclasses.replace(topology, nodes=nodes))


def _elements(
    convert: Any, out: list[dict[str, Any]], *, made: bool = False
) -> list[tuple[Any, ...]]:
    """The elements of routed rows (as columns or encoded), as (row, timestamp, windows).

    A columns row's elements are Beam's decoding of its encoding, or with ``made`` the
    windowed values made from its columns.
    """
    from beam_spark_runner.streaming import rows as routed
    from beam_spark_runner.streaming.spark_sources import ColumnsInput, cell_batches

    impl = convert.coder.get_impl()
    values: list[Any] = []
    for row in out:
        if row[routed.ELEMENT] is None:
            continue
        if row[routed.PORT] != routed.COLUMNS:
            values.extend(impl.decode_all(row[routed.ELEMENT]))
            continue
        assert row[routed.PRODUCER] == convert.producer
        bundle = ColumnsInput(convert.columns, cell_batches(row[routed.ELEMENT]))
        if made:
            made_values = bundle.windowed_values()
            assert made_values is not None
            values.extend(made_values)
        else:
            values.extend(v for piece in bundle for v in impl.decode_all(piece))
    return [(v.value, v.timestamp, v.windows, v.pane_info) for v in values]


@needs_streaming
@pytest.mark.parametrize("stateful_reader", [False, True])
def test_rows_become_elements_at_their_event_time_and_a_watermark_behind_the_latest(
    stateful_reader: bool,
) -> None:
    """Rows travel as columns to a read's stateless readers, encoded to stateful ones; the
    elements are the same either way, and so are the values made from the columns."""
    from beam_spark_runner.streaming import rows as routed

    pipeline, _ = _pipeline()
    convert = _converter(pipeline)
    if stateful_reader:
        convert = _with_stateful_readers(convert)
    readers = convert.topology.roots[convert.producer]
    assert any(convert.topology.nodes[t].stateful for t in readers) == stateful_reader
    out = pa.Table.from_batches(
        list(
            convert.convert([_orders([5, 3], ["ann", None]), _orders([], []), _orders([4], ["bo"])])
        )
    ).to_pylist()
    elements = [r for r in out if r[routed.ELEMENT] is not None]
    markers = [r for r in out if r[routed.ELEMENT] is None]
    assert {r[routed.TARGET] for r in out} == set(readers)
    if stateful_reader:
        # The task's elements travel packed: one row per target (and shard) and run.
        assert {r[routed.PORT] for r in elements} == {0}
    else:
        # One columns row per batch read and reader (the empty batch sends none).
        assert [r[routed.PORT] for r in elements] == [routed.COLUMNS] * 2 * len(readers)
    at = [Timestamp(micros=T0 + s * 1_000_000) for s in (5, 3, 4)]
    expected = [
        (("ann", at[0], 0.0), at[0], (GlobalWindow(),)),
        ((None, at[1], 1.0), at[1], (GlobalWindow(),)),
        (("bo", at[2], 0.0), at[2], (GlobalWindow(),)),
    ] * len(readers)
    decoded = _elements(convert, out)
    assert sorted(((tuple(v), t, w) for v, t, w, _ in decoded), key=repr) == sorted(
        expected, key=repr
    )
    assert decoded[0][0].user == "ann"  # the rows have the source's column names
    if not stateful_reader:
        assert _elements(convert, out, made=True) == decoded
    # One marker after the task's rows: the latest event time less the 2.5 s delay.
    # (A stateful reader gets it in each of its two shards.)
    assert out[-len(markers) :] == markers and len(markers) == (2 if stateful_reader else 1)
    assert routed.marker_of(markers[0]).watermark == T0 + 5_000_000 - 2_500_000
    assert routed.marker_of(markers[0]).processing_time == MIN_MICROS
    # A task that read nothing says nothing: the watermark stays where it was.
    assert list(convert.convert([_orders([], [])])) == []


def _converter(pipeline: beam.Pipeline) -> Any:
    from beam_spark_runner.streaming.query import plan_topology
    from beam_spark_runner.streaming.spark_sources import RowsToElements, spark_stream_roots

    plan = _plan(pipeline)
    (root,) = spark_stream_roots(plan)
    coder = bi.PipelineContext(plan.components).coders[root.coder_id]
    return RowsToElements(root.name, root.producer, plan_topology(plan, 2), root.spec, coder)


def _encoded_array(columns: Any, batch: pa.RecordBatch) -> pa.Array:
    return columns.encode(batch, columns.event_micros(batch))


def _encoded(columns: Any, batch: pa.RecordBatch) -> list[bytes]:
    return columns.encode(batch, columns.event_micros(batch)).to_pylist()  # type: ignore[no-any-return]


@needs_streaming
def test_rows_encoded_column_wise_equal_rows_encoded_one_by_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A read's rows encode to the same bytes a column at a time (``coders.row_columns``)
    or element by element with Beam's coder (the way for columns it cannot encode, and
    after its first rows disagree with Beam's)."""
    from beam_spark_runner.coders.row_columns import RowColumnsEncoder

    batch = _orders(list(range(40)), [f"u{i % 7}" if i % 5 else None for i in range(40)])
    pipeline, _ = _pipeline()
    column_wise = _converter(pipeline).columns
    assert column_wise._columns.encoder is not None
    expected = _encoded(column_wise, batch)
    assert column_wise._columns.checked and column_wise._columns.encoder is not None

    monkeypatch.setattr(RowColumnsEncoder, "for_coder", classmethod(lambda cls, coder: None))
    one_by_one = _converter(pipeline).columns
    assert _encoded(one_by_one, batch) == expected

    monkeypatch.undo()
    monkeypatch.setattr(RowColumnsEncoder, "agrees", lambda self, *args: False)
    disagreeing = _converter(pipeline).columns
    with caplog.at_level("WARNING"):
        assert _encoded(disagreeing, batch) == expected
    assert disagreeing._columns.encoder is None
    assert "'Orders': its rows are encoded one by one" in caplog.text


@needs_streaming
def test_rows_made_from_columns_equal_beams_decoding_or_are_decoded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The windowed values made from a read's columns (``coders.row_values``) equal
    Beam's decoding of the rows' encoding, field types included, for every field type it
    takes, nulls and event times before the epoch (rounded towards zero to milliseconds)
    included; where its first rows disagree, the batch is decoded instead."""
    from beam_spark_runner.coders.row_values import RowValues
    from beam_spark_runner.streaming.spark_sources import ColumnsInput

    pipeline = beam.Pipeline(options=_streaming_options())
    _ = pipeline | "Kinds" >> ReadFromSparkStream(
        "json",
        "s STRING NOT NULL, l BIGINT, i INT, h SMALLINT, d DOUBLE, f FLOAT, ok BOOLEAN, "
        "raw BINARY, ts TIMESTAMP, at TIMESTAMP",
        path="/x",
        timestamp_column="ts",
    )
    rows = 40
    times = [T0 + i * 1_234_567 for i in range(rows - 3)] + [-1_500, -1_000_001, 999]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([f"s{i}" for i in range(rows)], pa.string()),
            pa.array([None if i % 6 == 1 else (1 << 62) - i for i in range(rows)], pa.int64()),
            pa.array([None if i % 6 == 2 else -(i << 20) for i in range(rows)], pa.int32()),
            pa.array([None if i % 6 == 3 else i - 20 for i in range(rows)], pa.int16()),
            pa.array([None if i % 6 == 4 else i / 3 for i in range(rows)], pa.float64()),
            pa.array([None if i % 6 == 5 else i / 7 for i in range(rows)], pa.float32()),
            pa.array([None if i % 6 == 0 else i % 2 == 0 for i in range(rows)], pa.bool_()),
            pa.array([None if i % 5 == 0 else bytes([i]) * i for i in range(rows)], pa.binary()),
            pa.array(times, pa.timestamp("us", tz="UTC")),
            pa.array([None if i % 4 == 0 else T0 - i for i in range(rows)], pa.timestamp("us")),
        ],
        names=["s", "l", "i", "h", "d", "f", "ok", "raw", "ts", "at"],
    )
    columns = _converter(pipeline).columns
    decoded = list(columns.coder.get_impl().decode_all(b"".join(_encoded(columns, batch))))
    assert [v.timestamp for v in decoded[-3:]] == [
        Timestamp(micros=-1_000),
        Timestamp(micros=-1_000_000),
        Timestamp(micros=0),
    ]
    made = ColumnsInput(columns, [batch.slice(0, 20), batch.slice(20)]).windowed_values()
    assert made is not None
    made = list(made)
    assert [(v.value, v.timestamp, v.windows, v.pane_info) for v in made] == [
        (v.value, v.timestamp, v.windows, v.pane_info) for v in decoded
    ]
    assert [[type(f) for f in v.value] for v in made] == [
        [type(f) for f in v.value] for v in decoded
    ]
    assert all(type(v.value) is type(decoded[0].value) for v in made)

    monkeypatch.setattr(RowValues, "make", lambda self, batch, micros, w, p: [])
    disagreeing = _converter(pipeline).columns
    with caplog.at_level("WARNING"):
        assert ColumnsInput(disagreeing, [batch]).windowed_values() is None
    assert "'Kinds': its rows are decoded from their encoding" in caplog.text
    # Iterated, the input still gives the encoded elements.
    assert b"".join(ColumnsInput(disagreeing, [batch])) == b"".join(_encoded(columns, batch))


@needs_streaming
def test_columns_the_column_wise_encoding_does_not_take_are_encoded_one_by_one() -> None:
    pipeline = beam.Pipeline(options=_streaming_options())
    _ = pipeline | "Ledger" >> ReadFromSparkStream(
        "json", "day DATE, amount DECIMAL(10, 2), ts TIMESTAMP", path="/x", timestamp_column="ts"
    )
    columns = _converter(pipeline).columns
    assert columns._columns.encoder is None and columns._values.maker is None
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([datetime.date(2026, 1, 2), None], pa.date32()),
            pa.array([decimal.Decimal("1.25"), None], pa.decimal128(10, 2)),
            pa.array([T0, T0 + 7], pa.timestamp("us", tz="UTC")),
        ],
        names=["day", "amount", "ts"],
    )
    from beam_spark_runner.streaming.spark_sources import ColumnsInput

    # Nor are they made from columns: the batched steps decode them.
    assert ColumnsInput(columns, [batch]).windowed_values() is None
    impl = columns.coder.get_impl()
    elements = [e for piece in ColumnsInput(columns, [batch]) for e in impl.decode_all(piece)]
    assert [tuple(e.value) for e in elements] == [
        (datetime.date(2026, 1, 2), decimal.Decimal("1.25"), Timestamp(micros=T0)),
        (None, None, Timestamp(micros=T0 + 7)),
    ]


@needs_streaming
def test_a_row_without_an_event_time_fails_naming_the_read_and_column() -> None:
    from beam_spark_runner.streaming.query import plan_topology
    from beam_spark_runner.streaming.spark_sources import (
        RowsToElements,
        SparkStreamError,
        spark_stream_roots,
    )

    pipeline, _ = _pipeline()
    plan = _plan(pipeline)
    (root,) = spark_stream_roots(plan)
    coder = bi.PipelineContext(plan.components).coders[root.coder_id]
    convert = RowsToElements(root.name, root.producer, plan_topology(plan, 2), root.spec, coder)
    with pytest.raises(SparkStreamError, match=r"'Orders'.*column 'ts'; found 1 row"):
        list(convert.convert([_orders([1, None], ["a", "b"])]))


@needs_streaming
def test_the_runner_source_says_minus_infinity_for_a_spark_stream_every_batch() -> None:
    from beam_spark_runner.streaming import rows as routed
    from beam_spark_runner.streaming.query import _source_plan, plan_topology
    from beam_spark_runner.streaming.spark_sources import spark_stream_roots

    pipeline, _ = _pipeline()
    plan = _plan(pipeline)
    (root,) = spark_stream_roots(plan)
    source = _source_plan(plan, plan_topology(plan, 2))
    assert source.open_roots == {root.producer}
    for batch in (0, 7):
        (marker,) = [
            routed.marker_of(dict(zip(routed.ROUTED_SCHEMA.names, r, strict=True)))
            for r in source.rows(batch, 42)
        ]
        assert (marker.producer, marker.watermark, marker.processing_time) == (
            root.producer,
            MIN_MICROS,
            42,
        )


_ROUTER_RUNS = itertools.count()


@needs_streaming
@pytest.mark.parametrize("batched", [True, False])
def test_a_router_gives_the_same_rows_from_columns_as_from_encoded_elements(
    batched: bool,
) -> None:
    """A stage reading a Spark stream runs the same over the read's columns (values made
    directly for batched steps, encoded for the bundle processor) as over its encoded
    elements: the router's rows out are the same bytes."""
    from beam_spark_runner.streaming import rows as routed
    from beam_spark_runner.streaming.query import plan_topology
    from beam_spark_runner.streaming.router import RouterSpec, run_router
    from beam_spark_runner.streaming.spark_sources import stream_columns
    from tests.stage_specs import stage_spec

    pipeline, rows = _pipeline()
    _ = (
        rows
        | "Key" >> beam.Map(lambda row: (row.user or "", (row.amount, row.ts.micros)))
        | beam.WindowInto(beam.window.FixedWindows(5))
        | beam.GroupByKey()
    )
    plan = _plan(pipeline)
    topology = plan_topology(plan, 2)
    convert = _converter(pipeline)
    (reader,) = topology.roots[convert.producer]
    stage = plan.stage(topology.nodes[reader].name)
    spec = dataclasses.replace(
        stage_spec(plan, stage, f"router-columns-{next(_ROUTER_RUNS)}"), batched_steps=batched
    )
    router = RouterSpec(0, topology, {reader: spec}, stream_columns(plan, topology))
    assert set(router.reads) == {convert.producer}
    batches = [
        _orders(list(range(30)), [f"u{i % 4}" if i % 3 else None for i in range(30)]),
        _orders([7, 8], ["ann", "bo"]),
    ]
    columns = list(convert.convert(batches))
    assert routed.COLUMNS in pa.Table.from_batches(columns).column(routed.PORT).to_pylist()
    # The same rows encoded, and the read's marker (its last batch).
    (markers,) = columns[-1:]
    assert markers.column(routed.ELEMENT).null_count == markers.num_rows
    encoded = [
        *(
            routed.element_batch(topology, reader, _encoded_array(convert.columns, b))
            for b in batches
        ),
        markers,
    ]

    def routed_rows(inputs: list[pa.RecordBatch]) -> list[dict[str, Any]]:
        out = pa.Table.from_batches(list(run_router(router, inputs, NO_SINKS))).to_pylist()
        return sorted(out, key=repr)

    from_columns = routed_rows(columns)
    assert from_columns == routed_rows(encoded)
    grouped = [r for r in from_columns if r[routed.ELEMENT] is not None]
    assert grouped and {r[routed.PORT] for r in grouped} == {routed.KEYED_RUN}
