"""``SparkRunnerOptions``: the pipeline options the runner adds to Beam's."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

SPARK_LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")
DEFAULT_MASTER = "local[*]"
# The default of --spark_batched_steps, for running whole suites with the path on or off.
BATCHED_STEPS_ENV = "BEAM_SPARK_BATCHED_STEPS"
# The default of --spark_native_combines, likewise.
NATIVE_COMBINES_ENV = "BEAM_SPARK_NATIVE_COMBINES"
# The default of --spark_class_archive, likewise.
CLASS_ARCHIVE_ENV = "BEAM_SPARK_CLASS_ARCHIVE"

# Spark master URLs the runner accepts, with an example of each for error messages.
_MASTER_FORMS: tuple[tuple[str, str], ...] = (
    (r"local(\[(\*|\d+)(,\s*\d+)?\])?", "local, local[4], local[*], local[4,2]"),
    (r"local-cluster\[\d+,\s*\d+,\s*\d+\]", "local-cluster[2,1,1024]"),
    (r"spark://\S+", "spark://host:7077"),
    (r"yarn", "yarn"),
    (r"k8s://\S+", "k8s://https://host:443"),
)


def _add_switch(parser: Any, flag: str, env: str, default: str, help_text: str) -> None:
    """An ``on``/``off`` option whose default the environment variable ``env`` may change."""
    parser.add_argument(
        flag, choices=("on", "off"), default=os.environ.get(env, default), help=help_text
    )


class SparkRunnerOptions(PipelineOptions):
    """Options of SparkStructuredRunner. All are optional."""

    @classmethod
    def _add_argparse_args(cls, parser):  # type: ignore[no-untyped-def]
        parser.add_argument(
            "--spark_master",
            default=None,
            help=(
                "Spark master URL. Default: an already active SparkSession's (spark-submit, "
                f"notebooks), else an embedded {DEFAULT_MASTER} session."
            ),
        )
        parser.add_argument(
            "--spark_conf",
            action="append",
            default=None,
            metavar="KEY=VALUE",
            help="A Spark configuration property for the session the runner creates. Repeatable.",
        )
        parser.add_argument(
            "--spark_app_name",
            default=None,
            help="Spark application name. Default: the pipeline's job name.",
        )
        parser.add_argument(
            "--spark_default_parallelism",
            type=int,
            default=None,
            help=(
                "Partitions for shuffles and reshuffles. Default: Spark's default parallelism "
                "(the number of cores for local masters)."
            ),
        )
        parser.add_argument(
            "--spark_log_level",
            default=None,
            help=(
                "Log level of a session the runner creates, one of "
                f"{', '.join(SPARK_LOG_LEVELS)}. Default: WARN."
            ),
        )
        parser.add_argument(
            "--spark_drain",
            action="store_true",
            default=False,
            help=(
                "Run as Beam's drain does: splittable DoFns truncate their restrictions "
                "(the SDF truncate step), so reads of unbounded sources stop where their "
                "truncation says. As FnApiRunner(is_drain=True). Default: off."
            ),
        )
        parser.add_argument(
            "--spark_state_backed_iterables",
            action="store_true",
            default=False,
            help=(
                "Hand GroupByKey values (and other iterables) to DoFns as state-backed "
                "iterables, decoded one value at a time as the DoFn iterates, instead of one "
                "decoded list per key: for groups too large to hold decoded in memory. As "
                "FnApiRunner(use_state_iterables=True). Default: off."
            ),
        )
        _add_switch(
            parser,
            "--spark_batched_steps",
            BATCHED_STEPS_ENV,
            "on",
            (
                "Run a fused stage's stateless steps (Map, FlatMap, Filter, MapTuple, "
                "FlatMapTuple, WindowInto with Beam's standard window functions, DoFns whose "
                "process takes only the element, timestamp or window) step by step over each "
                "batch instead of element by element through Beam's bundle processor; other "
                "steps keep the bundle processor. 'off' runs every step in the bundle "
                "processor, for A/B runs or as a way out. --spark_state_backed_iterables "
                "turns it off. Default: on, or the environment "
                f"variable {BATCHED_STEPS_ENV} (on or off)."
            ),
        )
        _add_switch(
            parser,
            "--spark_native_combines",
            NATIVE_COMBINES_ENV,
            "off",
            (
                "Batch runs: run a CombinePerKey (and so CombineGlobally, Count, Mean) whose "
                "CombineFn is Beam's sum, min, max, count or mean over integers or floats, "
                "under default windowing, as partial aggregates per bundle in Arrow merged by "
                "a Spark aggregation in the JVM, instead of Beam's lifted combine; other "
                "combines keep Beam's path. Default: off (Beam's lifted combine), which is "
                "faster today: the writers still encode every element (see "
                "docs/performance.md). Or the environment "
                f"variable {NATIVE_COMBINES_ENV} (on or off)."
            ),
        )
        _add_switch(
            parser,
            "--spark_class_archive",
            CLASS_ARCHIVE_ENV,
            "on",
            (
                "Start the driver JVM of a session the runner creates from a class archive "
                "(Java 13+ class data sharing) kept in ~/.cache/beam-spark-runner/jvm, one "
                "per Java, Spark install and class path, written by the first session's JVM "
                "when it exits: later sessions start in about half the time. 'off' starts "
                "the JVM without one. Default: on, or the environment variable "
                f"{CLASS_ARCHIVE_ENV} (on or off)."
            ),
        )
        parser.add_argument(
            "--spark_trigger_interval",
            type=float,
            default=None,
            help=(
                "Streaming runs: seconds between the starts of micro-batches. Default: 0, "
                "each micro-batch starts when the last has ended: the sources streamed today "
                "(TestStreams, bounded reads) always have their next batch ready, and a "
                "micro-batch costs a second or more even without data."
            ),
        )
        parser.add_argument(
            "--spark_checkpoint_location",
            default=None,
            help=(
                "Streaming runs: the query's checkpoint directory (offsets, commits, state). "
                "Default: a temporary directory, removed when the query ends."
            ),
        )


@dataclass(frozen=True)
class SparkSettings:
    """Validated Spark settings for one pipeline run."""

    master: str | None
    conf: dict[str, str]
    app_name: str
    default_parallelism: int | None
    log_level: str
    drain: bool = False
    state_backed_iterables: bool = False
    batched_steps: bool = True
    native_combines: bool = False
    class_archive: bool = True
    trigger_interval: float = 0.0
    checkpoint_location: str | None = None


def _validate_master(master: str) -> str:
    if master.startswith("mesos://"):
        raise ValueError(
            f"--spark_master={master!r}: Mesos masters are not supported (Spark 4 removed "
            "Mesos support; Spark 3.5 deprecated it). Run on a standalone (spark://host:7077), "
            "YARN or Kubernetes (k8s://...) master instead."
        )
    for pattern, _ in _MASTER_FORMS:
        if re.fullmatch(pattern, master):
            return master
    examples = "; ".join(example for _, example in _MASTER_FORMS)
    raise ValueError(
        f"--spark_master={master!r} is not a Spark master URL. Expected one of the forms: "
        f"{examples}. Leave it unset to use an active session or an embedded {DEFAULT_MASTER}."
    )


def _parse_conf(entries: list[str] | None) -> dict[str, str]:
    conf: dict[str, str] = {}
    for entry in entries or []:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"--spark_conf={entry!r} is not of the form KEY=VALUE, e.g. "
                "--spark_conf spark.executor.memory=4g."
            )
        conf[key.strip()] = value.strip()
    return conf


def batched_steps(settings: SparkSettings) -> bool:
    """Whether stages run their stateless steps batched.

    Not with ``--spark_state_backed_iterables``: that option is for elements too large to
    hold many of in memory, and the batched path holds a chunk of a step's outputs at once
    where Beam's path holds one (Beam's ``test_gbk_many_values`` checks that a FlatMap's
    generated values are consumed as they are made).
    """
    return settings.batched_steps and not settings.state_backed_iterables


def spark_settings(options: PipelineOptions) -> SparkSettings:
    """Reads and validates the runner's options; raises ValueError naming what is allowed."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    spark_options = options.view_as(SparkRunnerOptions)
    master = spark_options.spark_master
    if master is not None:
        master = _validate_master(master.strip())
    log_level = (spark_options.spark_log_level or "WARN").upper()
    if log_level not in SPARK_LOG_LEVELS:
        raise ValueError(
            f"--spark_log_level={spark_options.spark_log_level!r} is not a Spark log level. "
            f"Allowed values: {', '.join(SPARK_LOG_LEVELS)}."
        )
    parallelism = spark_options.spark_default_parallelism
    if parallelism is not None and parallelism < 1:
        raise ValueError(
            f"--spark_default_parallelism={parallelism} must be a positive number of partitions."
        )
    trigger_interval = spark_options.spark_trigger_interval
    if trigger_interval is not None and trigger_interval < 0:
        raise ValueError(
            f"--spark_trigger_interval={trigger_interval} must be zero or a positive number "
            "of seconds."
        )
    job_name = options.view_as(GoogleCloudOptions).job_name
    return SparkSettings(
        master=master,
        conf=_parse_conf(spark_options.spark_conf),
        app_name=spark_options.spark_app_name or job_name or "beam-spark-runner",
        default_parallelism=parallelism,
        log_level=log_level,
        drain=bool(spark_options.spark_drain),
        state_backed_iterables=bool(spark_options.spark_state_backed_iterables),
        batched_steps=spark_options.spark_batched_steps != "off",
        native_combines=spark_options.spark_native_combines == "on",
        class_archive=spark_options.spark_class_archive != "off",
        trigger_interval=trigger_interval or 0.0,
        checkpoint_location=spark_options.spark_checkpoint_location,
    )
