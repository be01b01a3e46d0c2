"""Runs a translated plan on Spark and turns Spark failures into Beam-stage errors."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any

from beam_spark_runner.errors import (
    DriverExitedError,
    PipelineExecutionError,
    StageExecutionError,
)
from beam_spark_runner.execution.beam_globals import DEFAULT_PICKLE_LIBRARY
from beam_spark_runner.execution.main_session import MainSession
from beam_spark_runner.execution.stage_worker import TaskSinks
from beam_spark_runner.monitoring import worker_logs, worker_warnings
from beam_spark_runner.monitoring.failed_attempts import AttemptCollector
from beam_spark_runner.monitoring.job_progress import ProgressReporter
from beam_spark_runner.monitoring.metrics import (
    MetricsSink,
    RunMetrics,
    new_accumulator,
    pipeline_level_infos,
)
from beam_spark_runner.planning import Plan
from beam_spark_runner.spark import driver_jvm
from beam_spark_runner.spark.compat import InlineValue
from beam_spark_runner.translators import translator_for
from beam_spark_runner.translators.base import TranslationContext

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOGGER = logging.getLogger(__name__)

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


def run_plan(
    plan: Plan,
    spark: SparkSession,
    job_name: str,
    parallelism: int | None,
    pickle_library: str = DEFAULT_PICKLE_LIBRARY,
    saved_main_session: MainSession | None = None,
    log_levels: worker_logs.LogLevels | None = None,
) -> RunMetrics:
    """Builds every stage's DataFrame, runs the pipeline, returns its metrics.

    Committed metrics come from the run's accumulator; failed task attempts report theirs
    to an ``AttemptCollector`` listening on the driver for the duration of the run. Tasks
    run with the pipeline's ``pickle_library`` (``beam_globals``) and restore
    ``saved_main_session`` (``--save_main_session``) in each worker process first; user
    code's log records at ``log_levels`` are logged on the driver when the run ends.
    """
    # spark.conf, not getConf(): that copies every setting (~100 Py4J calls).
    collector = AttemptCollector.start(spark.conf)
    try:
        return _run(
            plan,
            spark,
            job_name,
            parallelism,
            collector,
            pickle_library,
            saved_main_session,
            log_levels or worker_logs.LogLevels(),
        )
    finally:
        if collector is not None:
            collector.close()


def open_run_context(
    plan: Plan,
    spark: SparkSession,
    parallelism: int | None,
    collector: AttemptCollector | None,
    pickle_library: str,
    saved_main_session: MainSession | None,
    log_levels: worker_logs.LogLevels,
    broadcast_main_session: bool = True,
) -> TranslationContext:
    """A new run of ``plan``: the translation context holding its id and accumulators.

    The accumulators are the metrics, warnings and worker logs (``TaskSinks``); the main
    session is broadcast with the context's other broadcasts. The batch run (``run_plan``)
    and the streaming query (``streaming.query``) both start so; the query's tasks carry
    the main session inline (``broadcast_main_session=False``: its stateful workers do not
    load broadcasts).
    """
    spark_context = spark.sparkContext
    sinks = TaskSinks(
        metrics=MetricsSink(
            new_accumulator(spark_context), collector.address if collector is not None else None
        ),
        warnings=worker_warnings.new_accumulator(spark_context),
        logs=worker_logs.new_accumulator(spark_context),
        log_levels=log_levels,
    )
    shipped: Any = None
    if saved_main_session is not None:
        shipped = (
            spark_context.broadcast(saved_main_session)
            if broadcast_main_session
            else InlineValue(saved_main_session)
        )
    context = TranslationContext(
        spark,
        plan,
        uuid.uuid4().hex[:12],
        parallelism or spark_context.defaultParallelism,
        sinks,
        translator_for,
        pickle_library,
        shipped,
    )
    if broadcast_main_session and shipped is not None:
        context.broadcasts.append(shipped)
    return context


def _run(
    plan: Plan,
    spark: SparkSession,
    job_name: str,
    parallelism: int | None,
    collector: AttemptCollector | None,
    pickle_library: str,
    saved_main_session: MainSession | None,
    log_levels: worker_logs.LogLevels,
) -> RunMetrics:
    spark_context = spark.sparkContext
    context = open_run_context(
        plan, spark, parallelism, collector, pickle_library, saved_main_session, log_levels
    )
    run_id = context.run_id
    sinks = context.sinks
    metrics = sinks.metrics
    group = f"beam-{job_name}-{run_id}"
    started = time.monotonic()
    try:
        spark_context.setJobGroup(group, f"Beam pipeline {job_name}", interruptOnCancel=True)
        leaves = context.leaf_frames()
        stage_names = "; ".join(s.display_name for s in plan.stages)
        spark_context.setJobDescription(f"Beam pipeline {job_name}: {stage_names}"[:1000])
        if leaves:
            with ProgressReporter(spark_context, group, job_name):
                context.union_frames(leaves).write.format("noop").mode("overwrite").save()
    except PipelineExecutionError:
        raise
    except Exception as error:
        # A side input computed on the driver (translators.driver_side_inputs) fails in
        # the user's code as a task would.
        if isinstance(error, StageExecutionError | ConnectionError) or type(
            error
        ).__module__.startswith(("pyspark", "py4j")):
            # The user's traceback once, in the message; Spark's error (the same traceback
            # wrapped in JVM frames) only at DEBUG.
            _LOGGER.debug("Spark's error for Beam pipeline %s", job_name, exc_info=error)
            raise describe_failure(error) from None
        raise
    finally:
        context.release()
        if driver_jvm.running():  # else the error says how it ended
            spark_context.setJobDescription(None)  # type: ignore[arg-type]
        # Also when the run failed: what the successful tasks logged helps find why.
        worker_logs.reemit(sinks.logs.value)
    _LOGGER.info(
        "Beam pipeline %s: its Spark job ran in %.1f s (%d stages)",
        job_name,
        time.monotonic() - started,
        len(plan.stages),
    )
    worker_warnings.reissue(sinks.warnings.value)
    run_metrics = RunMetrics.collect(
        metrics.accumulator.value,
        collector.attempts if collector is not None else [],
        pipeline_level_infos(len(plan.stages)),
    )
    if run_metrics.failed_attempt_count:
        _LOGGER.info(
            "Beam pipeline %s: %d failed task attempt(s) reported metrics; they count in "
            "attempted metrics only",
            job_name,
            run_metrics.failed_attempt_count,
        )
    return run_metrics
