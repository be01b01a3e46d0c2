"""The benchmark report: a markdown table, ratios against the baselines, and a PNG chart.

``python -m benchmarks.run`` writes it at the end of a run. ``python -m benchmarks.report
[--output-dir DIR]`` writes it again from ``DIR/latest.json`` (``latest.md`` and
``latest.png``), e.g. from the partial results of a run that was stopped; with ``--merge
DIR1 DIR2 ...`` it first merges those runs' ``latest.json`` (more rounds of the same size,
run later) into ``DIR/latest.json``, medians over all their rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_LOGGER = logging.getLogger(__name__)

RUNNER_LABELS = {
    "ours": "SparkStructuredRunner local[2]",
    "direct": "DirectRunner (FnApiRunner)",
    "direct-mp": "FnApiRunner, 2 worker processes",
    "ours-exp": "SparkStructuredRunner local[2], --ours-conf and --ours-arg settings",
    "pyspark": "hand-written PySpark over RDDs (floor)",
    "pyspark-arrow": "hand-written PySpark with mapInArrow (floor)",
    "sql": "Spark SQL (ceiling)",
    "user-code": "the user code alone in one process, no runner (CPU floor)",
}
RUNNER_COLORS = {
    "ours": "#d62728",
    "direct": "#1f77b4",
    "direct-mp": "#17becf",
    "ours-exp": "#9467bd",
    "pyspark": "#ff7f0e",
    "pyspark-arrow": "#8c564b",
    "sql": "#2ca02c",
    "user-code": "#7f7f7f",
}

Result = dict[str, Any]

# The cores of the local[N] sessions ours and the Spark baselines run on (worker.SPARK_MASTER).
SPARK_CORES = 2
# The targets: ours' wall time within this many times the faster hand-written PySpark line's,
# ours' CPU time at most this many times the user code's own run alone (``benchmarks.user_code``).
WALL_TARGET = 1.3
CPU_TARGET = 1.25


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _short(result: Result, limit: int = 90) -> str:
    """The error's first sentence, cut to ``limit`` characters, safe in a table cell."""
    error = str(result.get("error", "")).replace("|", "/").replace("\n", " ")
    first = error.split(". ")[0]
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _rate(result: Result) -> str:
    median = result.get("median_seconds")
    if not median or not result.get("elements"):
        return ""
    rate = result["elements"] / median
    return f"{rate / 1e6:.2f} M" if rate >= 1e6 else f"{rate / 1e3:.0f} k"


def consistency(results: Sequence[Result]) -> dict[tuple[str, str], str]:
    """Per (workload, runner): whether its output summary agrees with the other runners.

    The reference is the (results, checksum) pair most runners of the workload agree on;
    where no pair has a strict majority over the others (two runners against two), every
    runner's verdict is ``DIFFERENT (no majority)``: the table must not pick a side.
    """
    verdicts: dict[tuple[str, str], str] = {}
    by_workload: dict[str, list[Result]] = {}
    for result in results:
        by_workload.setdefault(result["workload"], []).append(result)
    for workload, group in by_workload.items():
        ok = [r for r in group if r["status"] == "ok"]
        votes = Counter((r["results"], r["checksum"]) for r in ok).most_common()
        reference = votes[0][0] if votes else None
        tied = len(votes) > 1 and votes[0][1] == votes[1][1]
        for result in group:
            if result["status"] != "ok":
                verdict = ""
            elif len(ok) < 2:
                verdict = "(alone)"
            elif tied:
                verdict = "DIFFERENT (no majority)"
            elif (result["results"], result["checksum"]) == reference:
                verdict = "same"
            else:
                verdict = "DIFFERENT"
            verdicts[(workload, result["runner"])] = verdict
    return verdicts


def markdown_table(results: Sequence[Result]) -> str:
    """One row per (workload, runner)."""
    verdicts = consistency(results)
    lines = [
        "| workload | runner | status | median s | runs s | elements/s | CPU s "
        "| peak RSS MiB | peak PSS MiB | cold start s | results | output |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        runs = ", ".join(f"{s:.1f}" for s in r.get("seconds", []))
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {_short(r)}"
        lines.append(
            f"| {r['workload']} | {r['runner']} | {status} | {_seconds(r.get('median_seconds'))} "
            f"| {runs} | {_rate(r)} | {_seconds(r.get('median_cpu_seconds'))} "
            f"| {r.get('peak_rss_mib', 0):.0f} "
            f"| {r.get('peak_pss_mib', 0):.0f} | {_seconds(r.get('warmup_seconds'))} "
            f"| {'' if r.get('results') is None else r['results']} "
            f"| {verdicts.get((r['workload'], r['runner']), '')} |"
        )
    return "\n".join(lines)


def _median(
    results: Iterable[Result], workload: str, runner: str, field: str = "median_seconds"
) -> float | None:
    for r in results:
        if r["workload"] == workload and r["runner"] == runner and r["status"] == "ok":
            return r.get(field)
    return None


def _same_output(results: Iterable[Result], workload: str, one: str, other: str) -> bool:
    summaries = {
        r["runner"]: (r.get("results"), r.get("checksum"))
        for r in results
        if r["workload"] == workload and r["runner"] in (one, other)
    }
    return summaries.get(one) == summaries.get(other)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else ""


def _faster_pyspark(results: Sequence[Result], workload: str) -> tuple[str, float | None]:
    """The faster hand-written PySpark line of ``workload`` (RDDs or ``mapInArrow``), its time."""
    times = {line: _median(results, workload, line) for line in ("pyspark", "pyspark-arrow")}
    ran = {line: t for line, t in times.items() if t}
    if not ran:
        return "pyspark", None
    line = min(ran, key=lambda name: ran[name])
    return line, ran[line]


def ratio_table(results: Sequence[Result]) -> str:
    """Per workload: our median time against DirectRunner, the PySpark floor and SQL.

    The PySpark floor is the faster of the two hand-written lines (RDDs, ``mapInArrow``;
    ``(Arrow)`` marks the second); DirectRunner's two-process time and CPU stand beside
    its one-thread figures.

    ``DirectRunner / ours`` above 1 means ours is faster; ``ours / PySpark`` at most
    ``WALL_TARGET`` meets the target. The same ratios of CPU time (the whole process tree's)
    follow: on a loaded machine they vary less than wall time. Where ours and the baseline
    produced different output, the verdict says so instead of yes or no: the two did not do
    the same work.

    The last column bounds what any runner that executes Beam's per-element machinery (as
    DirectRunner does, and ours through the same bundle processor) can reach against the
    PySpark floor: DirectRunner's CPU time spread over the cores of ``local[N]`` with no
    other cost, over PySpark's wall time. Above ``WALL_TARGET``, no such runner meets the
    target on that workload unless it does less per element than DirectRunner does.
    """
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    lines = [
        "| workload | ours s | DirectRunner s | DirectRunner / ours | Direct 2 proc s "
        "| PySpark s | ours / PySpark | SQL s | ours / SQL | faster than Direct? "
        f"| within {WALL_TARGET:g}x of PySpark? | CPU: Direct / ours | CPU: Direct 2 proc / ours "
        f"| CPU: ours / PySpark | Direct CPU / {SPARK_CORES} cores / PySpark |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for workload in workloads:
        ours = _median(results, workload, "ours")
        direct = _median(results, workload, "direct")
        direct_mp = _median(results, workload, "direct-mp")
        line, floor = _faster_pyspark(results, workload)
        sql = _median(results, workload, "sql")
        cpu = {
            runner: _median(results, workload, runner, "median_cpu_seconds")
            for runner in ("ours", "direct", "direct-mp", line)
        }
        faster = "" if not (ours and direct) else ("yes" if ours < direct else "no")
        within = "" if not (ours and floor) else ("yes" if ours <= WALL_TARGET * floor else "no")
        if faster and not _same_output(results, workload, "ours", "direct"):
            faster += " (outputs differ)"
        if within and not _same_output(results, workload, "ours", line):
            within += " (outputs differ)"
        marker = " (Arrow)" if floor and line == "pyspark-arrow" else ""
        lines.append(
            f"| {workload} | {_seconds(ours)} | {_seconds(direct)} | {_ratio(direct, ours)} "
            f"| {_seconds(direct_mp)} | {_seconds(floor)}{marker} | {_ratio(ours, floor)} "
            f"| {_seconds(sql)} | {_ratio(ours, sql)} | {faster} | {within} "
            f"| {_ratio(cpu['direct'], cpu['ours'])} | {_ratio(cpu['direct-mp'], cpu['ours'])} "
            f"| {_ratio(cpu['ours'], cpu[line])} "
            f"| {_ratio(cpu['direct'] and cpu['direct'] / SPARK_CORES, floor)} |"
        )
    return "\n".join(lines)


def cpu_table(results: Sequence[Result]) -> str:
    """Per workload: the Beam runners' CPU time against the user code's own run alone.

    The user code alone (``benchmarks.user_code``) is the workload's generator, DoFns,
    CombineFns and output fingerprints called in a plain loop in one process, no runner: the
    least CPU any runner running Python per element can spend. Ours' CPU is its whole
    process tree's (driver, JVM, Python workers), as in the other tables; the target is at
    most ``CPU_TARGET`` times the user code's. DirectRunner's two-process and one-thread
    CPU stand beside it. Where ours' output differs from the user code's, the verdict says
    so: the two did not do the same work.
    """
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    lines = [
        "| workload | user code CPU s | ours CPU s | ours / user code "
        f"| within {CPU_TARGET:g}x of the user code? | Direct 2 proc CPU s "
        "| Direct 2 proc / user code | Direct CPU s | Direct / user code |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for workload in workloads:
        cpu = {
            runner: _median(results, workload, runner, "median_cpu_seconds")
            for runner in ("user-code", "ours", "direct-mp", "direct")
        }
        floor, ours = cpu["user-code"], cpu["ours"]
        within = "" if not (ours and floor) else ("yes" if ours <= CPU_TARGET * floor else "no")
        if within and not _same_output(results, workload, "ours", "user-code"):
            within += " (outputs differ)"
        seconds = {runner: "" if value is None else f"{value:.2f}" for runner, value in cpu.items()}
        lines.append(
            f"| {workload} | {seconds['user-code']} | {seconds['ours']} | {_ratio(ours, floor)} "
            f"| {within} | {seconds['direct-mp']} | {_ratio(cpu['direct-mp'], floor)} "
            f"| {seconds['direct']} | {_ratio(cpu['direct'], floor)} |"
        )
    return "\n".join(lines)


def chart(results: Sequence[Result], path: Path, title: str) -> bool:
    """Grouped bars per workload and runner: median wall time, median CPU time, peak RSS.

    Returns False (and draws nothing) without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _LOGGER.warning("matplotlib is not installed: no chart (pip install matplotlib)")
        return False
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    runners = list(dict.fromkeys(r["runner"] for r in results))
    figure, axes = plt.subplots(3, 1, figsize=(max(8, 1.6 * len(workloads)), 11), sharex=True)
    width = 0.8 / max(1, len(runners))
    for index, runner in enumerate(runners):
        times, cpu, memory, positions = [], [], [], []
        for position, workload in enumerate(workloads):
            x = position + (index - (len(runners) - 1) / 2) * width
            for r in results:
                if r["workload"] != workload or r["runner"] != runner:
                    continue
                if r["status"] == "ok":
                    positions.append(x)
                    times.append(r["median_seconds"])
                    cpu.append(r.get("median_cpu_seconds") or 0)
                    memory.append(r.get("peak_rss_mib", 0))
                else:  # say why the bar is missing
                    axes[0].annotate(
                        r["status"],
                        (x, 0),
                        xycoords=("data", "axes fraction"),
                        xytext=(0, 4),
                        textcoords="offset points",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize="x-small",
                        color=RUNNER_COLORS.get(runner, "black"),
                    )
        label = RUNNER_LABELS.get(runner, runner)
        color = RUNNER_COLORS.get(runner)
        axes[0].bar(positions, times, width, label=label, color=color)
        axes[1].bar(positions, cpu, width, label=label, color=color)
        axes[2].bar(positions, memory, width, label=label, color=color)
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    for axis in axes[:2]:
        axis.set_yscale("log")
        axis.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.yaxis.set_major_formatter(ScalarFormatter())
        axis.yaxis.set_minor_formatter(NullFormatter())
    axes[0].set_ylabel("median wall time, s (log)")
    axes[1].set_ylabel("CPU s of process tree (log)")
    figure.suptitle(title)
    axes[0].legend(
        fontsize="small", ncol=len(runners), loc="lower center", bbox_to_anchor=(0.5, 1.0)
    )
    axes[2].set_ylabel("peak RSS of process tree, MiB")
    axes[2].set_xticks(range(len(workloads)))
    axes[2].set_xticklabels(workloads, rotation=20, ha="right")
    for axis in axes:
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def merge_rounds(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per (workload, runner): the timed runs of all its rounds together.

    The median is taken over all timed runs, the cold start is the median of the warm-ups,
    memory peaks are the largest of any round. A pair that failed in any round reports that
    round's failure; outputs that differ between rounds are a failure too.
    """
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    warmups: dict[tuple[str, str], list[float]] = {}
    for result in results:
        key = (result["workload"], result["runner"])
        if result.get("warmup_seconds") is not None:
            warmups.setdefault(key, []).append(result["warmup_seconds"])
        if key not in merged:
            merged[key] = dict(
                result,
                seconds=list(result.get("seconds", [])),
                cpu_seconds=list(result.get("cpu_seconds", [])),
            )
            continue
        into = merged[key]
        if into["status"] != "ok":
            continue
        if result["status"] != "ok":
            into.update(status=result["status"], error=result.get("error", ""))
            continue
        if (result["results"], result["checksum"]) != (into["results"], into["checksum"]):
            into.update(status="failed", error="outputs differ between rounds")
            continue
        into["seconds"].extend(result["seconds"])
        into["cpu_seconds"].extend(result.get("cpu_seconds", []))
        for field in ("peak_rss_mib", "peak_pss_mib", "peak_processes"):
            into[field] = max(into.get(field, 0), result.get(field, 0))
    for key, into in merged.items():
        seconds = into.get("seconds") or []
        cpu = into.get("cpu_seconds") or []
        ok = into["status"] == "ok"
        into["median_seconds"] = statistics.median(seconds) if ok and seconds else None
        into["median_cpu_seconds"] = statistics.median(cpu) if ok and cpu else None
        if warmups.get(key):
            into["warmup_seconds"] = statistics.median(warmups[key])
    return list(merged.values())


def write_report(header: dict[str, Any], results: Sequence[Result], out_dir: Path) -> str:
    """Writes ``latest.md`` and ``latest.png`` into ``out_dir``; returns the markdown.

    ``header`` is ``latest.json`` without its results: size, runs, sizes, environment and,
    once the run is over, its total seconds and the runner code hashes seen.
    """
    sizes = header["sizes"]
    title = (
        f"{header['size']} size: {sizes['elements']:,} elements / {sizes['text_mb']:g} MB "
        f"text / {sizes['events']:,} events; median of {header['runs']}"
    )
    runners = list(dict.fromkeys(r["runner"] for r in results))
    legend = "\n".join(f"* `{name}`: {RUNNER_LABELS.get(name, name)}" for name in runners)
    facts = dict(header["environment"])
    if header.get("load_average_1min"):
        facts["load average during the run"] = header["load_average_1min"]
    if header.get("merged_from"):
        facts["merged from the runs of"] = "; ".join(header["merged_from"])
    machine = ", ".join(f"{k} {v}" for k, v in facts.items())
    total = header.get("total_seconds")
    took = f"; {total / 60:.1f} min in all" if total else " (partial results)"
    report = (
        f"# Benchmarks ({title})\n\n{machine}{took}.\n\n{legend}\n\n"
        f"{markdown_table(results)}\n\n## Ratios (median times)\n\n{ratio_table(results)}\n"
        f"\n## CPU against the user code alone (median CPU times)\n\n{cpu_table(results)}\n"
    )
    codes = header.get("runner_codes") or []
    if len(codes) > 1:
        report += (
            f"\n**Warning**: the runner's code changed during this run ({len(codes)} versions: "
            f"{', '.join(codes)}; see `runner_code` in latest.json).\n"
        )
    (out_dir / "latest.md").write_text(report)
    if chart(results, out_dir / "latest.png", title):
        _LOGGER.info("Chart written to %s", out_dir / "latest.png")
    return report


def merge_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several ``latest.json`` contents of the same size as one: all their timed runs.

    Medians are taken over all the runs' timed runs, memory peaks are the largest; the cold
    start is the median of the runs' cold-start medians. The header is the first run's,
    with the total of rounds, the load averages and runner code hashes of all.
    """
    if len({run["size"] for run in runs}) > 1:
        raise ValueError("cannot merge runs of different sizes")
    header = {key: value for key, value in runs[0].items() if key != "results"}
    header["runs"] = sum(run["runs"] for run in runs)
    # Settings only a later run had (e.g. the ours-exp runner's) are kept too.
    header["environment"] = {
        **{k: v for run in reversed(runs) for k, v in run["environment"].items()},
        **runs[0]["environment"],
    }
    header["runner_codes"] = sorted(
        {code for run in runs for code in run.get("runner_codes", [])}
        | {r["runner_code"] for run in runs for r in run["results"] if r.get("runner_code")}
    )
    header["merged_from"] = [
        f"{run['environment']['date']} ({run['runs']} rounds"
        + (f", load average {run['load_average_1min']}" if run.get("load_average_1min") else "")
        + ")"
        for run in runs
    ]
    header["total_seconds"] = sum(run.get("total_seconds") or 0 for run in runs) or None
    workloads = list(dict.fromkeys(r["workload"] for run in runs for r in run["results"]))
    runners = list(dict.fromkeys(r["runner"] for run in runs for r in run["results"]))
    results = merge_rounds([r for run in runs for r in run["results"]])
    results.sort(key=lambda r: (workloads.index(r["workload"]), runners.index(r["runner"])))
    return {**header, "results": results}


def main(argv: list[str] | None = None) -> int:
    """Command line entry: the report again from ``latest.json``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path(__file__).resolve().parent / "results",
        help="where latest.json is, and latest.md and latest.png go",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="merge the latest.json of these output directories (runs of the same size, "
        "e.g. more rounds run later) into OUTPUT_DIR/latest.json, then report",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.merge:
        data = merge_runs([json.loads((d / "latest.json").read_text()) for d in args.merge])
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "latest.json").write_text(json.dumps(data, indent=2))
    else:
        data = json.loads((args.output_dir / "latest.json").read_text())
    results = data.pop("results")
    print(write_report(data, results, args.output_dir))  # noqa: T201 - this command's output
    return 0


if __name__ == "__main__":
    sys.exit(main())
