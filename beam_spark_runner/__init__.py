"""beam-spark-runner: run Apache Beam Python pipelines on Apache Spark.

Use it by adding ``--runner=SparkStructuredRunner`` to a Beam pipeline's options. The
names below are imported lazily so that ``import beam_spark_runner`` (done at interpreter
start by the registration hook's package) stays cheap.
"""

from __future__ import annotations

from beam_spark_runner._version import __version__

# Not ``typing.TYPE_CHECKING``: the start-up hook imports this package in every Python
# process of the environment, which should not pay for importing ``typing``.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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
