"""One benchmark subprocess: workloads on one runner, each a warm-up run, then N timed runs.

``python -m benchmarks.worker --workload W[,W2...] --runner R --size full --runs 3 --out r.json``

The warm-up runs the same workload on tiny inputs in the same process: the first one pays
for starting Spark (JVM, Python worker daemon) and importing Beam, as a long-lived driver
would. Its time is reported separately as the cold start. Each timed run is measured from
building the pipeline (or Spark job) to having its result summary. With several workloads
they run one after the other in this process (sharing the Spark session); the results file
is rewritten after each, so that a crash keeps the finished ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import peers, user_code
from benchmarks.data import text_file
from benchmarks.memory import tree_cpu_seconds
from benchmarks.report import SPARK_CORES
from benchmarks.workloads import FULL, NAMESPACE, QUICK, WARMUP, WORKLOADS, Inputs, Sizes, Summary

_LOGGER = logging.getLogger("benchmarks.worker")

SPARK_MASTER = f"local[{SPARK_CORES}]"
SIZES = {"full": FULL, "quick": QUICK}


class NotApplicable(Exception):
    """The workload has no version for this runner (e.g. not SQL-expressible)."""


def prepare(sizes: Sizes, data_dir: Path, workload: str) -> Inputs:
    """The inputs of ``workload`` at ``sizes``, generating files it needs."""
    if workload == "wordcount":
        path, words = text_file(data_dir, sizes.text_mb)
        return Inputs(sizes, path, words)
    return Inputs(sizes)


# --- Beam runners.


def _beam_summary(result: Any) -> Summary:
    from apache_beam.metrics import MetricsFilter

    counters = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    values = {counter.key.metric.name: int(counter.committed or 0) for counter in counters}
    return Summary(values.get("results", 0), values.get("checksum", 0))


def _run_beam(workload: str, inputs: Inputs, args: list[str], runner: Any = None) -> Summary:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, TypeOptions

    options = PipelineOptions(args)
    # As the Nexmark launcher does: query 3's Repeatedly(AfterCount) is "unsafe".
    options.view_as(TypeOptions).allow_unsafe_triggers = True
    pipeline = beam.Pipeline(runner=runner, options=options)
    WORKLOADS[workload].beam(pipeline, inputs)
    result = pipeline.run()
    result.wait_until_finish()
    return _beam_summary(result)


# The ``--spark_conf KEY=VALUE`` settings of the ``ours-exp`` runner (``--ours-conf``): an
# experiment with the runner's Spark settings, run side by side with ``ours``.
OURS_CONF: list[str] = []
# Pipeline arguments of the ``ours-exp`` runner (``--ours-arg``), e.g. a runner option off.
OURS_EXTRA_ARGS: list[str] = []
_OURS_ARGS = ["--runner=SparkStructuredRunner", f"--spark_master={SPARK_MASTER}"]


def run_ours(workload: str, inputs: Inputs) -> Summary:
    """SparkStructuredRunner on local[2]."""
    return _run_beam(workload, inputs, _OURS_ARGS)


def run_ours_experiment(workload: str, inputs: Inputs) -> Summary:
    """SparkStructuredRunner on local[2] with the ``--ours-conf`` and ``--ours-arg`` settings."""
    conf = [f"--spark_conf={c}" for c in OURS_CONF]
    return _run_beam(workload, inputs, _OURS_ARGS + conf + OURS_EXTRA_ARGS)


def run_direct(workload: str, inputs: Inputs) -> Summary:
    """Beam's FnApiRunner (what DirectRunner runs batch pipelines on), in process."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return _run_beam(workload, inputs, [], runner=FnApiRunner())


def run_direct_multiprocess(workload: str, inputs: Inputs) -> Summary:
    """FnApiRunner with two SDK worker processes (``--direct_num_workers=2``)."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    args = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    return _run_beam(workload, inputs, args, runner=FnApiRunner())


# --- Hand-written Spark.

_SPARK: Any = None


def spark_session() -> Any:
    """A local[2] session with every setting SparkStructuredRunner's own has (``peers``)."""
    global _SPARK
    if _SPARK is None:
        _SPARK = peers.start_session(SPARK_MASTER, "benchmarks", peers.runner_conf(SPARK_MASTER))
    return _SPARK


def run_pyspark(workload: str, inputs: Inputs) -> Summary:
    """The workload hand-written as Python functions over RDDs."""
    return WORKLOADS[workload].pyspark(spark_session(), inputs)


def run_pyspark_arrow(workload: str, inputs: Inputs) -> Summary:
    """The workload hand-written with ``mapInArrow`` (``benchmarks.arrow``)."""
    return WORKLOADS[workload].pyspark_arrow(spark_session(), inputs)


def run_sql(workload: str, inputs: Inputs) -> Summary:
    """The workload in native Spark SQL, where it is SQL-expressible."""
    summary = WORKLOADS[workload].sql(spark_session(), inputs)
    if summary is None:
        raise NotApplicable(f"{workload} is not SQL-expressible")
    return summary


def run_user_code(workload: str, inputs: Inputs) -> Summary:
    """The workload's own Python per element in a plain loop, no runner (``user_code``)."""
    return user_code.run(workload, inputs)


RUNNERS: dict[str, Callable[[str, Inputs], Summary]] = {
    "ours": run_ours,
    "direct": run_direct,
    "pyspark": run_pyspark,
    "pyspark-arrow": run_pyspark_arrow,
    "sql": run_sql,
    "direct-mp": run_direct_multiprocess,
    "ours-exp": run_ours_experiment,
    "user-code": run_user_code,
}


@dataclasses.dataclass
class WorkerResult:
    """What one subprocess reports (the parent adds memory figures)."""

    workload: str
    runner: str
    status: str = "ok"  # ok | failed | unsupported | n/a | timeout
    error: str = ""
    warmup_seconds: float | None = None
    seconds: list[float] = dataclasses.field(default_factory=list)
    median_seconds: float | None = None
    # CPU (user + system) of the whole process tree (driver, JVM, Python workers) per run.
    cpu_seconds: list[float] = dataclasses.field(default_factory=list)
    median_cpu_seconds: float | None = None
    # Wall-clock (time.time()) bounds of this workload's runs, warm-up included: the
    # parent takes the memory peak of this window.
    started_at: float = 0.0
    finished_at: float = 0.0
    # Which runner code ran: a hash of beam_spark_runner's sources when this process started
    # (others may change the checkout during a long run).
    runner_code: str = ""
    elements: int = 0
    results: int | None = None
    checksum: int | None = None


def runner_code_hash() -> str:
    """A short hash of the runner package's Python sources, as imported by this process."""
    import beam_spark_runner

    root = Path(beam_spark_runner.__file__).parent
    digest = hashlib.sha1(usedforsecurity=False)
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


_RUNNER_CODE = runner_code_hash()


def _classify(error: BaseException) -> str:
    if isinstance(error, NotApplicable | NotImplementedError):
        # The runner's UnsupportedFeatureError is a NotImplementedError too.
        from beam_spark_runner.errors import UnsupportedFeatureError

        return "unsupported" if isinstance(error, UnsupportedFeatureError) else "n/a"
    return "failed"


def run(workload: str, runner: str, sizes: Sizes, runs: int, data_dir: Path) -> WorkerResult:
    """Warm-up, then ``runs`` timed runs; failures are reported, not raised."""
    result = WorkerResult(workload, runner, started_at=time.time(), runner_code=_RUNNER_CODE)
    function = RUNNERS[runner]
    try:
        warm_inputs = prepare(WARMUP, data_dir, workload)
        inputs = prepare(sizes, data_dir, workload)
        result.elements = WORKLOADS[workload].elements(inputs)
        start = time.perf_counter()
        function(workload, warm_inputs)
        result.warmup_seconds = time.perf_counter() - start
        _LOGGER.info("%s on %s: warm-up %.1f s", workload, runner, result.warmup_seconds)
        for index in range(runs):
            cpu_start = tree_cpu_seconds(os.getpid())
            start = time.perf_counter()
            summary = function(workload, inputs)
            elapsed = time.perf_counter() - start
            result.seconds.append(elapsed)
            result.cpu_seconds.append(tree_cpu_seconds(os.getpid()) - cpu_start)
            _LOGGER.info(
                "%s on %s: run %d/%d %.1f s (%.1f CPU s), %d results, checksum %d",
                workload,
                runner,
                index + 1,
                runs,
                elapsed,
                result.cpu_seconds[-1],
                summary.results,
                summary.checksum,
            )
            if result.results is not None and (result.results, result.checksum) != (
                summary.results,
                summary.checksum,
            ):
                raise RuntimeError(
                    f"run {index + 1} gave {summary}, earlier runs "
                    f"{Summary(result.results, result.checksum or 0)}"
                )
            result.results, result.checksum = summary.results, summary.checksum
        result.median_seconds = statistics.median(result.seconds)
        result.median_cpu_seconds = statistics.median(result.cpu_seconds)
    except Exception as error:  # noqa: BLE001 - reported to the parent as a status
        result.status = _classify(error)
        lines = [line for line in str(error).strip().splitlines() if line.strip()]
        first = lines[0] if lines else type(error).__name__
        result.error = f"{type(error).__name__}: {first}"[:500]
        _LOGGER.error("%s on %s: %s\n%s", workload, runner, result.status, traceback.format_exc())
    result.finished_at = time.time()
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line entry of one benchmark subprocess."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--workload", required=True, help=f"comma-separated, from {', '.join(WORKLOADS)}"
    )
    parser.add_argument("--runner", required=True, choices=sorted(RUNNERS))
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--ours-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the ours-exp runner's session (repeatable)",
    )
    parser.add_argument(
        "--ours-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a pipeline argument for the ours-exp runner (repeatable)",
    )
    args = parser.parse_args(argv)
    OURS_CONF[:] = args.ours_conf
    OURS_EXTRA_ARGS[:] = args.ours_arg
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    # Beam notes every string annotation (this package uses postponed annotations).
    logging.getLogger("apache_beam.typehints").setLevel(logging.WARNING)
    workloads = [w for w in args.workload.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}")
    results: list[dict[str, Any]] = []
    for workload in workloads:
        result = run(workload, args.runner, SIZES[args.size], args.runs, args.data_dir)
        results.append(dataclasses.asdict(result))
        args.out.write_text(json.dumps(results, indent=2))
    if _SPARK is not None:
        _SPARK.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
