"""A run prepared before Spark starts: Beam's globals, the checks, the plan, the main session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from apache_beam.options import pipeline_options

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import beam_globals, main_session
from beam_spark_runner.execution.main_session import MainSession
from beam_spark_runner.monitoring import worker_logs
from beam_spark_runner.options import SparkSettings, batched_steps
from beam_spark_runner.planning import Plan, build_plan
from beam_spark_runner.planning.capabilities import (
    check_pipeline,
    check_plan,
    check_requirements,
    check_stages,
)
from beam_spark_runner.streaming.check import check_streaming_pipeline
from beam_spark_runner.streaming.test_stream import carry_held_windows, inline_service_events
from beam_spark_runner.translators import translator_for


@dataclass(frozen=True)
class PreparedRun:
    """Everything a run decides without Spark, the same for batch and streaming."""

    plan: Plan
    settings: SparkSettings
    streaming: bool
    # The pipeline's --pickle_library, already Beam's process-wide pickler.
    pickle_library: str
    log_levels: worker_logs.LogLevels
    # The driver's main session (--save_main_session), or None.
    saved_main_session: MainSession | None

    @property
    def job_name(self) -> str:
        """The name the run's Spark jobs, query and log lines carry."""
        return self.settings.app_name


def prepare(
    proto: Any, options: pipeline_options.PipelineOptions, settings: SparkSettings, streaming: bool
) -> PreparedRun:
    """Checks ``proto`` for the mode and plans it; raises before Spark starts if refused.

    Refusals are ``UnsupportedFeatureError``s naming the transform and what to do.
    """
    pickle_library = beam_globals.pickle_library(options)
    beam_globals.apply(pickle_library)
    proto = bi.prepare_pipeline_proto(proto)
    if streaming:
        check_requirements(proto)
        proto = carry_held_windows(inline_service_events(proto))
        check_streaming_pipeline(proto)
    else:
        check_pipeline(proto)
    plan = build_plan(
        proto,
        is_drain=settings.drain,
        use_state_iterables=settings.state_backed_iterables,
        batched_steps=batched_steps(settings),
        native_combines=settings.native_combines and not streaming,
        streaming=streaming,
        beam_reshuffles=bi.reshuffles_expand_as_older_beam(options),
    )
    if streaming:
        check_stages(plan)
    else:
        check_plan(plan, translator_for)
    saved_main_session = (
        main_session.capture(pickle_library)
        if options.view_as(pipeline_options.SetupOptions).save_main_session
        else None
    )
    return PreparedRun(
        plan=plan,
        settings=settings,
        streaming=streaming,
        pickle_library=pickle_library,
        log_levels=worker_logs.log_levels(options),
        saved_main_session=saved_main_session,
    )
