"""A batch run: the plan's DataFrames built and run as one Spark job."""

from __future__ import annotations

import logging
import time

from apache_beam.runners.runner import PipelineState

from beam_spark_runner.monitoring.job_progress import ProgressReporter
from beam_spark_runner.result import SparkPipelineResult
from beam_spark_runner.run.lifecycle import OpenRun
from beam_spark_runner.run.prepare import PreparedRun
from beam_spark_runner.spark import driver_jvm
from beam_spark_runner.spark.session import settings_within

_LOGGER = logging.getLogger(__name__)


def run_batch(prepared: PreparedRun) -> SparkPipelineResult:
    """Runs ``prepared`` to completion; raises a ``PipelineExecutionError`` if it fails."""
    run = OpenRun.open(prepared)
    error: BaseException | None = None
    try:
        _run_job(run)
    except BaseException as failed:
        error = failed
    finally:
        run_metrics, error = run.close(error)
    if error is not None:
        raise error from None
    return SparkPipelineResult(
        PipelineState.DONE, run_metrics, run.spark.sparkContext.applicationId
    )


def _run_job(run: OpenRun) -> None:
    """Builds every stage's DataFrame and runs the leaves as one job in the run's group."""
    plan, job_name = run.prepared.plan, run.prepared.job_name
    spark_context = run.spark.sparkContext
    context = run.context
    group = f"beam-{job_name}-{run.run_id}"
    started = time.monotonic()
    try:
        # Spark reads the SQL settings when it plans and runs the job.
        with settings_within(run.spark, run.sql_settings):
            spark_context.setJobGroup(group, f"Beam pipeline {job_name}", interruptOnCancel=True)
            leaves = context.leaf_frames()
            stage_names = "; ".join(s.display_name for s in plan.stages)
            spark_context.setJobDescription(f"Beam pipeline {job_name}: {stage_names}"[:1000])
            if leaves:
                with ProgressReporter(spark_context, group, job_name):
                    context.union_frames(leaves).write.format("noop").mode("overwrite").save()
    except BaseException as error:
        # The user's traceback once, in the run's error; Spark's (the same traceback wrapped
        # in JVM frames) only at DEBUG.
        _LOGGER.debug("Spark's error for Beam pipeline %s", job_name, exc_info=error)
        raise
    finally:
        if driver_jvm.running():  # else the error says how it ended
            spark_context.setJobDescription(None)  # type: ignore[arg-type]
    _LOGGER.info(
        "Beam pipeline %s: its Spark job ran in %.1f s (%d stages)",
        job_name,
        time.monotonic() - started,
        len(plan.stages),
    )
