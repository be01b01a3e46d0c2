"""A plain ``ReadFromText`` read by the runner: byte ranges of the files, one row each.

Planning (``planning.native_text_reads``) matched the files; here they are split into
byte ranges spread over ``context.parallelism`` partitions, with no Python and no shuffle
(``TranslationContext.literal_rows``). The stage that reads the lines turns each
partition's ranges into one bundle (``execution.text_read``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from beam_spark_runner.execution.text_read import split_ranges
from beam_spark_runner.planning import TEXT_READ_URN, PlannedBuffer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


class TextReadTranslator:
    """(key, element) rows whose elements are ``TextRange``s of the read's files."""

    urn = TEXT_READ_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """One row per byte range, in at most ``context.parallelism`` partitions."""
        files = json.loads(context.plan.components.transforms[node.name].spec.payload)
        ranges = split_ranges(files, context.parallelism)
        return context.literal_rows([r.encode() for r in ranges])
