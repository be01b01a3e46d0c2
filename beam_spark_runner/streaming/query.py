"""The streaming query: the plan as one chain of Spark steps, its start and its end.

``plan_topology`` turns the fused plan into routed nodes (``topology``); ``start_query``
builds ``source -> router 0 -> level 1 -> router 1 -> ... -> router L``, sends what reaches
the sink (markers only) to a ``foreachBatch`` on the driver, and starts the query. The
driver watches the sink's markers: once every producer that reaches it says +inf (all
sources ended and every stage has fired everything), the query is stopped and the result
is DONE. A failure ends it FAILED, with the Beam stage named; ``cancel()`` ends it
CANCELLED.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from apache_beam.runners.runner import PipelineState

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.main_session import MainSession
from beam_spark_runner.monitoring import worker_logs, worker_warnings
from beam_spark_runner.monitoring.failed_attempts import AttemptCollector
from beam_spark_runner.monitoring.metrics import RunMetrics, pipeline_level_infos
from beam_spark_runner.planning import (
    GROUP_BY_KEY_URN,
    SPARK_STREAM_BUFFER_KIND,
    TEST_STREAM_BUFFER_KIND,
    Plan,
    PlannedStage,
)
from beam_spark_runner.run.batch import describe_failure, open_run_context
from beam_spark_runner.spark import java
from beam_spark_runner.spark.compat import named_function
from beam_spark_runner.spark.session import settings_within
from beam_spark_runner.streaming import jvm_warmup, pre_init_server
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.bounded_side_inputs import BroadcastPlan, plan_broadcasts
from beam_spark_runner.streaming.check import is_unbounded_splittable
from beam_spark_runner.streaming.checkpoint import check_checkpoint
from beam_spark_runner.streaming.checkpoint_files import checkpoint_file_settings, spark_location
from beam_spark_runner.streaming.levels import Level
from beam_spark_runner.streaming.progress import ProgressReport
from beam_spark_runner.streaming.result import StreamingPipelineResult, wait_for
from beam_spark_runner.streaming.router import RouterSpec, run_router
from beam_spark_runner.streaming.side_inputs import SideInputSpec, SideInputStageSpec
from beam_spark_runner.streaming.source import source_frame
from beam_spark_runner.streaming.source_plan import SourcePlan
from beam_spark_runner.streaming.spark_sources import (
    spark_stream_roots,
    stream_columns,
    union_spark_streams,
)
from beam_spark_runner.streaming.test_stream import test_stream_steps
from beam_spark_runner.streaming.topology import (
    GROUP,
    SINK,
    STAGE,
    NodeSpec,
    Topology,
    build_topology,
    canonical_order,
)
from beam_spark_runner.streaming.watermarks import MAX_MICROS
from beam_spark_runner.translators.base import TranslationContext, spark_function_name
from beam_spark_runner.translators.fused_stage import broadcast_side_inputs, stage_spec
from beam_spark_runner.translators.group_by_key import group_spec
from beam_spark_runner.translators.map_in_arrow import map_in_arrow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_LOGGER = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STATE_STORE_PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
_ROOT_KINDS = ("impulse", TEST_STREAM_BUFFER_KIND, SPARK_STREAM_BUFFER_KIND)
# How often the driver logs a running query's progress.
_PROGRESS_SECONDS = 5.0
# How often a query that has fired everything checks whether Spark has committed its last
# micro-batch (a ``lastProgress`` read, ~1 ms) before stopping it. The commit comes a few
# ms after the batch's action; meanwhile the query goes on to plan the next micro-batch.
_COMMIT_POLL_SECONDS = 0.01
SIMPLIFIED_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


def _feeders(plan: Plan, buffer_id: bytes) -> tuple[tuple[str, str], ...]:
    """What a reader of ``buffer_id`` reads from: a root, a GroupByKey or writing stages."""
    buffer = plan.buffers[buffer_id]
    if buffer.kind in _ROOT_KINDS:
        return (("root", buffer_id.decode()),)
    if buffer.urn == GROUP_BY_KEY_URN:
        return ((GROUP, buffer_id.decode()),)
    return tuple((STAGE, writer) for writer, _ in buffer.writers)


def _readers(
    plan: Plan, buffer_id: bytes, broadcast_readers: frozenset[str] = frozenset()
) -> tuple[tuple[str, ...], ...]:
    """Who reads what is written to ``buffer_id``: its GroupByKey, or its reading stages.

    A stage reading it as its n-th side input (from 1) is ``("stage", name, n)``, unless
    the stage gets its side inputs broadcast (``broadcast_readers``).
    """
    buffer = plan.buffers[buffer_id]
    if buffer.urn == GROUP_BY_KEY_URN:
        return ((GROUP, buffer_id.decode()),)
    sides = tuple(
        (STAGE, reader, str(number))
        for reader in buffer.side_readers
        if reader not in broadcast_readers
        for number, side in enumerate(plan.stage(reader).side_inputs, start=1)
        if side.buffer_id == buffer_id
    )
    return (*((STAGE, reader) for reader in buffer.main_readers), *sides)


def side_input_stage_spec(stage: PlannedStage, context: TranslationContext) -> SideInputStageSpec:
    """What a shard of a stage with side inputs needs: coders and window mappings."""
    plan = context.plan
    payloads = {t: p for t, _, p in bi.par_do_payloads(stage.descriptor.transforms)}
    sides = tuple(
        SideInputSpec(
            transform_id=side.transform_id,
            tag=side.tag,
            access_pattern_urn=side.access_pattern_urn,
            value_coder_id=plan.safe_coders[plan.data_channel_coders[side.pcollection_id]],
            window_mapping=payloads[side.transform_id]
            .side_inputs[side.tag]
            .window_mapping_fn.SerializeToString(),
        )
        for side in stage.side_inputs
    )
    return SideInputStageSpec(
        stage=stage_spec(stage, context),
        components=plan.components.SerializeToString(),
        input_coder_id=stage.input_coder_id,
        side_inputs=sides,
    )


def plan_topology(plan: Plan, shards: int, broadcasts: BroadcastPlan | None = None) -> Topology:
    """The plan's stages and GroupByKeys as routed nodes, in topological order.

    Stages in ``broadcasts.computed_in_batch`` are left out; stages in
    ``broadcasts.readers`` read no side input through the query.
    """
    broadcasts = broadcasts or BroadcastPlan(frozenset(), frozenset())
    batch_only = broadcasts.computed_in_batch
    specs: list[NodeSpec] = []
    groups_added: set[bytes] = set()

    def add_group(buffer_id: bytes) -> None:
        buffer = plan.buffers[buffer_id]
        groups_added.add(buffer_id)
        specs.append(
            NodeSpec(
                name=buffer_id.decode(),
                kind=GROUP,
                stateful=True,
                inputs=tuple((STAGE, writer) for writer, _ in buffer.writers),
                outputs=(tuple((STAGE, reader) for reader in buffer.main_readers),),
            )
        )

    for stage in plan.stages:
        if stage.name in batch_only:
            continue
        input_buffer = plan.buffers[stage.input_buffer_id]
        if input_buffer.urn == GROUP_BY_KEY_URN and stage.input_buffer_id not in groups_added:
            add_group(stage.input_buffer_id)
        streamed_sides = () if stage.name in broadcasts.readers else stage.side_inputs
        specs.append(
            NodeSpec(
                name=stage.name,
                identity=stage_identity(stage),
                kind=STAGE,
                stateful=bool(stage.stateful or streamed_sides or is_unbounded_splittable(stage)),
                inputs=_feeders(plan, stage.input_buffer_id),
                outputs=tuple(
                    _readers(plan, output.buffer_id, broadcasts.readers) for output in stage.outputs
                ),
                side_inputs=tuple(_feeders(plan, side.buffer_id) for side in streamed_sides),
            )
        )
    for buffer_id, buffer in plan.buffers.items():
        if (
            buffer.urn == GROUP_BY_KEY_URN
            and buffer_id not in groups_added
            and not all(writer in batch_only for writer, _ in buffer.writers)
        ):
            add_group(buffer_id)
    return build_topology(canonical_order(specs), shards)


def stage_identity(stage: PlannedStage) -> str:
    """A fused stage's transforms, sorted: what it is, the same in every process.

    Its name is not: Beam names a fused stage by the order it fused its parts in, which
    follows protobuf map order, and that varies between processes (seen: a restarted
    ``fileio.WriteToFiles`` pipeline's stage named its parts in another order).
    """
    return "+".join(sorted(t.unique_name for t in stage.descriptor.transforms.values()))


# The Java exceptions a stopped query's interrupted action ends in (Spark's
# StreamExecution.IO_EXCEPTION_NAMES).
_INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


# What Spark's ``query.stop()`` cancels the query's running jobs with (their job group is
# the query's run id): "[SPARK_JOB_CANCELLED] Job 16 cancelled Query <name> [id = ...,
# runId = ...] was stopped".
_STOPPED_JOB = re.compile(r"SPARK_JOB_CANCELLED\].* cancelled Query .* was stopped")


def is_interruption(error: BaseException) -> bool:
    """Whether ``error`` is an action interrupted by ``query.stop()`` (a Py4J error).

    Either the action's thread was interrupted (Spark's I/O interruption exceptions) or
    its job was cancelled with the query's job group (``_STOPPED_JOB``).
    """
    if type(error).__name__ != "Py4JJavaError":
        return False
    head = str(error)[:1000]
    return any(name in head for name in _INTERRUPTIONS) or bool(_STOPPED_JOB.search(head))


class QueryInterrupted(RuntimeError):
    """A micro-batch's action interrupted because the query is stopping.

    Its message is short and in the form Spark recognises as an interruption by ``stop()``
    (``StreamExecution.PROXY_ERROR``): Spark matches that pattern against the
    ``foreachBatch`` error's whole text, and on Py4J's text (a Java stack trace) the match
    overflowed the stream thread's stack, logging a ``StackOverflowError`` on every cancel.
    """

    def __init__(self, batch_id: int) -> None:
        super().__init__(
            "py4j.protocol.Py4JJavaError: An error occurred while calling collectToPython "
            f"for micro-batch {batch_id}: {_INTERRUPTIONS[0]} (the query was stopped)"
        )


class _DropInterruptions(logging.Filter):
    """Drops Py4J's ERROR record of a ``QueryInterrupted`` (a stop, not a failure).

    Py4J logs every exception a Python callback (``foreachBatch``) raises, with its
    traceback; a query stopped mid-batch is not an error to report.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, QueryInterrupted)


_PY4J_CALLBACK_LOGGER = "py4j.clientserver"


def _quiet_interruptions() -> None:
    """Installs ``_DropInterruptions`` on Py4J's callback logger, once."""
    logger = logging.getLogger(_PY4J_CALLBACK_LOGGER)
    if not any(isinstance(f, _DropInterruptions) for f in logger.filters):
        logger.addFilter(_DropInterruptions())


class _SinkWatch:
    """The driver's view of the sink: the latest watermark of each producer reaching it."""

    def __init__(self, topology: Topology, logs: Any = None) -> None:
        self.expected = topology.sink_producers
        self.logs = logs
        self.watermarks: dict[str, int] = {}
        self.finished = threading.Event()
        self.final_batch: int | None = None
        self.batches = 0

    def on_batch(self, frame: DataFrame, batch_id: int) -> None:
        """``foreachBatch``: runs the micro-batch (one action) and reads its sink markers."""
        try:
            rows = frame.collect()
        except Exception as error:
            if is_interruption(error):
                raise QueryInterrupted(batch_id) from None
            raise
        finally:
            self.reemit_logs()
        for row in rows:
            marker = routed.marker_of(row)
            previous = self.watermarks.get(marker.producer, marker.watermark)
            self.watermarks[marker.producer] = max(previous, marker.watermark)
        self.batches += 1
        java.note_pipeline_ran()
        _LOGGER.debug("Micro-batch %d: sink watermarks %s", batch_id, self.watermarks)
        if self.final_batch is None and all(
            self.watermarks.get(p, -1) >= MAX_MICROS for p in self.expected
        ):
            self.final_batch = batch_id
            self.finished.set()

    def reemit_logs(self) -> None:
        """Logs what user code logged in the micro-batch's tasks, then empties the record.

        Called after the batch's action: its tasks are done, and each task's records were
        merged into the accumulator before the action returned, so none is lost. Emptying
        it keeps a long-running query's driver memory flat.
        """
        if self.logs is None:
            return
        records = self.logs.value
        self.logs.value = []
        worker_logs.reemit(records)


def _last_batch(query: Any) -> int:
    """The id of the last micro-batch the query completed, -1 before the first."""
    progress: dict[str, Any] = query.lastProgress or {}
    return int(progress.get("batchId", -1))


def ensure_state_store(spark: SparkSession) -> None:
    """RocksDB state stores: ``transformWithState`` needs them.

    Left at Spark's default: RocksDB's changelog checkpointing (a commit writes the batch's
    changes and snapshots are made in the background). It cut an almost empty micro-batch
    by about 50 ms (a snapshot upload per commit: 0.1-0.15 s per task and level), but each
    shard rewrites its whole state value every batch, so under load the changelog holds as
    much as a snapshot and the background snapshots compete for the cores: Nexmark q5 at
    32 000 events/s, interleaved, median micro-batch 1.92 and 1.77 s without, 2.17, 2.52
    and 2.31 s with (``docs/performance.md``). A session can still turn it on
    (``spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled``).
    """
    current = spark.conf.get(STATE_STORE_PROVIDER_CONF, None)
    if current != ROCKSDB_PROVIDER:
        _LOGGER.info("Streaming state store: %s (was %s)", ROCKSDB_PROVIDER, current)
        spark.conf.set(STATE_STORE_PROVIDER_CONF, ROCKSDB_PROVIDER)


def one_worker_daemon() -> dict[str, str]:
    """The setting a query starts with so that it gets one Python worker daemon.

    Spark keeps a daemon per Python environment, and its ``mapInArrow`` runners give their
    workers ``SPARK_SIMPLIFIED_TRACEBACK=1`` (this setting, on by default) where its
    ``transformWithState`` runners do not: a streaming query started two daemons, each
    importing Beam (the worker daemon's 1.5-3.5 s), the second in the middle of the first
    micro-batch. Off for the query (``session.settings_within``), so its routers' and levels'
    workers fork from one daemon. What a failure shows is unchanged: the workers format the
    user's traceback themselves (``errors.StageExecutionError``) and the driver names the
    stage (``job.describe_failure``).
    """
    return {SIMPLIFIED_TRACEBACK_CONF: "false"}


def _source_plan(plan: Plan, topology: Topology) -> SourcePlan:
    impulse = next(
        (b.decode() for b, buffer in plan.buffers.items() if buffer.kind == "impulse"), None
    )
    return SourcePlan(
        topology=topology,
        impulse=impulse if impulse in topology.roots else None,
        test_streams=tuple(test_stream_steps(plan)),
        open_roots=frozenset(
            root.producer for root in spark_stream_roots(plan) if root.producer in topology.roots
        ),
    )


def build_frame(
    context: TranslationContext, topology: Topology, broadcast_readers: frozenset[str] = frozenset()
) -> DataFrame:
    """The query's DataFrame: source, routers and levels, ending in the sink's markers.

    The stages in ``broadcast_readers`` get their (bounded) side inputs computed now, one
    Spark job each, and broadcast.
    """
    plan = context.plan
    spark = context.spark
    side_input_state = {
        node.name: broadcast_side_inputs(plan.stage(node.name), context, inline=node.stateful)
        for node in topology.nodes
        if node.name in broadcast_readers
    }
    frame = source_frame(spark, _source_plan(plan, topology))
    frame = union_spark_streams(frame, spark, plan, topology)
    reads = stream_columns(plan, topology)
    for step in range(topology.levels + 1):
        if step > 0:
            level = topology.stateful_in(step)
            groups = {
                node.index: group_spec(plan.buffers[node.name.encode()], context)
                for node in level
                if node.kind == GROUP
            }
            level_stages = [plan.stage(node.name) for node in level if node.kind == STAGE]
            stateful = {
                topology.node_of(stage.name).index: stage_spec(
                    stage, context, side_input_state.get(stage.name)
                )
                for stage in level_stages
                if stage.stateful
            }
            with_side_inputs = {
                topology.node_of(stage.name).index: side_input_stage_spec(stage, context)
                for stage in level_stages
                if stage.side_inputs and stage.name not in broadcast_readers
            }
            splittable = {
                topology.node_of(stage.name).index: stage_spec(
                    stage, context, side_input_state.get(stage.name)
                )
                for stage in level_stages
                if is_unbounded_splittable(stage)
            }
            processor = Level(
                topology, groups, stateful, splittable, with_side_inputs, context.sinks
            ).processor()
            frame = frame.groupBy(routed.TARGET, routed.SHARD).transformWithState(
                processor, routed.routed_type(), "Append", "None"
            )
        stages = {
            node.index: stage_spec(plan.stage(node.name), context, side_input_state.get(node.name))
            for node in topology.stateless_in(step)
        }
        if stages:
            names = " + ".join(plan.stage(topology.nodes[i].name).display_name for i in stages)
            body = functools.partial(
                run_router,
                RouterSpec(
                    step,
                    topology,
                    stages,
                    # Only the reads this router's stages read (their coders ship per task).
                    {p: c for p, c in reads.items() if stages.keys() & set(topology.roots[p])},
                ),
                sinks=context.sinks,
            )
            frame = map_in_arrow(
                frame, named_function(body, spark_function_name(names)), routed.routed_type()
            )
    return frame.filter(frame[routed.TARGET] == SINK)


def start_query(
    plan: Plan,
    spark: SparkSession,
    job_name: str,
    parallelism: int | None,
    pickle_library: str,
    trigger_seconds: float,
    checkpoint_location: str | None,
    saved_main_session: MainSession | None = None,
    log_levels: worker_logs.LogLevels | None = None,
    sql_settings: Mapping[str, str] | None = None,
) -> StreamingPipelineResult:
    """Starts the pipeline's streaming query; returns its RUNNING result.

    Tasks restore ``saved_main_session`` (``--save_main_session``) first; user code's log
    records at ``log_levels`` are logged on the driver after each micro-batch. The query
    plans and runs with ``sql_settings`` (``session.interpreted_sql_settings``); the
    session keeps its own.
    """
    spark_context = spark.sparkContext
    # spark.conf, not getConf(): that copies every setting (~100 Py4J calls).
    collector = AttemptCollector.start(spark.conf)
    context = open_run_context(
        plan,
        spark,
        parallelism,
        collector,
        pickle_library,
        saved_main_session,
        log_levels or worker_logs.LogLevels(),
        broadcast_main_session=False,
    )
    run_id = context.run_id
    sinks = context.sinks
    metrics = sinks.metrics
    broadcasts = plan_broadcasts(plan)
    topology = plan_topology(plan, context.parallelism, broadcasts)
    if topology.levels:
        # Up by the first micro-batch's planning, which runs each level's pre-init.
        pre_init_server.start(spark)
        jvm_warmup.start(spark.sparkContext)
    ensure_state_store(spark)
    _quiet_interruptions()
    owned_checkpoint = checkpoint_location is None
    checkpoint = checkpoint_location or tempfile.mkdtemp(prefix="beam-spark-checkpoint-")
    watch = _SinkWatch(topology, sinks.logs)
    if broadcasts.readers:
        _LOGGER.info(
            "Bounded side inputs computed before the query and broadcast, for: %s "
            "(%d stage(s) that only compute them run in batch)",
            ", ".join(plan.stage(name).display_name for name in sorted(broadcasts.readers)),
            len(broadcasts.computed_in_batch),
        )
    try:
        if not owned_checkpoint:
            check_checkpoint(spark, checkpoint, topology)
        frame = build_frame(context, topology, broadcasts.readers)
    except BaseException as error:
        context.release()
        if collector is not None:
            collector.close()
        if isinstance(error, StageExecutionError) or type(error).__module__.startswith(
            ("pyspark", "py4j")
        ):
            raise describe_failure(error) from None  # a bounded side input failed
        raise
    query_name = f"beam-{spark_function_name(job_name)[5:]}-{run_id}"
    _LOGGER.info(
        "Beam pipeline %s runs in streaming: one Spark query (%s) of %d stateful level(s) "
        "over %d shards, a micro-batch every %s s, checkpoint %s",
        job_name,
        query_name,
        topology.levels,
        topology.shards,
        trigger_seconds,
        checkpoint,
    )
    spark_context.setJobDescription(f"Beam pipeline {job_name} (streaming)")
    try:
        location = spark_location(spark, checkpoint)
        settings = {
            **(sql_settings or {}),
            **one_worker_daemon(),
            **checkpoint_file_settings(spark, location),
        }
        with settings_within(spark, settings):
            query = (
                frame.writeStream.queryName(query_name)
                .foreachBatch(watch.on_batch)
                .option("checkpointLocation", location)
                .trigger(processingTime=f"{trigger_seconds} seconds")
                .start()
            )
    finally:
        spark_context.setJobDescription(None)  # type: ignore[arg-type]
    cancelled = threading.Event()

    def read_metrics() -> RunMetrics:
        return RunMetrics.collect(
            metrics.accumulator.value,
            collector.attempts if collector is not None else [],
            pipeline_level_infos(len(plan.stages)),
        )

    def cancel() -> None:
        cancelled.set()
        query.stop()

    result = StreamingPipelineResult(spark_context.applicationId, read_metrics, cancel)

    report = ProgressReport(
        job_name,
        trigger_seconds,
        {
            node.index: plan.stage(node.name).display_name
            if node.kind == STAGE
            else f"GroupByKey {plan.buffers[node.name.encode()].name}"
            for node in topology.nodes
        },
    )

    def watch_query() -> None:
        started = last_log = time.monotonic()
        error: BaseException | None = None
        try:
            while not watch.finished.wait(0.2):
                if not query.isActive:
                    break
                if time.monotonic() - last_log > _PROGRESS_SECONDS:
                    last_log = time.monotonic()
                    report.falls_behind(query.recentProgress)
                    _LOGGER.info("%s", report.line(query.lastProgress, dict(watch.watermarks)))
            if watch.finished.is_set():
                # Let Spark commit the last batch before stopping, so a named checkpoint
                # does not replay it.
                wait_for(
                    lambda: _last_batch(query) >= (watch.final_batch or 0),
                    timeout=10,
                    poll=_COMMIT_POLL_SECONDS,
                )
                query.stop()
            failure = query.exception()
            if failure is not None:
                error = describe_failure(failure)
        except Exception as caught:  # noqa: BLE001 - reported through the result
            error = caught
        finally:
            context.release()
            if collector is not None:
                collector.close()
            if owned_checkpoint:
                shutil.rmtree(checkpoint, ignore_errors=True)
        worker_warnings.reissue(sinks.warnings.value)
        if error is not None:
            state = PipelineState.FAILED
        elif watch.finished.is_set():
            state = PipelineState.DONE
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

    threading.Thread(target=watch_query, name=f"beam-query-{run_id}", daemon=True).start()
    return result
