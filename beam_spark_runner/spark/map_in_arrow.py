"""``DataFrame.mapInArrow`` without PySpark's per-call set-up.

PySpark builds each ``mapInArrow``'s Python UDF from scratch, with several Py4J calls
(session, settings, environment, JVM class lookups, result type). Here what does not change
within a session is made once per ``SparkContext`` and reused. The UDF is PySpark's own
(same pickled command, ``SimplePythonFunction``, ``UserDefinedPythonFunction`` and
``Dataset.mapInArrow``) on PySpark 4.0 and later (``UserDefinedPythonFunction`` takes five
arguments on 4.0, seven from 4.1). On PySpark 3.5, after a session's first Py4J "no such
method", or for a command large enough for PySpark to broadcast, PySpark's ``mapInArrow``
builds the stage.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from beam_spark_runner.spark import compat as spark_compat
from beam_spark_runner.spark.internals import map_arrow_eval_type

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import SparkContext
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

_LOGGER = logging.getLogger(__name__)

ArrowFunction = Callable[[Iterator["pa.RecordBatch"]], Iterator["pa.RecordBatch"]]

# PySpark 3.5's Dataset.mapInArrow takes the UDF's expression, and its Python side differs
# too: its sessions' stages are PySpark's own.
_FIRST_PYSPARK = (4, 0)
# The first PySpark whose UserDefinedPythonFunction takes seven arguments (the transpiled
# expressions and their input categories after the five of Spark 3.5 and 4.0).
_SEVEN_ARGUMENT_UDF = (4, 1)


class _SessionUdfs:
    """What every stage's UDF of one ``SparkContext`` shares, made once."""

    def __init__(self, context: SparkContext) -> None:
        jvm = context._jvm
        assert jvm is not None
        self._context = context
        # Each lookup of a class through ``jvm`` is a Py4J call of its own: once here.
        self._python_function = jvm.org.apache.spark.api.python.SimplePythonFunction
        self._udf = jvm.org.apache.spark.sql.execution.python.UserDefinedPythonFunction
        self._python_utils = jvm.org.apache.spark.api.python.PythonUtils
        self._array_list = jvm.java.util.ArrayList
        self._hash_map = jvm.java.util.HashMap
        self._broadcast_threshold = int(self._python_utils.getBroadcastThreshold(context._jsc))
        self._no_broadcasts = self._java_list([])
        self._no_columns = self._java_list([])
        self._environment: tuple[tuple[tuple[str, str], ...], Any] | None = None
        self._includes: tuple[tuple[str, ...], Any] | None = None
        self._types: dict[str, Any] = {}

    def _java_list(self, items: list[Any]) -> Any:
        java_list = self._array_list()
        for item in items:
            java_list.add(item)
        return java_list

    def _java_environment(self) -> Any:
        items = tuple(sorted(self._context.environment.items()))
        if self._environment is None or self._environment[0] != items:
            java_map = self._hash_map()
            for key, value in items:
                java_map.put(key, value)
            self._environment = (items, java_map)
        return self._environment[1]

    def _java_includes(self) -> Any:
        includes = tuple(self._context._python_includes or ())
        if self._includes is None or self._includes[0] != includes:
            self._includes = (includes, self._java_list(list(includes)))
        return self._includes[1]

    def _java_type(self, frame: DataFrame, schema: StructType) -> Any:
        json = schema.json()
        if json not in self._types:
            self._types[json] = frame.sparkSession._jsparkSession.parseDataType(json)
        return self._types[json]

    def map_in_arrow(
        self, frame: DataFrame, function: ArrowFunction, schema: StructType
    ) -> DataFrame | None:
        """The ``mapInArrow`` of ``frame``; None where PySpark's own must build it."""
        from pyspark.serializers import CloudPickleSerializer
        from pyspark.sql import DataFrame

        context = self._context
        registry = context._pickled_broadcast_vars
        registry.clear()
        command = CloudPickleSerializer().dumps((function, schema))
        # The broadcast variables pickled into the command: the workers load them.
        broadcasts = [variable._jbroadcast for variable in registry]
        registry.clear()
        if len(command) > self._broadcast_threshold:
            return None  # PySpark ships a large command as a broadcast of its own
        python_function = self._python_function(
            bytearray(command),
            self._java_environment(),
            self._java_includes(),
            context.pythonExec,
            context.pythonVer,
            self._java_list(broadcasts) if broadcasts else self._no_broadcasts,
            context._javaAccumulator,
        )
        arguments = [
            function.__name__,
            python_function,
            self._java_type(frame, schema),
            map_arrow_eval_type(),
            True,  # deterministic, as pandas_udf makes it
        ]
        if spark_compat.pyspark_version() >= _SEVEN_ARGUMENT_UDF:
            arguments += [self._no_columns, self._no_columns]
        udf = self._udf(*arguments)
        jdf = frame._jdf
        columns = self._python_utils.toSeq(
            self._java_list([jdf.col(name) for name in frame.columns])
        )
        mapped = jdf.mapInArrow(udf.apply(columns), False, None)
        return DataFrame(mapped, frame.sparkSession)


def then(first: ArrowFunction, second: ArrowFunction) -> ArrowFunction:
    """``second`` over ``first``'s batches, as one ``mapInArrow``'s function.

    One Python worker runs both: the batches between them never cross to the JVM and back.
    """
    return functools.partial(_then, first, second)


def _then(
    first: ArrowFunction, second: ArrowFunction, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    return second(first(batches))


_SESSIONS: weakref.WeakKeyDictionary[Any, _SessionUdfs | None] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _session_udfs(context: SparkContext) -> _SessionUdfs | None:
    """The session's shared parts; None where PySpark's own ``mapInArrow`` builds its stages."""
    from py4j.protocol import Py4JError

    with _LOCK:
        if context not in _SESSIONS:
            _SESSIONS[context] = None  # PySpark 3.5, or a JVM without one of the parts
            if spark_compat.pyspark_version() >= _FIRST_PYSPARK:
                try:
                    _SESSIONS[context] = _SessionUdfs(context)
                except Py4JError as error:
                    _LOGGER.debug("PySpark's mapInArrow builds this session's stages: %s", error)
        return _SESSIONS[context]


def map_in_arrow(frame: DataFrame, function: ArrowFunction, schema: StructType) -> DataFrame:
    """``frame.mapInArrow(function, schema)``, built with the session's shared parts.

    ``function`` is named as Spark should show it (``spark_compat.named_function``).
    """
    context = frame.sparkSession.sparkContext
    udfs = _session_udfs(context)
    mapped = None if udfs is None else _built(udfs, context, frame, function, schema)
    return mapped if mapped is not None else frame.mapInArrow(function, schema)


def _built(
    udfs: _SessionUdfs,
    context: SparkContext,
    frame: DataFrame,
    function: ArrowFunction,
    schema: StructType,
) -> DataFrame | None:
    """The stage built from the session's parts; None where PySpark's own call must."""
    from py4j.protocol import Py4JError, Py4JJavaError

    try:
        return udfs.map_in_arrow(frame, function, schema)
    except Py4JJavaError as error:  # PySpark's own call raises what a user would see
        _LOGGER.debug("Building a mapInArrow UDF directly failed", exc_info=error)
    except Py4JError as error:  # no such constructor or method: other JVM classes
        _LOGGER.debug(
            "Building mapInArrow UDFs directly does not work with this PySpark (%s); "
            "PySpark's mapInArrow builds this session's stages",
            error,
        )
        with _LOCK:
            _SESSIONS[context] = None
    except Exception as error:  # noqa: BLE001 - PySpark's own call raises it, or builds
        _LOGGER.debug("Building a mapInArrow UDF directly failed", exc_info=error)
    return None
