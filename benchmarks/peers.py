"""The Spark sessions of the hand-written peers: the settings SparkStructuredRunner's own has.

``runner_conf`` is every setting of the local session the runner creates for a master
(``beam_spark_runner.spark.session.local_session_conf``, with the runner's default
options): Python workers over Unix domain sockets (where the Spark has them), the runner's
Python worker daemon, the driver heap, the JVM options (C1 only, the quieter log profile),
adaptive execution off, a shuffle partition per core, Arrow on, the checkpoint file system.
The batch benchmark's hand-written PySpark and Spark SQL run with all of them;
``with_default_jit`` drops the one JVM option the streaming benchmark's hand-written
queries run without (``-XX:TieredStopAtLevel=1``: Spark's default JVM compiles with C2 too).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOGGER = logging.getLogger(__name__)


def runner_conf(master: str) -> dict[str, str]:
    """The settings of the session SparkStructuredRunner creates for ``master`` (local)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_spark_runner.options import spark_settings
    from beam_spark_runner.spark.session import local_session_conf

    settings = spark_settings(PipelineOptions([f"--spark_master={master}"]))
    return local_session_conf(master, settings)


def with_default_jit(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` without the runner's C1-only JVM option: the JVM compiles as Spark's does."""
    from beam_spark_runner.spark.session import JAVA_OPTIONS, LOCAL_DRIVER_JAVA_OPTIONS

    out = dict(conf)
    dropped = set(LOCAL_DRIVER_JAVA_OPTIONS.split())
    kept = [option for option in out.get(JAVA_OPTIONS, "").split() if option not in dropped]
    if kept:
        out[JAVA_OPTIONS] = " ".join(kept)
    else:
        out.pop(JAVA_OPTIONS, None)
    return out


def start_session(master: str, app_name: str, conf: Mapping[str, str]) -> SparkSession:
    """A new ``master`` session with ``conf``, as the runner starts its own: on the loopback
    interface, its Python workers on this interpreter, logging at WARN.

    Raises RuntimeError if this process already had a session whose settings differ (its
    JVM's would be used, not ``conf``).
    """
    from pyspark.sql import SparkSession

    from beam_spark_runner.spark.session import bind_to_loopback

    bind_to_loopback(dict(conf))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    started = dict(spark.sparkContext.getConf().getAll())
    differ = sorted(key for key, value in conf.items() if started.get(key) != value)
    if differ:
        raise RuntimeError(
            f"the {master} session for {app_name} does not have the settings asked for "
            f"({differ}): this process had started Spark before with others. Start each "
            "peer's session in a process of its own."
        )
    _LOGGER.info("Session %s on %s with %s", app_name, master, dict(conf))
    return spark
