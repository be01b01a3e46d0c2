"""Python warnings raised in Spark's workers, re-issued on the driver.

User code and Beam run in executors, so a warning they raise (Beam's
``InefficientExecutionWarning``, a user's ``DeprecationWarning``) would only reach an
executor's log. Tasks record warnings (deduplicated, capped), send them back through a
Spark accumulator, and the runner re-issues them on the driver, where the user's warning
filters decide what is shown.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator
from typing import Any

from pyspark.accumulators import AccumulatorParam

WarningRecord = tuple[str, str, str]  # (category module, category qualname, message)
MAX_DISTINCT_WARNINGS = 100


class WarningsParam(AccumulatorParam):
    """Accumulates distinct warning records."""

    def zero(self, value: list[WarningRecord]) -> list[WarningRecord]:
        """No warnings."""
        return []

    def addInPlace(  # noqa: N802 - PySpark's API
        self, value1: list[WarningRecord], value2: list[WarningRecord]
    ) -> list[WarningRecord]:
        """The distinct records of both, up to the cap."""
        merged = list(dict.fromkeys([*value1, *value2]))
        return merged[:MAX_DISTINCT_WARNINGS]


def new_accumulator(spark_context: Any) -> Any:
    """A fresh accumulator for one pipeline run."""
    return spark_context.accumulator([], WarningsParam())


@contextlib.contextmanager
def recording(sink: Any) -> Iterator[None]:
    """Records warnings raised inside the block and adds them to ``sink`` at the end."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            records = list(
                dict.fromkeys(
                    (w.category.__module__, w.category.__qualname__, str(w.message)) for w in caught
                )
            )[:MAX_DISTINCT_WARNINGS]
            if records and sink is not None:
                sink.add(records)


def _category(module: str, qualname: str) -> type[Warning]:
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return UserWarning
    return found if isinstance(found, type) and issubclass(found, Warning) else UserWarning


def reissue(records: list[WarningRecord]) -> None:
    """Issues each recorded warning again, on the driver."""
    for module, qualname, message in records:
        warnings.warn(message, _category(module, qualname), stacklevel=3)
