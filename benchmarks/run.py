"""Run the benchmarks: every selected workload on every selected runner, side by side.

``python -m benchmarks.run`` (``make bench``) runs the full size (2 million elements with
10 000 keys, a 100 MB text, 2 million Nexmark events) in 3 rounds: each round runs every
(workload, runner) pair in its own subprocess (``benchmarks.worker``: a warm-up on tiny
inputs, then one timed run), runners interleaved, so that a failure or a memory blow-up only
loses that pair and a change in the (shared) machine's load hits every runner alike. The
figure is the median over the rounds. ``--quick`` is a smoke run: a twentieth of the data,
one run, one subprocess per runner running every workload (Spark starts once per runner).
This process samples the memory of each subprocess's whole process tree (driver, JVM,
Python workers; see ``benchmarks.memory``) and enforces a timeout.

Writes ``benchmarks/results/latest.md`` (the tables, also printed), ``latest.json`` (all
figures, rewritten after every subprocess) and ``latest.png`` (the chart); each
subprocess's log is under ``benchmarks/results/logs/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.data import text_file
from benchmarks.memory import TreeMemorySampler, peaks
from benchmarks.report import merge_rounds, write_report
from benchmarks.worker import RUNNERS, SIZES, WorkerResult, runner_code_hash
from benchmarks.workloads import DEFAULT_WORKLOADS, WARMUP, WORKLOADS

_LOGGER = logging.getLogger("benchmarks.run")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNNERS = (
    "ours",
    "direct",
    "direct-mp",
    "pyspark",
    "pyspark-arrow",
    "sql",
    "user-code",
)


def _environment() -> dict[str, str]:
    """Versions and machine, for the report."""
    import apache_beam
    import pyspark

    java = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False
    ).stderr.splitlines()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "beam_spark_runner"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    ).stdout.strip()
    with open("/proc/meminfo") as meminfo:
        total_kib = int(meminfo.readline().split()[1])
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "apache-beam": apache_beam.__version__,
        "pyspark": pyspark.__version__,
        "java": java[0] if java else "unknown",
        "runner commit": (commit or "unknown") + (" (+ uncommitted changes)" if dirty else ""),
        "runner code hash": runner_code_hash(),
        "cpus": str(os.cpu_count()),
        "memory": f"{total_kib / 1024 / 1024:.0f} GiB",
        "load average at start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def _run_subprocess(
    workloads: list[str],
    runner: str,
    size: str,
    runs: int,
    timeout: float,
    data_dir: Path,
    out_dir: Path,
    suffix: str = "",
    ours_conf: tuple[str, ...] = (),  # the ours-exp runner's Spark settings
    ours_args: tuple[str, ...] = (),  # the ours-exp runner's pipeline arguments
) -> list[dict[str, Any]]:
    """Runs one subprocess (one runner, one or more workloads) under the memory sampler."""
    name = f"{workloads[0]}-{runner}" if len(workloads) == 1 else f"all-{runner}"
    name += suffix
    log_path = out_dir / "logs" / f"{name}.log"
    result_path = out_dir / "logs" / f"{name}.json"
    result_path.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "benchmarks.worker",
        f"--workload={','.join(workloads)}",
        f"--runner={runner}",
        f"--size={size}",
        f"--runs={runs}",
        f"--data-dir={data_dir}",
        f"--out={result_path}",
    ]
    if runner == "ours-exp":
        command += [f"--ours-conf={entry}" for entry in ours_conf]
        command += [f"--ours-arg={entry}" for entry in ours_args]
    env = dict(os.environ)
    # Spark's Python workers must import this package and use this interpreter.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYSPARK_PYTHON"] = sys.executable
    started = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        with TreeMemorySampler(process.pid) as sampler:
            try:
                process.wait(timeout=timeout * len(workloads))
            except subprocess.TimeoutExpired:
                timed_out = True
                # The subprocess leads its own process group: the JVM and Python workers.
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    elapsed = time.monotonic() - started
    done = json.loads(result_path.read_text()) if result_path.exists() else []
    finished = {r["workload"] for r in done}
    for workload in workloads:
        if workload in finished:
            continue
        status = "timeout" if timed_out else "failed"
        error = (
            f"no result after {timeout * len(workloads):.0f} s"
            if timed_out
            else f"exit code {process.returncode}, see {log_path.relative_to(ROOT)}"
        )
        done.append(dataclasses.asdict(WorkerResult(workload, runner, status=status, error=error)))
    for result in done:
        window = (
            peaks(sampler.samples, result["started_at"], result["finished_at"])
            if result.get("finished_at")
            else peaks(sampler.samples)
        )
        result.update(dataclasses.asdict(window))
        result["shared_process"] = len(workloads) > 1
        result["process_seconds"] = elapsed
    return done


def _load_summary(loads: list[float]) -> str:
    """Minimum, median and maximum of the load averages sampled during the run."""
    if not loads:
        return ""
    return (
        f"min {min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f} "
        f"(1-minute load average after each of {len(loads)} subprocesses)"
    )


def main(argv: list[str] | None = None) -> int:
    """Command line entry: run, then print and write the report."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a twentieth of the data, one run each, one process per runner",
    )
    parser.add_argument(
        "--runs", type=int, help="timed runs (rounds) per pair (default 3, quick 1)"
    )
    parser.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"comma-separated, from {', '.join(WORKLOADS)} "
        f"(default {','.join(DEFAULT_WORKLOADS)})",
    )
    parser.add_argument(
        "--runners",
        default=",".join(DEFAULT_RUNNERS),
        help=f"comma-separated, from {', '.join(RUNNERS)} (default {','.join(DEFAULT_RUNNERS)})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help="seconds per (workload, runner) subprocess (default 1800, quick 600)",
    )
    parser.add_argument(
        "--schedule",
        choices=("rounds", "pair", "runner"),
        help="rounds (default): N rounds over every (workload, runner) pair, each pair a "
        "subprocess with a warm-up and one timed run, runners interleaved, so that a change "
        "in the machine's load hits every runner alike; pair: one subprocess per pair with "
        "N timed runs in a row; runner (default with --quick): one subprocess per runner "
        "running every workload (Spark starts once per runner, but memory peaks then include "
        "what earlier workloads left in the JVM)",
    )
    parser.add_argument("--output-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--data-dir", type=Path, help="generated inputs (default OUTPUT_DIR/data)")
    parser.add_argument(
        "--ours-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the ours-exp runner: SparkStructuredRunner with these "
        "settings, to compare side by side with ours (repeatable; e.g. "
        "spark.sql.execution.arrow.maxRecordsPerBatch=100000)",
    )
    parser.add_argument(
        "--ours-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="a pipeline argument for the ours-exp runner, to compare side by side with ours "
        "(repeatable; e.g. --ours-arg=--spark_native_combines=off)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    for name, known in (("workload", WORKLOADS), ("runner", RUNNERS)):
        chosen = workloads if name == "workload" else runners
        unknown = [c for c in chosen if c not in known]
        if unknown:
            parser.error(f"unknown {name}(s) {unknown}; choose from {', '.join(known)}")
    size = "quick" if args.quick else "full"
    runs = args.runs or (1 if args.quick else 3)
    timeout = args.timeout or (600.0 if args.quick else 1800.0)
    out_dir: Path = args.output_dir
    data_dir: Path = args.data_dir or out_dir / "data"
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)

    if "wordcount" in workloads:  # generate before timing anything
        text_file(data_dir, SIZES[size].text_mb)
        text_file(data_dir, WARMUP.text_mb)

    environment = _environment()
    sizes = SIZES[size]
    header: dict[str, Any] = {
        "size": size,
        "runs": runs,
        "sizes": dataclasses.asdict(sizes),
        "environment": environment,
    }
    schedule = args.schedule or ("runner" if args.quick else "rounds")
    header["schedule"] = schedule
    if args.ours_conf:
        environment["ours-exp --spark_conf"] = " ".join(args.ours_conf)
    if args.ours_arg:
        environment["ours-exp arguments"] = " ".join(args.ours_arg)
    if schedule == "rounds":
        groups = [
            ([w], r, 1, f"-round{n + 1}") for n in range(runs) for w in workloads for r in runners
        ]
    elif schedule == "pair":
        groups = [([w], r, runs, "") for w in workloads for r in runners]
    else:
        groups = [(workloads, r, runs, "") for r in runners]
    results: list[dict[str, Any]] = []
    loads: list[float] = []  # the 1-minute load average after each subprocess
    started = time.monotonic()
    for number, (group, runner, group_runs, suffix) in enumerate(groups, 1):
        _LOGGER.info(
            "[%d/%d] Running %s on %s (%s, %d run(s))",
            number,
            len(groups),
            ",".join(group),
            runner,
            size,
            group_runs,
        )
        for result in _run_subprocess(
            group,
            runner,
            size,
            group_runs,
            timeout,
            data_dir,
            out_dir,
            suffix,
            tuple(args.ours_conf),
            tuple(args.ours_arg),
        ):
            _LOGGER.info(
                "%s on %s: %s, median %s s, peak RSS %.0f MiB",
                result["workload"],
                runner,
                result["status"] + (f" ({result['error']})" if result.get("error") else ""),
                "-" if result.get("median_seconds") is None else f"{result['median_seconds']:.1f}",
                result["peak_rss_mib"],
            )
            results.append(result)
        loads.append(os.getloadavg()[0])
        merged = merge_rounds(results)
        header["load_average_1min"] = _load_summary(loads)
        (out_dir / "latest.json").write_text(json.dumps({**header, "results": merged}, indent=2))
    codes = sorted({r["runner_code"] for r in results if r.get("runner_code")})
    results = merge_rounds(results)
    # Report workload by workload, runners in the order asked.
    results.sort(key=lambda r: (workloads.index(r["workload"]), runners.index(r["runner"])))
    header["total_seconds"] = round(time.monotonic() - started)
    header["runner_codes"] = codes
    header["load_average_1min"] = _load_summary(loads)
    (out_dir / "latest.json").write_text(json.dumps({**header, "results": results}, indent=2))
    print(write_report(header, results, out_dir))  # noqa: T201 - this command's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
