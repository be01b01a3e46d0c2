"""A plain ``ReadFromText`` read by the runner: byte ranges of the files, one row each.

Planning (``planning.native_text_reads``) matched the files; here they are split into
byte ranges spread over ``context.parallelism`` partitions, with no Python and no shuffle:
``spark.range`` numbers the ranges and each row picks its encoded range from a literal
array. Beyond ``LITERAL_RANGES_MAX`` ranges (many files) the literal would bloat the query
plan: the ranges become a local relation, repartitioned round robin. The stage that reads
the lines turns each partition's ranges into one bundle (``execution.text_read``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from beam_spark_runner.execution.stage_worker import ELEMENT, KEY
from beam_spark_runner.execution.text_read import split_ranges
from beam_spark_runner.planning import TEXT_READ_URN, PlannedBuffer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


LITERAL_RANGES_MAX = 1000


class TextReadTranslator:
    """(key, element) rows whose elements are ``TextRange``s of the read's files."""

    urn = TEXT_READ_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """One row per byte range, in at most ``context.parallelism`` partitions."""
        from pyspark.sql import functions as F

        files = json.loads(context.plan.components.transforms[node.name].spec.payload)
        ranges = split_ranges(files, context.parallelism)
        partitions = max(1, min(len(ranges), context.parallelism))
        rows = context.spark.range(0, len(ranges), 1, numPartitions=partitions)
        if not ranges:
            return rows.select(
                F.lit(None).cast("binary").alias(KEY), F.lit(None).cast("binary").alias(ELEMENT)
            )
        if len(ranges) > LITERAL_RANGES_MAX:
            local = context.spark.createDataFrame(
                [(None, bytearray(r.encode())) for r in ranges], f"{KEY} binary, {ELEMENT} binary"
            )
            return local.repartition(partitions)
        encoded = F.array(*[F.lit(bytearray(r.encode())) for r in ranges])
        return rows.select(
            F.lit(None).cast("binary").alias(KEY),
            F.element_at(encoded, (F.col("id") + 1).cast("int")).alias(ELEMENT),
        )
