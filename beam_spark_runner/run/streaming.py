"""A streaming run: the plan as one Spark streaming query, watched until it ends.

The query (``streaming.query.build_frame``) ends in a ``foreachBatch`` on the driver that
reads the sink's markers. Once every producer reaching the sink says +inf (every source
ended and every stage fired everything), the query is stopped after Spark commits its
last micro-batch, and the result is DONE. A failure ends it FAILED with the Beam stage
named; ``cancel()`` ends it CANCELLED. Either way the run is closed once.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from apache_beam.runners.runner import PipelineState

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.monitoring.job_progress import progress_logger
from beam_spark_runner.monitoring.metrics import element_counts
from beam_spark_runner.run import cleanup
from beam_spark_runner.run.lifecycle import OpenRun
from beam_spark_runner.run.prepare import PreparedRun
from beam_spark_runner.spark.compat import has_state_processor
from beam_spark_runner.spark.session import settings_within
from beam_spark_runner.streaming import jvm_warmup, pre_init_server
from beam_spark_runner.streaming.bounded_side_inputs import plan_broadcasts
from beam_spark_runner.streaming.checkpoint import check_checkpoint
from beam_spark_runner.streaming.checkpoint_files import checkpoint_file_settings, spark_location
from beam_spark_runner.streaming.progress import ProgressReport, progress_plan
from beam_spark_runner.streaming.query import (
    build_frame,
    ensure_state_store,
    one_worker_daemon,
    plan_topology,
)
from beam_spark_runner.streaming.result import StreamingPipelineResult, wait_for
from beam_spark_runner.streaming.sink_watch import SinkWatch, last_batch, quiet_callback_errors
from beam_spark_runner.translators.base import spark_function_name

_LOGGER = logging.getLogger(__name__)

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# How often the driver logs a running query's progress.
_PROGRESS_SECONDS = 5.0
# How often a query that has fired everything checks whether Spark has committed its last
# micro-batch before stopping it (the commit comes a few ms after the batch's action).
_COMMIT_POLL_SECONDS = 0.01
# How long the watcher waits for a stopped query's last micro-batch to end.
_END_SECONDS = 30.0


def run_streaming(prepared: PreparedRun) -> StreamingPipelineResult:
    """Starts ``prepared`` as a streaming query; returns its RUNNING result."""
    settings = prepared.settings
    plan, job_name = prepared.plan, prepared.job_name
    run = OpenRun.open(prepared, broadcast_main_session=False)
    spark = run.spark
    broadcasts = plan_broadcasts(plan)
    topology = plan_topology(plan, run.context.parallelism, broadcasts)
    owned_checkpoint = settings.checkpoint_location is None
    checkpoint = settings.checkpoint_location or cleanup.temporary_checkpoint()
    watch = SinkWatch(topology, run.context.sinks.logs)
    release_callback_logs = quiet_callback_errors()
    # The levels' shards spread over the query's shuffle partitions (streaming.placement).
    partitions: int | None = int(spark.conf.get(SHUFFLE_PARTITIONS, "200") or 200)
    try:
        if not owned_checkpoint:
            # Refused before any of the query's Spark work starts.
            partitions = check_checkpoint(spark, checkpoint, topology, partitions)
        if topology.levels:
            if has_state_processor():
                # Up by the first micro-batch's planning, which runs each level's pre-init.
                pre_init_server.start(spark)
            jvm_warmup.start(spark.sparkContext)
        ensure_state_store(spark)
        if broadcasts.readers:
            _LOGGER.info(
                "Bounded side inputs computed before the query and broadcast, for: %s "
                "(%d stage(s) that only compute them run in batch)",
                ", ".join(plan.stage(name).display_name for name in sorted(broadcasts.readers)),
                len(broadcasts.computed_in_batch),
            )
        # Sinks' temporary files made since then are this query's, its killed attempts' too.
        started = None if owned_checkpoint else cleanup.checkpoint_started(spark, checkpoint)
        started = started or time.time()
        frame = build_frame(run.context, topology, broadcasts.readers, partitions)
        query_name = f"beam-{spark_function_name(job_name)[5:]}-{run.run_id}"
        _LOGGER.info(
            "Beam pipeline %s runs in streaming: one Spark query (%s) of %d stateful "
            "level(s) over %d shards, a micro-batch every %s s, checkpoint %s",
            job_name,
            query_name,
            topology.levels,
            topology.shards,
            settings.trigger_interval,
            checkpoint,
        )
        query = _start(run, frame, query_name, watch, checkpoint)
    except BaseException as error:
        release_callback_logs()
        if owned_checkpoint:
            cleanup.remove_tree(checkpoint)
        _, failure = run.close(error)
        raise failure from None  # type: ignore[misc]
    cancelled = threading.Event()

    def cancel() -> None:
        cancelled.set()
        query.stop()

    result = StreamingPipelineResult(spark.sparkContext.applicationId, run.metrics, cancel)
    report = ProgressReport(job_name, settings.trigger_interval, progress_plan(plan, topology))

    def watch_query() -> None:
        started = time.monotonic()
        error: BaseException | None = None
        try:
            _watch(query, watch, report, run)
            error = watch.failure_of(query.exception())
        except Exception as caught:  # noqa: BLE001 - reported through the result
            error = caught
        finally:
            release_callback_logs()
            stopped_at_exit()
            if owned_checkpoint:
                cleanup.remove_tree(checkpoint)
        _, error = run.close(error)
        if error is not None:
            state = PipelineState.FAILED
        elif watch.finished.is_set():
            state = PipelineState.DONE
            cleanup.remove_abandoned_temp_dirs(bi.file_sink_temp_prefixes(plan.components), started)
        else:
            state = PipelineState.CANCELLED if cancelled.is_set() else PipelineState.STOPPED
        _LOGGER.info(
            "Beam pipeline %s (streaming) ended %s after %d micro-batches in %.1f s",
            job_name,
            state,
            watch.batches,
            time.monotonic() - started,
        )
        result.finish(state, watch.batches, error)

    watcher = threading.Thread(target=watch_query, name=f"beam-query-{run.run_id}", daemon=True)
    stopped_at_exit = cleanup.stop_at_exit(query.stop, watcher)
    watcher.start()
    return result


def _start(run: OpenRun, frame: Any, query_name: str, watch: SinkWatch, checkpoint: str) -> Any:
    """Starts the query on ``frame``, its micro-batches read by ``watch`` on the driver."""
    spark = run.spark
    spark_context = spark.sparkContext
    spark_context.setJobDescription(f"Beam pipeline {run.prepared.job_name} (streaming)")
    try:
        location = spark_location(spark, checkpoint)
        # The query plans and runs with these; the session keeps its own.
        settings = {
            **run.sql_settings,
            **one_worker_daemon(),
            **checkpoint_file_settings(spark, location),
        }
        with settings_within(spark, settings):
            return (
                frame.writeStream.queryName(query_name)
                .foreachBatch(watch.on_batch)
                .option("checkpointLocation", location)
                .trigger(processingTime=f"{run.prepared.settings.trigger_interval} seconds")
                .start()
            )
    finally:
        spark_context.setJobDescription(None)  # type: ignore[arg-type]


def _watch(query: Any, watch: SinkWatch, report: ProgressReport, run: OpenRun) -> None:
    """Until the query ends or has fired everything: its progress logged every few seconds.

    Once everything has fired, Spark commits the last micro-batch before the query stops,
    so that a named checkpoint does not replay it.
    """
    last_log = time.monotonic()
    while not watch.finished.wait(0.2):
        if not query.isActive:
            # Inactive as soon as stop() begins; the run's quiet callback logs must outlast
            # the interrupted micro-batch's callback.
            _await_end(query)
            break
        if time.monotonic() - last_log > _PROGRESS_SECONDS:
            last_log = time.monotonic()
            report.falls_behind(query.recentProgress)
            counts = element_counts(run.context.sinks.metrics.accumulator.value)
            line = report.line(query.lastProgress, dict(watch.watermarks), counts)
            progress_logger().info("%s", line)
    if watch.finished.is_set():
        wait_for(
            lambda: last_batch(query) >= (watch.final_batch or 0),
            timeout=10,
            poll=_COMMIT_POLL_SECONDS,
        )
        query.stop()


def _await_end(query: Any) -> None:
    """Until a stopped query's thread has ended (its last callback returned), or a while."""
    try:
        query.awaitTermination(_END_SECONDS)
    except Exception:  # noqa: BLE001 - a failed query: its watcher reads query.exception()
        _LOGGER.debug("The stopped query ended with an error", exc_info=True)
