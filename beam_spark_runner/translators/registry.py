"""The URN -> translator registry.

After fusion a pipeline is fused stages (``beam:runner:executable_stage:v1``) joined by
buffers that runner primitives fill: Impulse, GroupByKey, Reshuffle, Flatten, the
native text read, the native Create and the native combine. Each has
a translator here that builds its Spark DataFrame. A URN without a translator is an error
raised while planning, before Spark starts (see :func:`translator_for`).
"""

from __future__ import annotations

from beam_spark_runner.translators.base import Translator
from beam_spark_runner.translators.create import CreateTranslator
from beam_spark_runner.translators.flatten import FlattenTranslator
from beam_spark_runner.translators.fused_stage import FusedStageTranslator
from beam_spark_runner.translators.group_by_key import GroupByKeyTranslator
from beam_spark_runner.translators.impulse import ImpulseTranslator
from beam_spark_runner.translators.native_combine import NativeCombineTranslator
from beam_spark_runner.translators.reshuffle import ReshuffleTranslator
from beam_spark_runner.translators.text_read import TextReadTranslator

TRANSLATORS: dict[str, Translator] = {
    translator.urn: translator
    for translator in (
        ImpulseTranslator(),
        FlattenTranslator(),
        GroupByKeyTranslator(),
        NativeCombineTranslator(),
        ReshuffleTranslator(),
        TextReadTranslator(),
        CreateTranslator(),
        FusedStageTranslator(),
    )
}


def translator_for(urn: str) -> Translator | None:
    """The translator registered for ``urn``, or None."""
    return TRANSLATORS.get(urn)


__all__ = ["TRANSLATORS", "Translator", "translator_for"]
