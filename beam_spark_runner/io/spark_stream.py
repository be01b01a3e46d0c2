"""``ReadFromSparkStream``: any Spark streaming source as an unbounded Beam PCollection.

Reads what Spark jobs already read (file directories, ``rate``, Kafka where the cluster
has its connector) without a Beam IO: each row a schema'd element (a ``NamedTuple`` of the
source's columns) in the global window, at the event time of its ``timestamp_column``. The
watermark is the latest event time read so far less ``watermark_delay`` seconds (Spark's
``withWatermark`` rule, per transform): elements behind it are late, and it stays put while
nothing is read. A runner primitive (``SPARK_STREAM_URN``), read with ``spark.readStream``
beside the query's own source (``streaming.spark_sources``). Other runners do not know it:
applied to a pipeline whose runner is another, it expands to a step that fails when it runs,
saying so (``RequiresSparkStructuredRunner``).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import json
import re
import typing
from collections.abc import Mapping
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.utils.timestamp import Timestamp

from beam_spark_runner.errors import SparkRunnerError
from beam_spark_runner.planning import SPARK_STREAM_URN

if typing.TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

# Sources whose columns Spark fixes: a schema must not be passed to them.
FIXED_SCHEMAS: dict[str, str] = {
    "rate": "timestamp TIMESTAMP, value BIGINT",
    "rate-micro-batch": "timestamp TIMESTAMP, value BIGINT",
    "kafka": (
        "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
        "timestamp TIMESTAMP, timestampType INT"
    ),
}

# Spark SQL type names (DDL) -> the PySpark type's class name.
_DDL_TYPES: dict[str, str] = {
    "string": "StringType",
    "varchar": "StringType",
    "char": "StringType",
    "bigint": "LongType",
    "long": "LongType",
    "int": "IntegerType",
    "integer": "IntegerType",
    "smallint": "ShortType",
    "short": "ShortType",
    "tinyint": "ByteType",
    "byte": "ByteType",
    "double": "DoubleType",
    "float": "FloatType",
    "real": "FloatType",
    "boolean": "BooleanType",
    "binary": "BinaryType",
    "timestamp": "TimestampType",
    "timestamp_ltz": "TimestampType",
    "timestamp_ntz": "TimestampNTZType",
    "date": "DateType",
    "decimal": "DecimalType",
    "dec": "DecimalType",
    "numeric": "DecimalType",
}

# PySpark type class name -> the Beam schema field's Python type.
_BEAM_TYPES: dict[str, Any] = {
    "StringType": str,
    "CharType": str,
    "VarcharType": str,
    "LongType": int,
    "IntegerType": np.int32,
    "ShortType": np.int16,
    "ByteType": np.int8,
    "DoubleType": float,
    "FloatType": np.float32,
    "BooleanType": bool,
    "BinaryType": bytes,
    "TimestampType": Timestamp,
    "TimestampNTZType": Timestamp,
    "DateType": datetime.date,
    "DecimalType": decimal.Decimal,
}
TIMESTAMP_TYPES = frozenset(["TimestampType", "TimestampNTZType"])

_FIELD = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s+(.+?)\s*$")
_TYPE = re.compile(r"^([A-Za-z_]+)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*(not\s+null)?$", re.I)


class SparkStreamSchemaError(SparkRunnerError, ValueError):
    """A ``ReadFromSparkStream`` schema or timestamp column the runner cannot map to Beam."""


class SparkStreamRunnerError(SparkRunnerError, RuntimeError):
    """A ``ReadFromSparkStream`` run by a runner other than SparkStructuredRunner."""


# The runner attribute that says it reads ``SPARK_STREAM_URN`` itself (SparkStructuredRunner's).
RUNS_SPARK_STREAMS = "runs_spark_streams"


def runs_spark_streams(runner: Any) -> bool:
    """Whether ``runner`` (a pipeline's) reads ``ReadFromSparkStream`` as its primitive."""
    return getattr(runner, RUNS_SPARK_STREAMS, False) is True


class RequiresSparkStructuredRunner(beam.DoFn):  # type: ignore[misc]
    """What a ``ReadFromSparkStream`` runs as on another runner: a failure saying so.

    Without it another runner would run the unknown primitive as nothing, and end DONE
    with no output.
    """

    def __init__(self, label: str, runner: str) -> None:
        self.label = label
        self.runner = runner

    def process(self, unused_impulse: bytes) -> None:
        """Raises ``SparkStreamRunnerError``: another runner cannot read a Spark stream."""
        raise SparkStreamRunnerError(
            f"ReadFromSparkStream '{self.label}' reads a Spark streaming source, which only "
            f"SparkStructuredRunner can run; the pipeline was built for {self.runner}, which "
            "would read nothing from it. Run the pipeline with "
            "--runner=SparkStructuredRunner (or beam.Pipeline(runner=SparkStructuredRunner()))."
        )


def parse_schema(schema: str | StructType) -> StructType:
    """A Spark schema from a ``StructType`` or a DDL string of atomic columns.

    Spark parses DDL in the JVM; this runs when the pipeline is built, before any Spark
    session, so it reads the flat form (``"name STRING, ts TIMESTAMP, amount DECIMAL(10,2)"``)
    itself. Pass a ``StructType`` for anything it does not read.
    """
    from pyspark.sql import types

    if isinstance(schema, types.StructType):
        return schema
    if not isinstance(schema, str):
        raise SparkStreamSchemaError(
            f"Expected the schema as a DDL string or a pyspark StructType; found "
            f"{type(schema).__name__} {schema!r}."
        )
    fields = []
    for part in _split_top_level(schema):
        field = _FIELD.match(part)
        kind = _TYPE.match(field.group(2)) if field else None
        if field is None or kind is None or kind.group(1).lower() not in _DDL_TYPES:
            raise SparkStreamSchemaError(
                f"Expected a schema column as 'name TYPE' with TYPE one of "
                f"{', '.join(sorted(_DDL_TYPES))} (optionally NOT NULL); found {part.strip()!r} "
                f"in {schema!r}. Pass a pyspark.sql.types.StructType for other column types."
            )
        name, type_name = field.group(1), _DDL_TYPES[kind.group(1).lower()]
        data_type: DataType
        if type_name == "DecimalType":
            precision = int(kind.group(2) or 10)
            data_type = types.DecimalType(precision, int(kind.group(3) or 0))
        else:
            data_type = getattr(types, type_name)()
        fields.append(types.StructField(name, data_type, nullable=kind.group(4) is None))
    return types.StructType(fields)


def _split_top_level(ddl: str) -> list[str]:
    """``ddl`` split at the commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in ddl:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def beam_row_type(schema: StructType) -> RowTypeConstraint:
    """The Beam row type of a Spark schema (nullable columns are ``Optional``)."""
    fields: list[tuple[str, Any]] = []
    for field in schema.fields:
        python_type = _BEAM_TYPES.get(type(field.dataType).__name__)
        if python_type is None:
            raise SparkStreamSchemaError(
                f"Expected columns of atomic types ({', '.join(sorted(_BEAM_TYPES))}); column "
                f"{field.name!r} is {field.dataType.simpleString()}. Select it as one of those "
                "in the source's options, or read it as a string (to_json) or binary and "
                "decode it in a Map."
            )
        fields.append((field.name, typing.Optional[python_type] if field.nullable else python_type))  # noqa: UP045 - a typing hint for Beam
    return RowTypeConstraint.from_fields(fields)


@dataclasses.dataclass(frozen=True)
class SparkStreamSpec:
    """What the runner needs to open the stream: the transform's payload, decoded."""

    format: str
    options: tuple[tuple[str, str], ...]
    # StructType.json() of the columns the PCollection's rows have, in order.
    schema_json: str
    # Whether Spark is given the schema (file sources need one; rate and kafka refuse one).
    user_schema: bool
    timestamp_column: str
    watermark_delay_micros: int
    path: str | None

    @property
    def schema(self) -> StructType:
        """The columns, as a Spark type."""
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.schema_json))

    def encode(self) -> bytes:
        """The transform's payload."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @staticmethod
    def decode(payload: bytes) -> SparkStreamSpec:
        """The spec a payload holds."""
        fields = json.loads(payload)
        fields["options"] = tuple(tuple(o) for o in fields["options"])
        return SparkStreamSpec(**fields)


class ReadFromSparkStream(beam.PTransform):  # type: ignore[misc]
    """Reads a Spark streaming source into an unbounded PCollection of schema'd rows.

    ``format`` and ``options`` are what ``spark.readStream.format(...).options(...)`` takes
    (``path`` is ``load``'s argument, for file sources). ``schema`` (a DDL string such as
    ``"user STRING, ts TIMESTAMP"`` or a ``StructType``) is required for sources that need
    one (files) and must be left out for sources whose columns Spark fixes (``rate``,
    ``kafka``). Each row's event time is its ``timestamp_column`` (a TIMESTAMP column); the
    watermark is the latest event time read less ``watermark_delay`` seconds.

    Runs only on SparkStructuredRunner, in streaming.
    """

    def __init__(
        self,
        format: str,  # noqa: A002 - Spark's name for it
        schema: str | StructType | None = None,
        options: Mapping[str, Any] | None = None,
        timestamp_column: str = "timestamp",
        watermark_delay: float = 0.0,
        path: str | None = None,
    ) -> None:
        super().__init__()
        fixed = FIXED_SCHEMAS.get(format.lower())
        if fixed is not None and schema is not None:
            raise SparkStreamSchemaError(
                f"Spark's {format!r} source has fixed columns ({fixed}) and refuses a "
                "schema; leave schema out."
            )
        if fixed is None and schema is None:
            raise SparkStreamSchemaError(
                f"Expected a schema for Spark's {format!r} source (a streaming read of files "
                "needs one), e.g. schema='user STRING, ts TIMESTAMP'; found none."
            )
        columns = parse_schema(schema if schema is not None else fixed)  # type: ignore[arg-type]
        self.row_type = beam_row_type(columns)
        by_name = {f.name: f for f in columns.fields}
        time_field = by_name.get(timestamp_column)
        if time_field is None or type(time_field.dataType).__name__ not in TIMESTAMP_TYPES:
            found = time_field.dataType.simpleString() if time_field else "no such column"
            raise SparkStreamSchemaError(
                f"Expected timestamp_column {timestamp_column!r} to be a TIMESTAMP column of "
                f"{columns.simpleString()}; found {found}. Name the column that holds each "
                "row's event time (cast it to TIMESTAMP in the source if it is a number)."
            )
        if watermark_delay < 0:
            raise SparkStreamSchemaError(
                f"Expected watermark_delay >= 0 seconds; found {watermark_delay}."
            )
        self.spec = SparkStreamSpec(
            format=format,
            options=tuple(sorted((str(k), str(v)) for k, v in (options or {}).items())),
            schema_json=columns.json(),
            user_schema=fixed is None,
            timestamp_column=timestamp_column,
            watermark_delay_micros=round(watermark_delay * 1_000_000),
            path=path,
        )

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.PCollection:
        """An unbounded PCollection of the source's rows.

        SparkStructuredRunner's primitive; on a pipeline whose runner is another, a step that
        fails when it runs (``RequiresSparkStructuredRunner``), so that the pipeline does not
        end DONE having read nothing.
        """
        runner = pbegin.pipeline.runner
        self.primitive = runs_spark_streams(runner)
        if self.primitive:
            return pvalue.PCollection(pbegin.pipeline, element_type=self.row_type, is_bounded=False)
        refusal = RequiresSparkStructuredRunner(self.label, type(runner).__name__)
        rows = pbegin | beam.Impulse() | beam.ParDo(refusal).with_output_types(self.row_type)
        rows.is_bounded = False
        return rows

    def get_windowing(self, unused_inputs: Any) -> Windowing:
        """The global window (the source has no input to take it from)."""
        return Windowing(GlobalWindows())

    def infer_output_type(self, unused_input_type: Any) -> Any:
        """The rows' type (Beam picks the RowCoder from it)."""
        return self.row_type

    def to_runner_api_parameter(self, context: Any) -> Any:
        """The runner primitive's URN and payload (Beam's composite's on another runner)."""
        if not getattr(self, "primitive", True):
            return super().to_runner_api_parameter(context)
        return SPARK_STREAM_URN, self.spec.encode()

    @staticmethod
    @beam.PTransform.register_urn(SPARK_STREAM_URN, None)
    def from_runner_api_parameter(
        unused_transform: Any, payload: bytes, unused_context: Any
    ) -> ReadFromSparkStream:
        """The transform back from its payload (Beam round-trips pipelines through protos)."""
        spec = SparkStreamSpec.decode(payload)
        read = ReadFromSparkStream.__new__(ReadFromSparkStream)
        beam.PTransform.__init__(read)
        read.spec = spec
        read.row_type = beam_row_type(spec.schema)
        read.primitive = True
        return read
