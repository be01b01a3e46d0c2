"""Errors the runner raises, each saying what was expected, what was found and what to do."""

from __future__ import annotations


class SparkRunnerError(Exception):
    """Base class of the runner's own errors."""


class UnsupportedFeatureError(SparkRunnerError, NotImplementedError):
    """The pipeline uses something the runner cannot execute yet.

    Raised while translating, before any Spark session is started.
    """


class JavaNotFoundError(SparkRunnerError, RuntimeError):
    """Spark needs a Java runtime and none was found."""


class StageExecutionError(SparkRunnerError, RuntimeError):
    """User code (or the runner) failed while Spark executed a Beam stage."""

    def __init__(self, stage_name: str, detail: str) -> None:
        super().__init__(f"Beam stage '{stage_name}' failed:\n{detail}")
        self.stage_name = stage_name
        self.detail = detail


class PipelineExecutionError(SparkRunnerError, RuntimeError):
    """The pipeline failed on Spark. The message names the Beam stage where known."""

    def __init__(self, message: str, stage_name: str | None = None) -> None:
        super().__init__(message)
        self.stage_name = stage_name


class SparkMasterUnreachableError(SparkRunnerError, ConnectionError):
    """A ``spark://`` master did not accept a connection, checked before Spark starts."""


class DriverExitedError(PipelineExecutionError):
    """The Spark driver JVM this Python process launched exited while a pipeline ran.

    Py4J only says "Connection refused" then; this says how the JVM ended
    (``driver_jvm.describe``). The next pipeline starts a new JVM.
    """
