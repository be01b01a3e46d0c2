"""``ReadFromSparkStream`` without Spark: schemas, the transform's proto, rows to elements."""

from __future__ import annotations

import datetime
import decimal
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
from beam_spark_runner.capabilities import check_pipeline
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.io import ReadFromSparkStream
from beam_spark_runner.io.spark_stream import (
    SparkStreamSchemaError,
    SparkStreamSpec,
    beam_row_type,
    parse_schema,
)
from beam_spark_runner.planning import SPARK_STREAM_URN, Plan, build_plan
from beam_spark_runner.spark_compat import pyspark_version
from beam_spark_runner.streaming.check import STREAMING_SPARK
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


def _pipeline() -> tuple[beam.Pipeline, beam.PCollection]:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
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


needs_streaming = pytest.mark.skipif(
    pyspark_version() < STREAMING_SPARK,
    reason="the streaming modules need PySpark 4.1+ (transformWithState)",
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


@needs_streaming
def test_rows_become_elements_at_their_event_time_and_a_watermark_behind_the_latest() -> None:
    from beam_spark_runner.streaming import rows as routed
    from beam_spark_runner.streaming.query import plan_topology
    from beam_spark_runner.streaming.spark_sources import RowsToElements, spark_stream_roots

    pipeline, _ = _pipeline()
    plan = _plan(pipeline)
    (root,) = spark_stream_roots(plan)
    topology = plan_topology(plan, 2)
    (reader,) = topology.roots[root.producer]
    coder = bi.PipelineContext(plan.components).coders[root.coder_id]
    convert = RowsToElements(root.name, root.producer, topology, root.spec, coder).convert
    out = pa.Table.from_batches(
        list(convert([_orders([5, 3], ["ann", None]), _orders([], []), _orders([4], ["bo"])]))
    ).to_pylist()
    elements = [r for r in out if r[routed.ELEMENT] is not None]
    markers = [r for r in out if r[routed.ELEMENT] is None]
    assert {r[routed.TARGET] for r in out} == {reader}
    # The task's elements travel packed: one row per target and run.
    assert len(elements) == 2
    decoded = [v for r in elements for v in coder.get_impl().decode_all(r[routed.ELEMENT])]
    at = [Timestamp(micros=T0 + s * 1_000_000) for s in (5, 3, 4)]
    assert [(tuple(v.value), v.timestamp, v.windows) for v in decoded] == [
        (("ann", at[0], 0.0), at[0], (GlobalWindow(),)),
        ((None, at[1], 1.0), at[1], (GlobalWindow(),)),
        (("bo", at[2], 0.0), at[2], (GlobalWindow(),)),
    ]
    assert decoded[0].value.user == "ann"  # the rows have the source's column names
    # One marker after the task's rows: the latest event time less the 2.5 s delay.
    assert out[-1] is markers[-1] and len(markers) == 1
    assert routed.marker_of(markers[0]).watermark == T0 + 5_000_000 - 2_500_000
    assert routed.marker_of(markers[0]).processing_time == MIN_MICROS
    # A task that read nothing says nothing: the watermark stays where it was.
    assert list(convert([_orders([], [])])) == []


def _converter(pipeline: beam.Pipeline) -> Any:
    from beam_spark_runner.streaming.query import plan_topology
    from beam_spark_runner.streaming.spark_sources import RowsToElements, spark_stream_roots

    plan = _plan(pipeline)
    (root,) = spark_stream_roots(plan)
    coder = bi.PipelineContext(plan.components).coders[root.coder_id]
    return RowsToElements(root.name, root.producer, plan_topology(plan, 2), root.spec, coder)


@needs_streaming
def test_rows_encoded_column_wise_equal_rows_encoded_one_by_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The routed batches are the same whether the read's rows are encoded a column at a
    time (``coders.row_columns``) or element by element with Beam's coder (the way for
    columns it cannot encode, and after its first rows disagree with Beam's)."""
    from beam_spark_runner.coders.row_columns import RowColumnsEncoder

    batches = [_orders(list(range(40)), [f"u{i % 7}" if i % 5 else None for i in range(40)])]
    pipeline, _ = _pipeline()
    column_wise = _converter(pipeline)
    assert column_wise._columns.encoder is not None
    expected = [b.to_pylist() for b in column_wise.convert(batches)]
    assert column_wise._columns.checked and column_wise._columns.encoder is not None

    monkeypatch.setattr(RowColumnsEncoder, "for_coder", classmethod(lambda cls, coder: None))
    one_by_one = _converter(pipeline)
    assert [b.to_pylist() for b in one_by_one.convert(batches)] == expected

    monkeypatch.undo()
    monkeypatch.setattr(RowColumnsEncoder, "agrees", lambda self, *args: False)
    disagreeing = _converter(pipeline)
    with caplog.at_level("WARNING"):
        assert [b.to_pylist() for b in disagreeing.convert(batches)] == expected
    assert disagreeing._columns.encoder is None
    assert "'Orders': its rows are encoded one by one" in caplog.text


@needs_streaming
def test_columns_the_column_wise_encoding_does_not_take_are_encoded_one_by_one() -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    _ = pipeline | "Ledger" >> ReadFromSparkStream(
        "json", "day DATE, amount DECIMAL(10, 2), ts TIMESTAMP", path="/x", timestamp_column="ts"
    )
    convert = _converter(pipeline)
    assert convert._columns.encoder is None
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([datetime.date(2026, 1, 2), None], pa.date32()),
            pa.array([decimal.Decimal("1.25"), None], pa.decimal128(10, 2)),
            pa.array([T0, T0 + 7], pa.timestamp("us", tz="UTC")),
        ],
        names=["day", "amount", "ts"],
    )
    from beam_spark_runner.streaming import rows as routed

    rows = [r for b in convert.convert([batch]) for r in b.to_pylist()]
    impl = convert.coder.get_impl()
    elements = [e for r in rows if r[routed.ELEMENT] for e in impl.decode_all(r[routed.ELEMENT])]
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
