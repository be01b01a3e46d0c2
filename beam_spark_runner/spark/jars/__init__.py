"""The runner's own JVM classes, and the settings that load them into a local session.

``beam-spark-runner-jvm.jar`` is built by ``make jar`` from ``jvm/src`` (for Java 8 and
up, against the Hadoop PySpark ships) and committed, so that users need no JDK compiler.
It holds one Hadoop file system, ``LocalCheckpointFileSystem`` under the scheme
``LOCAL_SCHEME``: Hadoop's raw local file system with permissions set through Java, for a
streaming query's checkpoint on the local disk (``streaming.checkpoint_files``).

Only a session the runner starts on a local master loads it (``session.session_conf``):
a cluster's executors would need the jar on their class path too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

JAR = Path(__file__).resolve().parent / "beam-spark-runner-jvm.jar"
LOCAL_SCHEME = "beamlocal"
LOCAL_FILE_SYSTEM = "beam_spark_runner.jvm.LocalCheckpointFileSystem"
LOCAL_FILE_CONTEXT = "beam_spark_runner.jvm.LocalCheckpointFs"
LOCAL_FILE_SYSTEM_CONF = f"spark.hadoop.fs.{LOCAL_SCHEME}.impl"
LOCAL_FILE_CONTEXT_CONF = f"spark.hadoop.fs.AbstractFileSystem.{LOCAL_SCHEME}.impl"
DRIVER_CLASS_PATH = "spark.driver.extraClassPath"


def _spark_defaults(conf_directory: Path, key: str) -> str | None:
    """``key``'s value in the directory's ``spark-defaults.conf``, if it sets one."""
    try:
        lines = (conf_directory / "spark-defaults.conf").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        # A Java properties file: the key, then whitespace, "=" or ":" before the value.
        match = re.match(r"\s*([^\s=:#!]+)\s*[=:\s]\s*(.*)", line)
        if match is not None and match.group(1) == key:
            return match.group(2).strip()
    return None


def session_settings(conf: Mapping[str, str], conf_directory: Path) -> dict[str, str]:
    """What a local session the runner starts adds to its ``conf`` to load the jar.

    The jar goes on the driver JVM's class path after any entries the user gave
    (``--spark_conf``, or the ``spark-defaults.conf`` in Spark's ``conf_directory``, whose
    value the launcher would no longer read once the runner sets one). Nothing if the package was
    installed without its jar: checkpoints then use Hadoop's ``file:`` file system.
    """
    if not JAR.is_file():
        return {}
    given = conf.get(DRIVER_CLASS_PATH) or _spark_defaults(conf_directory, DRIVER_CLASS_PATH)
    entries = [entry for entry in (given or "").split(os.pathsep) if entry]
    return {
        DRIVER_CLASS_PATH: os.pathsep.join([*entries, str(JAR)]),
        LOCAL_FILE_SYSTEM_CONF: LOCAL_FILE_SYSTEM,
        LOCAL_FILE_CONTEXT_CONF: LOCAL_FILE_CONTEXT,
    }
