"""How a streaming query's checkpoint files reach the disk: which file system, which manager.

A query writes dozens of small checkpoint files every micro-batch, and without Hadoop's
native library (a pip-installed PySpark) Hadoop's local file system starts processes for
them. For a checkpoint on the local disk, ``checkpoint_file_settings`` picks Spark's
``FileSystem``-based checkpoint manager (the default renames through ``FileContext``, which
runs ``readlink``), and a session the runner starts on a local master carries the runner's
own local file system (``jars``, scheme ``beamlocal``, permissions set through Java rather
than ``chmod``), which ``spark_location`` names. Spark records that scheme in the state's
schema metadata, so such a checkpoint resumes only in a session the runner starts; other
file systems keep Spark's defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from beam_spark_runner.spark import internals as spark_internals
from beam_spark_runner.spark.jars import LOCAL_FILE_SYSTEM, LOCAL_SCHEME

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CHECKPOINT_FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
# Spark's checkpoint file manager over Hadoop's FileSystem API, where Spark 4.1+ and 4.0
# keep it.
_FILE_SYSTEM_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)
_LOCAL_SCHEMES = ("file", LOCAL_SCHEME)


def _file_system(spark: SparkSession, location: str) -> tuple[Any, Any] | None:
    """Hadoop's file system for ``location`` and its ``Path``; None if none resolves here."""
    from py4j.protocol import Py4JError

    jvm = spark_internals.session_jvm(spark)
    assert jvm is not None
    hadoop_conf = spark_internals.hadoop_configuration(spark)
    try:
        path = jvm.org.apache.hadoop.fs.Path(location)
        return path.getFileSystem(hadoop_conf), path
    except Py4JError:
        return None


def _has_class(spark: SparkSession, name: str) -> bool:
    """Whether the driver JVM can load the class ``name``."""
    from py4j.protocol import Py4JError

    try:
        spark_internals.session_jvm(spark).java.lang.Class.forName(name)
    except Py4JError:
        return False
    return True


def spark_location(spark: SparkSession, checkpoint: str) -> str:
    """The checkpoint location to give Spark for the user's ``checkpoint``.

    A directory on the local disk under ``LOCAL_SCHEME`` (``beamlocal:/abs/path``) where the
    session has the runner's local file system (a session the runner started on a local
    master); otherwise ``checkpoint`` itself, as it is for other file systems and for a
    location Hadoop cannot resolve here (the query reports it).
    """
    hadoop_conf = spark_internals.hadoop_configuration(spark)
    if hadoop_conf.get(f"fs.{LOCAL_SCHEME}.impl") != LOCAL_FILE_SYSTEM:
        return checkpoint
    resolved = _file_system(spark, checkpoint)
    if resolved is None or resolved[0].getScheme() != "file":
        return checkpoint
    if not _has_class(spark, LOCAL_FILE_SYSTEM):  # the jar is not on this JVM's class path
        return checkpoint
    file_system, path = resolved
    local = file_system.makeQualified(path).toUri().getPath()
    jvm = spark_internals.session_jvm(spark)
    return str(jvm.org.apache.hadoop.fs.Path(LOCAL_SCHEME, None, local).toString())


def checkpoint_file_settings(spark: SparkSession, location: str) -> dict[str, str]:
    """The checkpoint file manager a query over ``location`` on the local disk starts with.

    Spark's default writes each checkpoint file (the offset and commit logs, every state
    store's snapshot files) through Hadoop's ``FileContext``, whose rename asks for each
    path's link status. Without Hadoop's native library Hadoop's local file system answers
    that by running ``readlink`` in a new process, several a file. The manager over
    Hadoop's ``FileSystem`` API renames with ``File.renameTo`` (atomic on a local disk),
    with no process. Not for other file systems (HDFS,
    object stores), whose renames Spark's default handles as they need, nor where the
    session names a manager. A location Hadoop cannot resolve here keeps the default too.
    """
    if spark.conf.get(CHECKPOINT_FILE_MANAGER_CONF, None) is not None:
        return {}
    resolved = _file_system(spark, location)
    if resolved is None or resolved[0].getScheme() not in _LOCAL_SCHEMES:
        return {}
    # The first of these classes this Spark has.
    for name in _FILE_SYSTEM_MANAGERS:
        if _has_class(spark, name):
            return {CHECKPOINT_FILE_MANAGER_CONF: name}
    return {}
