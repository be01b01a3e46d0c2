"""Reshuffle: a Spark repartition, which also breaks fusion.

Used for the user's ``beam.Reshuffle()`` and, through Beam's ``expand_sdf`` phase, between
splitting a bounded source's restrictions and reading them, so that the splits of a large
file are read in parallel. Elements keep their timestamps, windows and panes: they are
moved as encoded bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from beam_spark_runner.planning import RESHUFFLE_URN, PlannedBuffer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


class ReshuffleTranslator:
    """Round-robin repartition of the writers' rows over the default parallelism."""

    urn = RESHUFFLE_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """The union of the writers, spread evenly over ``context.parallelism``."""
        return context.union(context.writer_frames(node)).repartition(context.parallelism)
