"""The streaming query's stateful operator on this PySpark, for a processor written for rows.

PySpark 4.1+ runs it on ``transformWithState``, 4.0 on ``transformWithStateInPandas``
(both ``stateful_rows``), 3.5 on ``applyInPandasWithState`` (``group_state``), which a
query may hold only once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from beam_spark_runner.spark.compat import has_state_processor
from beam_spark_runner.spark.group_state import apply_in_pandas_with_state
from beam_spark_runner.spark.stateful_rows import transform_with_state

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


def stateful_operator(
    frame: DataFrame, keys: list[str], processor: Any, output_type: StructType
) -> DataFrame:
    """``frame`` grouped by the columns ``keys`` through ``processor`` (rows in, rows out).

    Append output mode, no timers, no Spark watermark.
    """
    if has_state_processor():
        return transform_with_state(frame, keys, processor, output_type)
    return apply_in_pandas_with_state(frame, keys, processor, output_type)
