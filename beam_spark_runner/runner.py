"""SparkStructuredRunner: plan, check, translate and run a Beam pipeline on Spark."""

from __future__ import annotations

import logging
import time
from typing import Any

from apache_beam.options import pipeline_options
from apache_beam.options.value_provider import RuntimeValueProvider
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.runner import PipelineRunner

from beam_spark_runner import _startup_hook
from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.execution import beam_globals
from beam_spark_runner.io.match_continuously import start_match_continuously_now
from beam_spark_runner.monitoring import run_summary
from beam_spark_runner.options import spark_settings
from beam_spark_runner.planning.capabilities import unbounded_source
from beam_spark_runner.result import SparkPipelineResult
from beam_spark_runner.rewrites.native_create import NativeCreateOverride
from beam_spark_runner.rewrites.streaming_in_batch import BATCH_RULE, prepare_batch_run
from beam_spark_runner.run.batch import run_batch
from beam_spark_runner.run.prepare import prepare

_LOGGER = logging.getLogger(__name__)

# Importing the runner directly also makes the short name resolvable.
_startup_hook.install()


_BATCH_MODE = "Batch mode: every PCollection is bounded and --streaming is not set"


def wants_streaming(options: pipeline_options.PipelineOptions, proto: Any) -> bool:
    """``--streaming``, or an unbounded PCollection (as Dataflow decides); logs which."""
    if options.view_as(pipeline_options.StandardOptions).streaming:
        _LOGGER.info("Streaming mode: --streaming is set")
        return True
    source = unbounded_source(proto)
    if source is not None:
        _LOGGER.info("Streaming mode: the pipeline has an unbounded source, %s", source)
        return True
    _LOGGER.info(_BATCH_MODE)
    return False


def may_stream(options: pipeline_options.PipelineOptions, pipeline: Any) -> bool:
    """``--streaming``, or an unbounded PCollection in the Python graph (no proto needed)."""
    if options.view_as(pipeline_options.StandardOptions).streaming:
        return True
    unbounded = _UnboundedFinder()
    pipeline.visit(unbounded)
    return unbounded.found


class _UnboundedFinder(PipelineVisitor):  # type: ignore[misc]
    """Finds whether any transform of a pipeline outputs an unbounded PCollection."""

    def __init__(self) -> None:
        self.found = False

    def visit_transform(self, applied: Any) -> None:
        self.found = self.found or any(
            not getattr(output, "is_bounded", True) for output in applied.outputs.values()
        )

    def enter_composite_transform(self, applied: Any) -> None:
        self.visit_transform(applied)


def _why_streaming(proto: Any) -> str:
    source = unbounded_source(proto)
    if source is not None:
        return f"transform {source} outputs an unbounded PCollection"
    return "--streaming is set"


def _refusal(
    proto: Any, refused: UnsupportedFeatureError, not_proven: UnsupportedFeatureError
) -> UnsupportedFeatureError:
    """The error for a streaming pipeline that can neither stream nor run in batch."""
    return UnsupportedFeatureError(
        f"The pipeline streams ({_why_streaming(proto)}), and SparkStructuredRunner cannot "
        f"stream it: {refused} Nor is a batch run proven to give its streaming result: "
        f"{not_proven} {BATCH_RULE} To run it, do what the first reason says, so that it "
        "streams, or change what the second names, so that a batch run is proven."
    )


class SparkStructuredRunner(PipelineRunner):
    """Runs Beam Python pipelines on Apache Spark through PySpark.

    User code runs in Spark's Python workers through Beam's own bundle processor, so
    DoFns, combiners, windowing and side inputs keep Beam's semantics. Use it with
    ``--runner=SparkStructuredRunner``; see :class:`~beam_spark_runner.options.SparkRunnerOptions`.
    """

    # ``io.ReadFromSparkStream`` expands to its runner primitive in this runner's pipelines.
    runs_spark_streams = True

    def __init__(self) -> None:
        super().__init__()
        # Each options class parsed once while this runner's pipeline is constructed.
        self._option_views = bi.OptionViews()

    def apply(self, transform: Any, input: Any, options: Any) -> Any:  # noqa: A002 - Beam's name
        """Applies ``transform`` as Beam does, each options class parsed once per pipeline."""
        with bi.option_views(self._option_views):
            return super().apply(transform, input, options)

    def run_pipeline(
        self, pipeline: Any, options: pipeline_options.PipelineOptions
    ) -> SparkPipelineResult:
        """Translates ``pipeline`` and runs it to completion on Spark."""
        try:
            # Beam's DoFn inspection remembered while this run builds, plans and starts.
            with bi.signature_memos():
                return self._run_pipeline(pipeline, options)
        finally:
            # The next pipeline on this runner parses its options anew (defaults may change).
            self._option_views = bi.OptionViews()

    def _run_pipeline(
        self, pipeline: Any, options: pipeline_options.PipelineOptions
    ) -> SparkPipelineResult:
        started_wall, started = run_summary.now()
        RuntimeValueProvider.set_runtime_options({})
        # The pipeline's pickler before to_runner_api pickles its DoFns: another pipeline
        # constructed since this one may have set Beam's process-wide pickler.
        beam_globals.apply(beam_globals.pickle_library(options))
        # A MatchContinuously without a start time would start when Beam's fileio was
        # imported, which may be long ago in this process, and poll past its stop time.
        start_match_continuously_now(pipeline)
        debug = options.view_as(pipeline_options.DebugOptions)
        experiments = debug.experiments or []
        if "beam_fn_api" not in experiments:
            experiments.append("beam_fn_api")
        debug.experiments = experiments
        settings = spark_settings(options)
        default_environment = bi.default_environment()
        key_coders = bi.group_by_key_input_visitor(
            not options.view_as(pipeline_options.TypeOptions).allow_non_deterministic_key_coders
        )
        pipeline.visit(key_coders)
        # The proto only when the pipeline may stream: building it is ~0.1 s of a small
        # batch pipeline's fixed cost, and the batch path builds its own after its overrides.
        proto = None
        if may_stream(options, pipeline):
            proto = pipeline.to_runner_api(default_environment=default_environment)
        else:
            _LOGGER.info(_BATCH_MODE)
        if proto is not None and wants_streaming(options, proto):
            try:
                return self.run_streaming(proto, options, settings)
            except UnsupportedFeatureError as refused:
                # In batch only where that is proven to give the streaming result.
                try:
                    checked = prepare_batch_run(pipeline)
                except UnsupportedFeatureError as not_proven:
                    raise _refusal(proto, refused, not_proven) from refused
                _LOGGER.warning(
                    "Running the streaming pipeline in batch. It cannot stream here: %s "
                    "Checked that its batch run is one of its streaming runs: %s.",
                    refused,
                    checked,
                )
        # A Create that Beam would reshuffle becomes rows the runner spreads itself,
        # without a Spark job of its own.
        pipeline.replace_all([NativeCreateOverride()])
        pipeline.visit(key_coders)
        proto = pipeline.to_runner_api(default_environment=default_environment)
        result = self.run_batch(proto, options, settings)
        # After the run: reading the Python transforms before to_runner_api changed the
        # element types Beam checks there (tests/rewrites/test_batch_test_stream.py).
        run_summary.log_summary(
            settings.app_name,
            started_wall,
            time.monotonic() - started,
            run_summary.output_patterns(pipeline),
        )
        return result

    def run_streaming(self, proto: Any, options: Any, settings: Any = None) -> SparkPipelineResult:
        """Starts a pipeline proto as one Spark streaming query; returns it RUNNING.

        Every check happens before Spark starts; an unsupported pipeline raises
        ``UnsupportedFeatureError``.
        """
        settings = settings or spark_settings(options)
        prepared = prepare(proto, options, settings, streaming=True)
        # Past prepare's version check: the streaming query's modules need PySpark 4.0+.
        from beam_spark_runner.run.streaming import run_streaming

        return run_streaming(prepared)

    def run_proto(self, proto: Any, options: Any, settings: Any = None) -> SparkPipelineResult:
        """Runs a Beam pipeline proto; every check happens before Spark starts.

        A streaming one (``--streaming``, or an unbounded PCollection) runs as a streaming
        query (see :meth:`run_streaming`), or is refused: whether a batch run gives its
        streaming result is checked on the Python pipeline only (:meth:`run_pipeline`).
        """
        settings = settings or spark_settings(options)
        if wants_streaming(options, proto):
            try:
                return self.run_streaming(proto, options, settings)
            except UnsupportedFeatureError as refused:
                not_proven = UnsupportedFeatureError(
                    "the runner proves that on the Python pipeline only; run it with "
                    "Pipeline.run()."
                )
                raise _refusal(proto, refused, not_proven) from refused
        return self.run_batch(proto, options, settings)

    def run_batch(self, proto: Any, options: Any, settings: Any) -> SparkPipelineResult:
        """Runs a pipeline proto in batch, to completion."""
        return run_batch(prepare(proto, options, settings, streaming=False))
