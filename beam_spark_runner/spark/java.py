"""Java for Spark: finding it, with messages that say what to install; Spark's install.

Kept apart from ``session`` (which imports Beam and PySpark) so that
``python -m beam_spark_runner --version`` can report Java instantly. The driver JVM's class
archive, which starts it fast, is ``class_archive``'s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from beam_spark_runner.errors import JavaNotFoundError


def java_executable() -> str | None:
    """The ``java`` Spark would launch: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        return str(candidate) if candidate.exists() else None
    return shutil.which("java")


def java_version(java: str) -> str | None:
    """The version ``java -version`` reports, e.g. ``17.0.15``, or None if unreadable."""
    try:
        completed = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "([^"]+)"', completed.stderr + completed.stdout)
    return match.group(1) if match else None


def java_major(version: str) -> int:
    """The major version of a version ``java -version`` reports (``1.8.0_392`` is 8)."""
    parts = version.split(".")
    return int(parts[1]) if parts[0] == "1" else int(re.sub(r"\D.*", "", parts[0]) or 0)


def check_java(required_major: int) -> str:
    """Returns the Java version, or raises JavaNotFoundError saying what to install."""
    java = java_executable()
    if java is None:
        where = (
            f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
            if os.environ.get("JAVA_HOME")
            else "JAVA_HOME is not set and no `java` is on PATH"
        )
        raise JavaNotFoundError(
            f"Spark needs a Java {required_major}+ runtime, but {where}. Install one (for "
            f"example `apt-get install openjdk-{required_major}-jre-headless`) or point "
            "JAVA_HOME at an existing JDK, then run the pipeline again."
        )
    version = java_version(java)
    if version is None:
        raise JavaNotFoundError(
            f"Spark needs a Java {required_major}+ runtime; `{java} -version` did not report "
            "a version. Check the Java installation or set JAVA_HOME to a working JDK."
        )
    if java_major(version) < required_major:
        raise JavaNotFoundError(
            f"Spark needs Java {required_major}+, found Java {version} at {java}. Install "
            f"Java {required_major} and set JAVA_HOME to it."
        )
    return version


def required_java_major() -> int:
    """Spark 4 needs Java 17; Spark 3.5 runs on Java 8 and later."""
    from beam_spark_runner.spark.compat import pyspark_version

    return 17 if pyspark_version() >= (4, 0) else 8


def spark_home() -> Path:
    """The Spark install PySpark launches its JVM from: ``SPARK_HOME``, else PySpark's own."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_conf_directory(spark: Path) -> Path:
    """The conf directory Spark's launcher reads: ``SPARK_CONF_DIR``, else the install's own."""
    return Path(os.environ.get("SPARK_CONF_DIR") or spark / "conf")
