"""Spark failures as Beam-stage errors: what failed, in which stage, and what to do."""

from __future__ import annotations

import re

from beam_spark_runner.errors import (
    DriverExitedError,
    PipelineExecutionError,
    StageExecutionError,
)
from beam_spark_runner.execution import main_session
from beam_spark_runner.spark import driver_jvm

_STAGE_FAILURE = re.compile(r"Beam stage '(?P<stage>.+?)' failed:\n(?P<detail>.*)", re.DOTALL)
# Spark appends JVM frames after the Python traceback, and a failed streaming query its
# description (offsets, logical plan): cut them, to keep the message readable.
_JVM_TAIL = re.compile(r"\n\s*(?:at |JVM stacktrace:|\tat |=== Streaming Query ===).*", re.DOTALL)

# How long a failure that lost the connection to the driver JVM waits for it to end.
_DRIVER_EXIT_GRACE = 2.0


def describe_failure(error: BaseException) -> PipelineExecutionError:
    """A Spark failure as a PipelineExecutionError naming the Beam stage, where known.

    Where the driver JVM itself has exited, a ``DriverExitedError`` saying how.
    """
    lost = isinstance(error, ConnectionError) or type(error).__name__ == "Py4JNetworkError"
    ended = driver_jvm.how_it_ended(grace=_DRIVER_EXIT_GRACE if lost else 0.0)
    if ended is not None:
        return DriverExitedError(
            f"{ended} The pipeline failed with it; the next pipeline this process runs "
            "starts a new one."
        )
    message = str(error)
    match = _STAGE_FAILURE.search(message)
    if match is None:
        return PipelineExecutionError(
            f"The pipeline failed on Spark: {type(error).__name__}: {_JVM_TAIL.sub('', message)}"
        )
    stage = match.group("stage")
    detail = _JVM_TAIL.sub("", match.group("detail")).strip()
    return PipelineExecutionError(
        f"Beam stage '{stage}' failed on Spark. The error from user code:\n{detail}", stage
    )


def is_spark_failure(error: BaseException) -> bool:
    """Whether ``error`` came from Spark or a stage's user code (rather than the runner)."""
    return isinstance(error, StageExecutionError | ConnectionError) or type(
        error
    ).__module__.startswith(("pyspark", "py4j"))


def as_pipeline_error(
    error: BaseException, saved_main_session: bool, pickle_library: str
) -> BaseException:
    """What a run that failed with ``error`` raises to the user.

    Spark's failures name the Beam stage; a failure that looks like a main-script name the
    workers could not find says to use ``--save_main_session`` where it was not used.
    Anything else (a runner bug, an interrupt) is raised as it is.
    """
    if not isinstance(error, PipelineExecutionError):
        if not is_spark_failure(error):
            return error
        error = describe_failure(error)
    if not saved_main_session and main_session.missing_main_names(str(error), pickle_library):
        return PipelineExecutionError(
            f"{error}\n\n{main_session.SAVE_MAIN_SESSION_HINT}", error.stage_name
        )
    return error
