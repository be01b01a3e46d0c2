"""Spark version facts and small PySpark helpers, kept in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from beam_spark_runner.errors import UnsupportedFeatureError


def pyspark_version() -> tuple[int, int]:
    """The installed PySpark's (major, minor) version."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


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


def named_function(function: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    """A one-argument wrapper called ``name``: Spark shows it in plans and the UI."""

    def call(argument: Any) -> Any:
        return function(argument)

    call.__name__ = call.__qualname__ = name
    return call
