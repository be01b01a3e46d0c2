"""Flatten, and plain PCollections between stages: the union of the writers' outputs.

Beam's ``sink_flattens`` phase turns a Flatten that cannot be fused into several writes to
one buffer; a PCollection read by another stage is a buffer with one writer. Both are a
union. The same PCollection flattened twice is written twice, so it appears twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from beam_spark_runner.planning import FLATTEN_URN, PlannedBuffer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


class FlattenTranslator:
    """Union of every writer's (key, element) rows."""

    urn = FLATTEN_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """The union of the buffer's writers."""
        return context.union(context.writer_frames(node))
