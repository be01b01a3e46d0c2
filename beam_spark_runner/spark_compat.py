"""Spark version facts and small PySpark helpers, kept in one place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def pyspark_version() -> tuple[int, int]:
    """The installed PySpark's (major, minor) version."""
    import pyspark

    major, minor = pyspark.__version__.split(".")[:2]
    return int(major), int(minor)


def named_function(function: Callable[[Any], Any], name: str) -> Callable[[Any], Any]:
    """A one-argument wrapper called ``name``: Spark shows it in plans and the UI."""

    def call(argument: Any) -> Any:
        return function(argument)

    call.__name__ = call.__qualname__ = name
    return call
