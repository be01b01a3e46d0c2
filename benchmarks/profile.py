"""Where SparkStructuredRunner spends its time on one workload.

``python -m benchmarks.profile --workload groupbykey [--size quick|full]``

After a warm-up run (which starts Spark), one measured run of the workload on
SparkStructuredRunner (local[2]) is broken down three ways:

1. **driver phases**: the runner's steps (``to_runner_api``, proto preparation, planning,
   session, the Spark job) timed by wrapping the runner's functions in this process;
2. **Spark stages**: from Spark's REST API, each stage's wall time, summed task time and
   CPU time, and records in and out of its shuffles;
3. **Python workers**: every task a Python worker runs is profiled with cProfile (through
   ``benchmarks.profiling_daemon``) and the profiles are merged. Self time is grouped by
   where the code lives (Beam's coders, Beam's bundle processor, PySpark, pyarrow, the
   runner, the workload's own functions), then the top functions are listed.

cProfile slows down code that makes many small Python calls more than the rest, so read
the worker profile as proportions, not absolute times.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import pstats
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.memory import tree_cpu_by_process
from benchmarks.worker import SIZES, _run_beam, prepare
from benchmarks.workloads import WARMUP, WORKLOADS

_LOGGER = logging.getLogger("benchmarks.profile")
ROOT = Path(__file__).resolve().parent.parent

# (label, substring of the code's file path), first match wins.
BUCKETS: tuple[tuple[str, str], ...] = (
    ("workload (user code)", "/benchmarks/"),
    ("Beam coders", "/apache_beam/coders/"),
    ("Beam bundle processor / operations", "/apache_beam/runners/worker/"),
    ("Beam runner internals (GroupingBuffer, triggers)", "/apache_beam/runners/"),
    ("Beam transforms / windowing / utils", "/apache_beam/"),
    ("beam_spark_runner", "/beam_spark_runner/"),
    ("PySpark worker / serializers", "/pyspark/"),
    ("pyarrow", "/pyarrow/"),
    ("pandas / numpy", "/pandas/"),
    ("pandas / numpy", "/numpy/"),
    ("Python stdlib", "/lib/python3"),
)


def _bucket(filename: str, function: str) -> str:
    for label, marker in BUCKETS:
        if marker in filename:
            return label
    if filename == "~":
        # Built-ins: attribute them by name where it is telling.
        if "socket" in function or "read" in function or "recv" in function:
            return "built-ins: I/O (socket reads/writes)"
        return "built-ins (C functions: encode/decode impls, list/bytes ops)"
    return "other"


@contextlib.contextmanager
def _timed_phases(phases: dict[str, float]) -> Iterator[None]:
    """Wraps the runner's driver steps to time them."""
    import apache_beam as beam

    import beam_spark_runner.run.batch as batch_module
    import beam_spark_runner.run.lifecycle as lifecycle_module
    import beam_spark_runner.run.prepare as prepare_module

    originals: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, label: str) -> None:
        function = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                phases[label] = phases.get(label, 0.0) + time.perf_counter() - start

        originals.append((owner, name, function))
        setattr(owner, name, timed)

    wrap(beam.Pipeline, "to_runner_api", "to_runner_api (pipeline proto)")
    wrap(prepare_module.bi, "prepare_pipeline_proto", "prepare proto")
    wrap(prepare_module, "build_plan", "plan (Beam fusion phases)")
    wrap(lifecycle_module, "obtain_session", "obtain Spark session")
    wrap(batch_module, "_run_job", "the run's job (translate + the Spark job)")
    try:
        yield
    finally:
        for owner, name, function in reversed(originals):
            setattr(owner, name, function)


def _rest(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - local Spark UI
        return json.loads(response.read())


def _spark_stages(since: set[int]) -> list[dict[str, Any]]:
    """Spark stages of the active application not in ``since``."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context  # noqa: SLF001
    if context is None or not context.uiWebUrl:
        return []
    base = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}"
    return [s for s in _rest(f"{base}/stages") if s["stageId"] not in since]


def _stage_ids() -> set[int]:
    return {s["stageId"] for s in _spark_stages(set())}


def _sql_python_metrics() -> list[str]:
    """Metrics of the Python nodes (mapInArrow, applyInArrow) of the last SQL execution."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context  # noqa: SLF001
    if context is None or not context.uiWebUrl:
        return []
    base = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}"
    executions = _rest(f"{base}/sql?details=true&planDescription=false&length=1000")
    if not executions:
        return []
    last = max(executions, key=lambda e: e["id"])
    lines = []
    for node in last.get("nodes", []):
        name = node.get("nodeName", "")
        if any(word in name for word in ("Python", "Arrow", "Exchange", "Sort", "Scan")):
            metrics = "; ".join(f"{m['name']}: {m['value']}" for m in node.get("metrics", []))
            lines.append(f"  {name}: {metrics}")
    return lines


def _print_stages(stages: list[dict[str, Any]], out: Callable[[str], None]) -> None:
    out("Spark stages (wall = submission to completion; task/CPU time summed over tasks):")
    out("  stage  tasks   wall s  task s   CPU s   shuffle read recs  shuffle write recs  out recs")
    for s in sorted(stages, key=lambda s: s["stageId"]):
        wall = ""
        if s.get("submissionTime") and s.get("completionTime"):
            from datetime import datetime

            fmt = "%Y-%m-%dT%H:%M:%S.%f%Z"
            start = datetime.strptime(s["submissionTime"], fmt)
            end = datetime.strptime(s["completionTime"], fmt)
            wall = f"{(end - start).total_seconds():7.1f}"
        out(
            f"  {s['stageId']:5d}  {s['numTasks']:5d}  {wall:>7}  "
            f"{s['executorRunTime'] / 1000:6.1f}  {s['executorCpuTime'] / 1e9:6.1f}   "
            f"{s.get('shuffleReadRecords', 0):17d}  {s.get('shuffleWriteRecords', 0):18d}  "
            f"{s.get('outputRecords', 0):8d}"
        )


def _print_worker_profile(directory: Path, top: int, out: Callable[[str], None]) -> None:
    files = sorted(str(p) for p in directory.glob("*.prof"))
    if not files:
        out("No worker profiles were written.")
        return
    stats = pstats.Stats(files[0])
    for file in files[1:]:
        stats.add(file)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    buckets: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, function), (_cc, _nc, tottime, _ct, _callers) in raw.items():
        buckets[_bucket(filename, function)] += tottime
        total += tottime
    out(f"Python workers: {len(files)} task profiles, {total:.1f} s of profiled self time")
    for label, seconds in sorted(buckets.items(), key=lambda kv: -kv[1]):
        out(f"  {seconds:7.1f} s  {100 * seconds / total:5.1f} %  {label}")
    for order in ("tottime", "cumulative"):
        buffer = io.StringIO()
        stats.stream = buffer  # type: ignore[attr-defined]
        stats.sort_stats(order).print_stats(top)
        out(f"Top {top} worker functions by {order}:")
        text = buffer.getvalue()
        out(text[text.find("   ncalls") :] if "   ncalls" in text else text)


def main(argv: list[str] | None = None) -> int:
    """Command line entry."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-worker-profile", action="store_true")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "benchmarks" / "results" / "data")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    logging.getLogger("apache_beam.typehints").setLevel(logging.WARNING)
    lines: list[str] = []
    out = lines.append

    profile_dir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    os.environ["BENCH_PROFILE_DIR"] = str(profile_dir)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    spark_args = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]
    if not args.no_worker_profile:
        spark_args.append("--spark_conf=spark.python.daemon.module=benchmarks.profiling_daemon")

    start = time.perf_counter()
    _run_beam(args.workload, prepare(WARMUP, args.data_dir, args.workload), spark_args)
    _LOGGER.info("Warm-up (starts Spark) took %.1f s", time.perf_counter() - start)
    for stale in profile_dir.glob("*.prof"):
        stale.unlink()
    before = _stage_ids()

    inputs = prepare(SIZES[args.size], args.data_dir, args.workload)
    phases: dict[str, float] = {}
    driver = cProfile.Profile()
    cpu_before = tree_cpu_by_process(os.getpid())
    with _timed_phases(phases):
        start = time.perf_counter()
        driver.enable()
        summary = _run_beam(args.workload, inputs, spark_args)
        driver.disable()
        wall = time.perf_counter() - start
    cpu_after = tree_cpu_by_process(os.getpid())
    time.sleep(2)  # let the worker profiles and Spark's listener catch up

    elements = WORKLOADS[args.workload].elements(inputs)
    out(
        f"{args.workload} ({args.size}, {elements:,} elements) on SparkStructuredRunner "
        f"local[2]: {wall:.1f} s wall, {summary.results} results"
    )
    out("CPU used during the run, by process (user + system seconds):")
    by_kind: dict[str, float] = defaultdict(float)
    for pid, (command, cpu) in cpu_after.items():
        used = cpu - cpu_before.get(pid, ("", 0.0))[1]
        kind = (
            "driver (Python)"
            if pid == os.getpid()
            else "JVM"
            if "java" in command.split(" ")[0]
            else "Python workers (daemon + forked workers)"
            if "daemon" in command
            else command[:60]
        )
        by_kind[kind] += used
    for kind, used in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        out(f"  {used:7.1f} s  {kind}")
    out(f"  {sum(by_kind.values()):7.1f} s  in all, over {wall:.1f} s of wall time")
    out("Driver phases:")
    for label, seconds in phases.items():
        out(f"  {seconds:7.2f} s  {label}")
    accounted = sum(phases.values())
    out(f"  {wall - accounted:7.2f} s  rest (pipeline construction, metrics, Beam overhead)")
    _print_stages(_spark_stages(before), out)
    sql_lines = _sql_python_metrics()
    if sql_lines:
        out("SQL metrics of the Python, shuffle and sort nodes (last execution):")
        lines.extend(sql_lines)
    buffer = io.StringIO()
    pstats.Stats(driver, stream=buffer).sort_stats("cumulative").print_stats(15)
    text = buffer.getvalue()
    out("Top driver functions by cumulative time:")
    out(text[text.find("   ncalls") :] if "   ncalls" in text else text)
    if not args.no_worker_profile:
        _print_worker_profile(profile_dir, args.top, out)
    shutil.rmtree(profile_dir, ignore_errors=True)
    print("\n".join(lines))  # noqa: T201 - the report is this command's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
