"""Translators: each planned node (a buffer or a fused stage) to a Spark DataFrame.

The registry (``registry``, URN -> translator) is loaded on first use, so that importing one
translator loads that translator's modules only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from beam_spark_runner.translators.base import Translator
    from beam_spark_runner.translators.registry import TRANSLATORS, translator_for

__all__ = ["TRANSLATORS", "Translator", "translator_for"]

_LAZY = {
    "TRANSLATORS": "beam_spark_runner.translators.registry",
    "translator_for": "beam_spark_runner.translators.registry",
    "Translator": "beam_spark_runner.translators.base",
}


def __getattr__(name: str) -> Any:
    """The registry's names, imported when first asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
