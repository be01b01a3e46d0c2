"""Spark version facts and small PySpark helpers, kept in one place."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from beam_spark_runner.errors import UnsupportedFeatureError


def pyspark_version() -> tuple[int, int]:
    """The installed PySpark's (major, minor) version."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


# transformWithState, on rows or (4.0) on pandas: the PySpark whose queries chain one
# stateful operator per level.
STREAMING_SPARK = (4, 0)

# The oldest PySpark that streams: 3.5's applyInPandasWithState is allowed once per query
# (a second is refused at analysis), so there all levels share it (``group_state``).
OLDEST_STREAMING_SPARK = (3, 5)


def has_state_processor() -> bool:
    """Whether this PySpark has ``StatefulProcessor`` (4.0+), beyond 3.5's operator."""
    return pyspark_version() >= STREAMING_SPARK


# PySpark's setting for its workers' sockets to the executor's JVM: Unix domain sockets
# instead of TCP over loopback (SPARK-51688, Spark 4.1).
UNIX_DOMAIN_SOCKETS = "spark.python.unix.domain.socket.enabled"


def has_unix_domain_sockets() -> bool:
    """Whether PySpark can talk to its workers over Unix domain sockets here (Spark 4.1+)."""
    import socket

    return pyspark_version() >= (4, 1) and hasattr(socket, "AF_UNIX")


# The first PySpark whose transformWithState takes rows; 4.0 has the pandas form only
# (``stateful_rows`` runs a level on either).
ROW_STATE_SPARK = (4, 1)


def has_row_state() -> bool:
    """Whether this PySpark's ``transformWithState`` takes rows (4.1+), not pandas (4.0)."""
    return pyspark_version() >= ROW_STATE_SPARK


# PySpark's DataFrame call-site capture (Spark 4.0+): while it is on, every Column
# function PySpark wraps (``df[name]``, ``F.lit``, ``filter``, ...) first makes some ten
# Py4J calls to record where in the Python code it was called from.
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"


def has_dataframe_debugging() -> bool:
    """Whether this PySpark captures DataFrame call sites (Spark 4.0+)."""
    return pyspark_version() >= (4, 0)


def require_spark(feature: str, minimum: tuple[int, int]) -> None:
    """Raises ``UnsupportedFeatureError`` naming the Spark ``feature`` needs, if older.

    Call it where the runner chooses the feature (while planning or translating, before a
    Spark job runs), so that an older Spark fails with the version to install rather than
    an ``AttributeError`` from inside PySpark.
    """
    if pyspark_version() >= minimum:
        return
    import pyspark

    needed = ".".join(str(part) for part in minimum)
    raise UnsupportedFeatureError(
        f"{feature} needs Spark {needed} or newer, but this is PySpark {pyspark.__version__}. "
        f"Install pyspark>={needed} (and run on a Spark {needed}+ cluster), or do without "
        f"{feature}."
    )


def require_state_protocol(feature: str) -> None:
    """Raises ``UnsupportedFeatureError`` if PySpark's state protocol cannot load.

    PySpark's ``transformWithState`` talks to the JVM through generated protobuf code that
    checks the protobuf runtime at import (PySpark 4.3's needs protobuf >= 6.33.5). With an
    older runtime (apache-beam <= 2.68 caps protobuf < 6) every stateful stage's Python
    worker would crash at its first micro-batch; this says so before Spark starts.
    """
    try:
        from pyspark.sql.streaming.proto import StateMessage_pb2  # noqa: F401
    except ImportError:
        return  # a PySpark without the module: require_spark refuses it first
    except Exception as error:  # protobuf's VersionError is not an ImportError
        import google.protobuf

        raise UnsupportedFeatureError(
            f"{feature} needs the protobuf runtime PySpark's state protocol was generated "
            f"for, but this is protobuf {google.protobuf.__version__}: {error} "
            "Upgrade protobuf (pip install -U protobuf; apache-beam 2.69 or newer allows "
            "protobuf 6), or run the pipeline in batch."
        ) from error


# Spark 4's MLlib jar names a session extension provider (Spark Connect's ML functions)
# whose loading builds Scala's runtime reflection, slow, and classic PySpark never uses it.
# This static setting (a test flag, true by default) decides for every provider at once:
# set it only where MLlib's is the only one.
SESSION_EXTENSIONS_FROM_CLASS_PATH = "spark.sql.extensions.test.loadFromCp"
MLLIB_FUNCTIONS_PROVIDER = "org.apache.spark.sql.ml.InternalFunctionRegistration"
_EXTENSION_PROVIDERS = "META-INF/services/org.apache.spark.sql.SparkSessionExtensionsProvider"


def session_extension_providers(jvm: Any, loader: Any = None) -> list[str]:
    """The session extension providers a new session in ``jvm`` would load, in order.

    What the ``META-INF/services`` provider files on the class path name. ``loader`` is the
    class loader to search, by default the one Spark searches: this thread's context class
    loader in the JVM, else Spark's own.
    """
    if loader is None:
        loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    resources = loader.getResources(_EXTENSION_PROVIDERS)
    names: list[str] = []
    while resources.hasMoreElements():
        stream = resources.nextElement().openStream()
        try:
            names.extend(provider_names(bytes(stream.readAllBytes()).decode("utf-8")))
        finally:
            stream.close()
    return names


def provider_names(text: str) -> list[str]:
    """The class names a ``META-INF/services`` file lists (``#`` starts a comment)."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


@dataclasses.dataclass(frozen=True)
class InlineValue:
    """A value shipped inside the tasks' closures, read like a Spark broadcast (``.value``).

    PySpark's ``transformWithState`` workers do not load the job's broadcast variables
    (``BROADCAST_VARIABLE_NOT_LOADED``), so what a streaming query's stateful stages need
    (the main session, a bounded side input's state entries) travels with them.
    """

    value: Any


def named_function(function: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    """A one-argument wrapper called ``name``: Spark shows it in plans and the UI."""

    def call(argument: Any) -> Any:
        return function(argument)

    call.__name__ = call.__qualname__ = name
    return call
