"""A run opened on Spark and closed once, whether it ran as a batch job or a streaming query."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from beam_spark_runner.execution.beam_globals import TaskEnvironment
from beam_spark_runner.execution.stage_worker import TaskSinks
from beam_spark_runner.monitoring import worker_logs, worker_warnings
from beam_spark_runner.monitoring.failed_attempts import AttemptCollector
from beam_spark_runner.monitoring.metrics import (
    MetricsSink,
    RunMetrics,
    new_accumulator,
    pipeline_level_infos,
)
from beam_spark_runner.run.failures import as_pipeline_error
from beam_spark_runner.run.prepare import PreparedRun
from beam_spark_runner.spark import class_archive
from beam_spark_runner.spark.compat import InlineValue
from beam_spark_runner.spark.session import (
    interpreted_sql_settings,
    obtain_session,
    share_driver_path,
)
from beam_spark_runner.translators import translator_for
from beam_spark_runner.translators.base import TranslationContext

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOGGER = logging.getLogger(__name__)


@dataclass
class OpenRun:
    """A prepared run on its session: the translation context, accumulators and collector.

    Opened by :meth:`open`; :meth:`close` ends it exactly once, in batch after the job and
    in streaming when the query ends, and gives its metrics or its failure.
    """

    prepared: PreparedRun
    spark: SparkSession
    # Whether the runner created the session (its settings are then the runner's to set).
    owned: bool
    collector: AttemptCollector | None
    context: TranslationContext
    closed: bool = False

    @classmethod
    def open(cls, prepared: PreparedRun, broadcast_main_session: bool = True) -> OpenRun:
        """Obtains the session and opens the run: a new run id, accumulators, the collector.

        The main session is broadcast with the run's other broadcasts, or carried inline
        in each task (``broadcast_main_session=False``: a streaming query's stateful
        workers do not load broadcasts).
        """
        spark, owned = obtain_session(prepared.settings, streaming=prepared.streaming)
        share_driver_path(spark)
        # spark.conf, not getConf(): that copies every setting.
        collector = AttemptCollector.start(spark.conf)
        spark_context = spark.sparkContext
        sinks = TaskSinks(
            metrics=MetricsSink(
                new_accumulator(spark_context),
                collector.address if collector is not None else None,
            ),
            warnings=worker_warnings.new_accumulator(spark_context),
            logs=worker_logs.new_accumulator(spark_context),
            log_levels=prepared.log_levels,
        )
        shipped: Any = None
        if prepared.saved_main_session is not None:
            shipped = (
                spark_context.broadcast(prepared.saved_main_session)
                if broadcast_main_session
                else InlineValue(prepared.saved_main_session)
            )
        environment = TaskEnvironment(uuid.uuid4().hex[:12], prepared.pickle_library, shipped)
        context = TranslationContext(
            spark,
            prepared.plan,
            environment,
            prepared.settings.default_parallelism or spark_context.defaultParallelism,
            sinks,
            translator_for,
        )
        if broadcast_main_session and shipped is not None:
            context.broadcasts.append(shipped)
        return cls(prepared, spark, owned, collector, context)

    @property
    def run_id(self) -> str:
        """The run's id: its Spark job group, query name and workers' globals carry it."""
        return self.context.run_id

    @property
    def sql_settings(self) -> dict[str, str]:
        """The SQL settings the run's jobs plan and run with (``session.interpreted_sql``)."""
        return interpreted_sql_settings(self.prepared.settings, self.owned)

    def metrics(self) -> RunMetrics:
        """The run's metrics so far: committed from the accumulator, attempted as reported."""
        return RunMetrics.collect(
            self.context.sinks.metrics.accumulator.value,
            self.collector.attempts if self.collector is not None else [],
            pipeline_level_infos(len(self.prepared.plan.stages)),
        )

    def close(self, error: BaseException | None = None) -> tuple[RunMetrics, BaseException | None]:
        """Ends the run once: its metrics, and ``error`` as the user should see it (or None).

        Releases what the run cached and broadcast, stops the collector, logs what user
        code logged in workers (also after a failure: it helps find why) and re-issues
        their warnings.
        """
        assert not self.closed, "a run is closed once"
        self.closed = True
        sinks = self.context.sinks
        try:
            self.context.release()
        finally:
            if self.collector is not None:
                self.collector.close()
        worker_logs.reemit(sinks.logs.value)
        worker_warnings.reissue(sinks.warnings.value)
        if error is None:
            class_archive.note_pipeline_ran()
        run_metrics = self.metrics()
        if run_metrics.failed_attempt_count:
            _LOGGER.info(
                "Beam pipeline %s: %d failed task attempt(s) reported metrics; they count in "
                "attempted metrics only",
                self.prepared.job_name,
                run_metrics.failed_attempt_count,
            )
        if error is not None:
            error = as_pipeline_error(
                error, self.prepared.saved_main_session is not None, self.prepared.pickle_library
            )
        return run_metrics, error
