"""Smoke tests on a Spark standalone cluster: executors are separate JVMs (and Python
workers) on a worker, so nothing may depend on the driver's memory.

The three pipelines of (a)-(c) run in one driver process (``driver.py suite``) so that
Spark and its executors start once; each test checks its own pipeline's part of the
report. (d) submits a driver with spark-submit.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .support import (
    DRIVER,
    EXECUTOR_JVM,
    LOOPBACK,
    PYTHON,
    STANDALONE_SPARK_CONF,
    DriverRun,
    LoggedProcess,
    StandaloneCluster,
    assert_ran_on_executors,
    driver_env,
    read_counts,
    run_logged,
    spark_conf_args,
    spark_home,
)

pytestmark = pytest.mark.cluster

NUMBERS = 10_000


def expected_counts(path: Path) -> dict[str, int]:
    """The word count, computed without Beam (same tokenisation as driver.py)."""
    return dict(Counter(re.findall(r"[A-Za-z']+", path.read_text())))


@dataclasses.dataclass
class Suite:
    run: DriverRun  # driver.py suite on the standalone cluster
    output_dir: Path  # its word count output
    direct: DriverRun  # the word count on DirectRunner
    direct_prefix: Path


@pytest.fixture(scope="module")
def suite(
    standalone_cluster: StandaloneCluster,
    words_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Suite:
    """Runs word count, the mixed pipeline and the metrics pipeline in one driver process.

    The DirectRunner word count to compare with runs meanwhile, in a process of its own.
    """
    work = tmp_path_factory.mktemp("suite")
    output_dir = work / "out"
    output_dir.mkdir()
    direct_prefix = work / "direct" / "counts"
    direct = LoggedProcess(
        [
            PYTHON,
            str(DRIVER),
            "wordcount",
            f"--input={words_file}",
            f"--output={direct_prefix}",
            f"--report={work / 'direct.json'}",
            "--runner=DirectRunner",
        ],
        work / "direct.log",
        driver_env(),
        report=work / "direct.json",
        cwd=work,
    )
    report = work / "report.json"
    command = [
        PYTHON,
        str(DRIVER),
        "suite",
        f"--input={words_file}",
        f"--output-dir={output_dir}",
        f"--report={report}",
        "--runner=SparkStructuredRunner",
        f"--spark_master={standalone_cluster.master_url}",
        *spark_conf_args(STANDALONE_SPARK_CONF),
    ]
    try:
        run = run_logged(command, work / "driver.log", driver_env(), report=report, cwd=work)
    except BaseException:
        direct.kill()
        raise
    return Suite(run, output_dir, direct.wait(), direct_prefix)


def test_driver_process_succeeded(suite: Suite) -> None:
    run = suite.run
    failed = {name: entry.get("error") for name, entry in run.report.items() if not entry["ok"]}
    assert run.returncode == 0 and not failed, (
        f"driver exit {run.returncode}, failed pipelines: {failed}\n{run.log_tail()}"
    )


def test_wordcount_matches_direct_runner(suite: Suite, words_file: Path) -> None:
    entry = suite.run.entry("wordcount")
    suite.direct.entry("wordcount")
    spark_counts = read_counts(suite.output_dir / "counts")
    direct_counts = read_counts(suite.direct_prefix)
    assert spark_counts == direct_counts
    assert spark_counts == expected_counts(words_file)
    assert entry["spark_master"].startswith("spark://")
    assert_ran_on_executors(entry, elements=sum(spark_counts.values()))


def test_group_by_key_side_inputs_tagged_outputs_combine_and_state(suite: Suite) -> None:
    run = suite.run
    # The pipeline checks its own output with assert_that: succeeding is the check.
    entry = run.entry("mixed")
    assert entry["state"] == "DONE"
    assert_ran_on_executors(entry, elements=2000)


def test_user_metrics_committed(suite: Suite) -> None:
    run = suite.run
    entry = run.entry("metrics")
    counters: dict[str, Any] = entry["counters"]
    assert counters["elements"]["committed"] == NUMBERS
    assert counters["multiples_of_7"]["committed"] == len(range(0, NUMBERS, 7))
    assert entry["distributions"]["sizes"] == {
        "count": NUMBERS,
        "sum": sum(range(NUMBERS)),
        "min": 0,
        "max": NUMBERS - 1,
    }
    # A string set is the union over bundles and tasks: one id per non-empty bundle.
    bundles = counters["bundles"]["committed"]
    assert len(entry["string_sets"]["bundle_ids"]) == bundles, (
        f"string set has {len(entry['string_sets']['bundle_ids'])} of {bundles} bundle ids"
    )
    assert_ran_on_executors(entry, elements=NUMBERS)


# --- (d) spark-submit ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def submitted(
    standalone_cluster: StandaloneCluster,
    small_words_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[DriverRun, Path]:
    """``spark-submit --master spark://... driver.py wordcount`` without --spark_master."""
    work = tmp_path_factory.mktemp("spark-submit")
    prefix = work / "out" / "counts"
    report = work / "report.json"
    conf = [
        arg for key, value in STANDALONE_SPARK_CONF.items() for arg in ("--conf", f"{key}={value}")
    ]
    command = [
        f"{spark_home()}/bin/spark-submit",
        "--master",
        standalone_cluster.master_url,
        *conf,
        str(DRIVER),
        "wordcount",
        f"--input={small_words_file}",
        f"--output={prefix}",
        f"--report={report}",
        "--runner=SparkStructuredRunner",
    ]
    run = run_logged(command, work / "spark-submit.log", driver_env(), report=report, cwd=work)
    return run, prefix


def test_spark_submit_pipeline_output(
    submitted: tuple[DriverRun, Path], small_words_file: Path
) -> None:
    run, prefix = submitted
    assert run.returncode == 0, run.log_tail()
    run.entry("wordcount")
    assert read_counts(prefix) == expected_counts(small_words_file)


def test_spark_submit_runs_on_the_submitted_master(
    submitted: tuple[DriverRun, Path], standalone_cluster: StandaloneCluster
) -> None:
    run, _ = submitted
    entry = run.entry("wordcount")
    assert entry["spark_master"] == standalone_cluster.master_url
    assert entry["spark_application_id"] in standalone_cluster.application_ids()
    assert_ran_on_executors(entry)


def test_cluster_is_loopback_only(standalone_cluster: StandaloneCluster) -> None:
    """The master and the worker listen on 127.0.0.1 only (RPC and web UI ports)."""
    state = standalone_cluster.state()
    assert state["url"] == standalone_cluster.master_url
    workers = [w for w in state["workers"] if w["state"] == "ALIVE"]
    assert len(workers) == 1 and workers[0]["host"] == LOOPBACK, workers
    if shutil.which("ss") is None:
        pytest.skip("no `ss` to list listening sockets; the master's report was checked")
    listening = subprocess.run(
        ["ss", "-Hltnp"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    for daemon in ("master", "worker"):
        pid = (standalone_cluster.directory / f"{daemon}.pid").read_text().strip()
        sockets = [line for line in listening if f"pid={pid}," in line]
        if not sockets:  # ss shows no process names to non-root users
            continue
        local = [line.split()[3] for line in sockets]
        assert all(LOOPBACK in address for address in local), (daemon, local)


def test_executor_evidence_names_executors(suite: Suite) -> None:
    """Sanity check of the evidence itself: JVM names look like executors' with pids."""
    run = suite.run
    names = {jvm for name in ("wordcount", "mixed", "metrics") for jvm in run.entry(name)["jvms"]}
    assert names and all(re.fullmatch(re.escape(EXECUTOR_JVM) + r":\d+", n) for n in names), names
    driver_pid = run.entry("metrics")["driver_pid"]
    assert all(int(n.rsplit(":", 1)[1]) != driver_pid for n in names)
