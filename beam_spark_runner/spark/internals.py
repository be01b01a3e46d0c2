"""PySpark's private API, behind named functions: the one place the runner reaches into it.

Underscore attributes (``_jvm``, ``_jsc``, ``_jdf``, ...) and private modules
(``pyspark.serializers``, ...) change between PySpark releases: every use outside ``spark/``
goes through here (ruff's SLF001 and banned-api rules, pyproject.toml, keep it so). Imports
no Beam: the pre-init server imports it before anything heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import Broadcast, SparkContext
    from pyspark.sql import DataFrame, SparkSession

# The private modules a pre-init process of ``transformWithState`` runs.
PRE_INIT_MODULES = (
    "pyspark.sql.streaming.proto.StateMessage_pb2",
    "pyspark.sql.streaming.transform_with_state_driver_worker",
)


def context_jvm(context: SparkContext) -> Any:
    """The Py4J view of the context's driver JVM; None once the context stopped."""
    return context._jvm


def session_jvm(spark: SparkSession) -> Any:
    """The Py4J view of the session's driver JVM; None once its context stopped."""
    return spark.sparkContext._jvm


def java_context(context: SparkContext) -> Any:
    """The context's ``JavaSparkContext`` in the JVM."""
    return context._jsc


def hadoop_configuration(spark: SparkSession) -> Any:
    """The session's Hadoop ``Configuration`` in the JVM (file systems, ...)."""
    return spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]


def java_session(spark: SparkSession) -> Any:
    """The session's JVM ``SparkSession``."""
    return spark._jsparkSession


def java_dataframe(frame: DataFrame) -> Any:
    """The JVM ``Dataset`` behind ``frame``."""
    return frame._jdf


def python_includes(context: SparkContext) -> list[str]:
    """The files PySpark ships to its workers' ``sys.path`` (``addPyFile``, ``--py-files``)."""
    return list(context._python_includes or ())


def pickled_broadcast_variables(context: SparkContext) -> Any:
    """The set PySpark adds each broadcast variable pickled into a command to."""
    return context._pickled_broadcast_vars


def java_broadcast(variable: Broadcast[Any]) -> Any:
    """The JVM side of a Python broadcast variable."""
    return variable._jbroadcast


def java_accumulator(context: SparkContext) -> Any:
    """The JVM accumulator a Python function's accumulator updates are sent to."""
    return context._javaAccumulator


def pickle_command(value: Any) -> bytes:
    """``value`` pickled as PySpark pickles a Python function's command."""
    from pyspark.serializers import CloudPickleSerializer

    return CloudPickleSerializer().dumps(value)


def pickle_by_value(value: Any) -> bytes:
    """``value`` pickled with PySpark's cloudpickle (by value where plain pickle cannot)."""
    from pyspark import cloudpickle

    return cloudpickle.dumps(value)  # type: ignore[no-any-return]


def map_arrow_eval_type() -> int:
    """PySpark's eval type of a ``mapInArrow`` function."""
    try:
        from pyspark.util import PythonEvalType
    except ImportError:  # PySpark 3.5 keeps it in pyspark.rdd
        from pyspark.rdd import PythonEvalType  # type: ignore[attr-defined,no-redef]

    return PythonEvalType.SQL_MAP_ARROW_ITER_UDF  # type: ignore[no-any-return]


def import_pre_init_modules() -> None:
    """Imports what a ``transformWithState`` pre-init process runs."""
    import importlib

    for module in PRE_INIT_MODULES:
        importlib.import_module(module)
