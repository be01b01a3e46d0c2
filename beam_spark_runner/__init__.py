"""beam-spark-runner: run Apache Beam Python pipelines on Apache Spark.

Use it by adding ``--runner=SparkStructuredRunner`` to a Beam pipeline's options. The
names below are imported lazily so that ``import beam_spark_runner`` (done at interpreter
start by the registration hook's package) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from beam_spark_runner._version import __version__

if TYPE_CHECKING:
    from beam_spark_runner.options import SparkRunnerOptions
    from beam_spark_runner.runner import SparkStructuredRunner

__all__ = ["SparkRunnerOptions", "SparkStructuredRunner", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "SparkStructuredRunner":
        from beam_spark_runner.runner import SparkStructuredRunner

        return SparkStructuredRunner
    if name == "SparkRunnerOptions":
        from beam_spark_runner.options import SparkRunnerOptions

        return SparkRunnerOptions
    raise AttributeError(f"module 'beam_spark_runner' has no attribute {name!r}")
