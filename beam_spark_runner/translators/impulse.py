"""Impulse: the one-element DataFrame every root stage (Create, reads) starts from."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import ELEMENT, KEY
from beam_spark_runner.planning import IMPULSE_URN, PlannedBuffer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from beam_spark_runner.translators.base import TranslationContext


# The impulse DataFrame of each live session: the same in every run, and costly to build.
_IMPULSES: weakref.WeakKeyDictionary[SparkSession, DataFrame] = weakref.WeakKeyDictionary()


class ImpulseTranslator:
    """One row, one partition: the encoded impulse element in the global window."""

    urn = IMPULSE_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """A single-partition DataFrame holding Beam's encoded impulse value."""
        return impulse_frame(context.spark)


def impulse_frame(spark: SparkSession) -> DataFrame:
    """The session's impulse DataFrame, built on its first run."""
    from pyspark.sql import functions as F

    frame = _IMPULSES.get(spark)
    if frame is None:
        frame = spark.range(0, 1, 1, numPartitions=1).select(
            F.lit(None).cast("binary").alias(KEY),
            F.lit(bytearray(bi.ENCODED_IMPULSE_VALUE)).alias(ELEMENT),
        )
        _IMPULSES[spark] = frame
    return frame
