"""``translators.map_in_arrow``: PySpark's ``mapInArrow`` with the session's parts reused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner.options import spark_settings
from beam_spark_runner.spark import compat as spark_compat
from beam_spark_runner.spark import map_in_arrow as module
from beam_spark_runner.spark.compat import named_function
from beam_spark_runner.spark.map_in_arrow import map_in_arrow, then
from beam_spark_runner.spark.session import obtain_session
from beam_spark_runner.translators.base import keyed_rows_type

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


def _spark() -> Any:
    spark, _ = obtain_session(spark_settings(PipelineOptions(SPARK_ARGS)))
    return spark


def _rows(spark: Any) -> Any:
    return spark.createDataFrame([(b"k%d" % i, b"v%d" % i) for i in range(5)], keyed_rows_type())


def _suffixed(suffix: bytes) -> Any:
    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            elements = [value + suffix for value in batch.column(1).to_pylist()]
            yield pa.RecordBatch.from_arrays(
                [batch.column(0), pa.array(elements, pa.binary())], names=["key", "element"]
            )

    return named_function(body, "beam_suffixed")


def _frame_class() -> type:
    """The class of this PySpark's DataFrames (4.x: ``pyspark.sql.classic``'s)."""
    return type(_rows(_spark()))


def _collected(frame: Any) -> list[tuple[bytes, bytes]]:
    return sorted((bytes(row.key), bytes(row.element)) for row in frame.collect())


@pytest.fixture
def no_pyspark_map_in_arrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if PySpark's own ``mapInArrow`` builds the stage."""

    def refused(*_: Any, **__: Any) -> Any:
        raise AssertionError("PySpark's mapInArrow built a stage the runner builds itself")

    monkeypatch.setattr(_frame_class(), "mapInArrow", refused)


@pytest.mark.spark
def test_pyspark_35_sessions_use_pysparks_mapinarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    spark = _spark()
    context = spark.sparkContext
    monkeypatch.setattr(spark_compat, "pyspark_version", lambda: (3, 5))
    monkeypatch.setattr(module, "_SESSIONS", type(module._SESSIONS)())
    assert module._session_udfs(context) is None
    assert _collected(map_in_arrow(_rows(spark), _suffixed(b"%"), keyed_rows_type()))[0] == (
        b"k0",
        b"v0%",
    )


@pytest.mark.spark
def test_the_stage_gives_what_pysparks_mapinarrow_gives() -> None:
    spark = _spark()
    rows = _rows(spark)
    ours = map_in_arrow(rows, _suffixed(b"!"), keyed_rows_type())
    theirs = rows.mapInArrow(_suffixed(b"!"), keyed_rows_type())
    assert ours.schema == theirs.schema
    assert _collected(ours) == _collected(theirs) == [(b"k%d" % i, b"v%d!" % i) for i in range(5)]
    # Spark's plan shows the stage under the function's name.
    assert "beam_suffixed" in ours._jdf.queryExecution().analyzed().toString()


@pytest.mark.spark
def test_then_runs_the_second_function_over_the_firsts_batches_in_one_stage() -> None:
    spark = _spark()
    both = named_function(then(_suffixed(b"1"), _suffixed(b"2")), "beam_both")
    frame = map_in_arrow(_rows(spark), both, keyed_rows_type())
    assert _collected(frame) == [(b"k%d" % i, b"v%d12" % i) for i in range(5)]
    assert frame._jdf.queryExecution().analyzed().toString().count("MapInArrow") == 1


OWN_UDFS = pytest.mark.skipif(
    spark_compat.pyspark_version() < (4, 0),
    reason="on PySpark 3.5 every stage is PySpark's own mapInArrow (another JVM signature)",
)


@pytest.mark.spark
@OWN_UDFS
def test_the_runner_builds_the_udf_itself(no_pyspark_map_in_arrow: None) -> None:
    spark = _spark()
    frame = map_in_arrow(_rows(spark), _suffixed(b"?"), keyed_rows_type())
    assert _collected(frame)[0] == (b"k0", b"v0?")
    # Chained: the second stage reads the first's output columns.
    twice = map_in_arrow(frame, _suffixed(b"?"), keyed_rows_type())
    assert _collected(twice)[0] == (b"k0", b"v0??")


@pytest.mark.spark
def test_workers_read_a_broadcast_pickled_into_the_function() -> None:
    spark = _spark()
    suffix = spark.sparkContext.broadcast(b"-broadcast")

    def body(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            elements = [value + suffix.value for value in batch.column(1).to_pylist()]
            yield pa.RecordBatch.from_arrays(
                [batch.column(0), pa.array(elements, pa.binary())], names=["key", "element"]
            )

    try:
        frame = map_in_arrow(_rows(spark), named_function(body, "beam_b"), keyed_rows_type())
        assert _collected(frame)[4] == (b"k4", b"v4-broadcast")
    finally:
        suffix.destroy()


@pytest.mark.spark
@OWN_UDFS
def test_a_command_over_the_broadcast_threshold_is_left_to_pyspark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spark = _spark()
    udfs = module._session_udfs(spark.sparkContext)
    assert udfs is not None
    monkeypatch.setattr(udfs, "_broadcast_threshold", 0)
    frame_class = _frame_class()
    built_by_pyspark = []
    original = frame_class.mapInArrow

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        built_by_pyspark.append(args[0].__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(frame_class, "mapInArrow", counted)
    frame = map_in_arrow(_rows(spark), _suffixed(b"+"), keyed_rows_type())
    assert built_by_pyspark == ["beam_suffixed"]
    assert _collected(frame)[1] == (b"k1", b"v1+")


@pytest.mark.spark
@OWN_UDFS
def test_other_jvm_classes_leave_the_session_to_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    from py4j.protocol import Py4JError

    spark = _spark()
    context = spark.sparkContext
    udfs = module._session_udfs(context)
    assert udfs is not None

    def no_such_constructor(*_: Any) -> Any:
        raise Py4JError("Constructor UserDefinedPythonFunction([...]) does not exist")

    monkeypatch.setattr(udfs, "_udf", no_such_constructor)
    try:
        frame = map_in_arrow(_rows(spark), _suffixed(b"#"), keyed_rows_type())
        assert _collected(frame)[2] == (b"k2", b"v2#")
        assert module._session_udfs(context) is None  # the rest of the session: PySpark's
    finally:
        module._SESSIONS.pop(context, None)
    assert module._session_udfs(context) is not None  # a new entry, for the other tests


@pytest.mark.spark
def test_an_error_in_the_plan_is_pysparks_own() -> None:
    from pyspark.errors import AnalysisException

    spark = _spark()
    rows = _rows(spark)
    wrong = keyed_rows_type()  # the function's output type is fine; its input is not
    with pytest.raises(AnalysisException):
        map_in_arrow(rows.select(rows.key.alias("a"), rows.key.alias("a")), _suffixed(b""), wrong)
