"""Differences between the Spark lines we support (3.5 and 4.x), in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def pyspark_version() -> tuple[int, int]:
    """The installed PySpark's (major, minor) version."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


def group_apply_arrow(
    frame: DataFrame,
    key_column: str,
    arrow_function: Callable[[pa.Table], pa.Table],
    pandas_function: Callable[[Any], Any],
    schema: str,
    name: str,
) -> DataFrame:
    """``groupBy(key).applyInArrow`` where Spark has it (4.0+), else ``applyInPandas``."""
    grouped = frame.groupBy(key_column)
    if hasattr(grouped, "applyInArrow"):
        return grouped.applyInArrow(named_function(arrow_function, name), schema)
    return grouped.applyInPandas(named_function(pandas_function, name), schema)


def named_function(function: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    """A one-argument wrapper called ``name``: Spark shows it in plans and the UI."""

    def call(argument: Any) -> Any:
        return function(argument)

    call.__name__ = call.__qualname__ = name
    return call
