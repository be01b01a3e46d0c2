"""Impulse: the one-element DataFrame every root stage (Create, reads) starts from."""

from __future__ import annotations

from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_worker import ELEMENT, KEY
from beam_spark_runner.planning import IMPULSE_URN, PlannedBuffer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


class ImpulseTranslator:
    """One row, one partition: the encoded impulse element in the global window."""

    urn = IMPULSE_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """A single-partition DataFrame holding Beam's encoded impulse value."""
        from pyspark.sql import functions as F

        return context.spark.range(0, 1, 1, numPartitions=1).select(
            F.lit(None).cast("binary").alias(KEY),
            F.lit(bytearray(bi.ENCODED_IMPULSE_VALUE)).alias(ELEMENT),
        )
