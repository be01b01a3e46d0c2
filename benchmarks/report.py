"""The benchmark report: a markdown table, ratios against the baselines, and a PNG chart."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_LOGGER = logging.getLogger(__name__)

RUNNER_LABELS = {
    "ours": "SparkStructuredRunner local[2]",
    "direct": "DirectRunner (FnApiRunner)",
    "direct-mp": "FnApiRunner, 2 worker processes",
    "pyspark": "hand-written PySpark (floor)",
    "sql": "Spark SQL (ceiling)",
}
RUNNER_COLORS = {
    "ours": "#d62728",
    "direct": "#1f77b4",
    "direct-mp": "#17becf",
    "pyspark": "#ff7f0e",
    "sql": "#2ca02c",
}

Result = dict[str, Any]


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

    The reference is the (results, checksum) pair most runners of the workload agree on.
    """
    verdicts: dict[tuple[str, str], str] = {}
    by_workload: dict[str, list[Result]] = {}
    for result in results:
        by_workload.setdefault(result["workload"], []).append(result)
    for workload, group in by_workload.items():
        ok = [r for r in group if r["status"] == "ok"]
        votes = Counter((r["results"], r["checksum"]) for r in ok)
        reference = votes.most_common(1)[0][0] if votes else None
        for result in group:
            if result["status"] != "ok":
                verdict = ""
            elif len(ok) < 2:
                verdict = "(alone)"
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


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else ""


def ratio_table(results: Sequence[Result]) -> str:
    """Per workload: our median time against DirectRunner, the PySpark floor and SQL.

    ``DirectRunner / ours`` above 1 means ours is faster; ``ours / PySpark`` at most 2 meets
    the target of staying within 2x of hand-written PySpark. The same ratios of CPU time
    (the whole process tree's) follow: on a loaded machine they vary less than wall time.
    """
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    lines = [
        "| workload | ours s | DirectRunner s | DirectRunner / ours | PySpark s | ours / PySpark "
        "| SQL s | ours / SQL | faster than Direct? | within 2x of PySpark? "
        "| CPU: Direct / ours | CPU: ours / PySpark |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for workload in workloads:
        ours = _median(results, workload, "ours")
        direct = _median(results, workload, "direct")
        floor = _median(results, workload, "pyspark")
        sql = _median(results, workload, "sql")
        cpu = {
            runner: _median(results, workload, runner, "median_cpu_seconds")
            for runner in ("ours", "direct", "pyspark")
        }
        faster = "" if not (ours and direct) else ("yes" if ours < direct else "no")
        within = "" if not (ours and floor) else ("yes" if ours <= 2 * floor else "no")
        lines.append(
            f"| {workload} | {_seconds(ours)} | {_seconds(direct)} | {_ratio(direct, ours)} "
            f"| {_seconds(floor)} | {_ratio(ours, floor)} | {_seconds(sql)} "
            f"| {_ratio(ours, sql)} | {faster} | {within} "
            f"| {_ratio(cpu['direct'], cpu['ours'])} | {_ratio(cpu['ours'], cpu['pyspark'])} |"
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
