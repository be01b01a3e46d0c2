"""Beam's DataFrame API tests on SparkStructuredRunner, next to DirectRunner's results.

``python -m validates_runner.dataframe`` (``make dataframe-check``) runs Beam's DataFrame
test modules twice: once as Beam wrote them (DirectRunner), once with every pipeline forced
onto SparkStructuredRunner on ``local[2]`` (:mod:`validates_runner.force_runner`). It prints
each test's outcome on both runners and fails when a test that passes on DirectRunner fails
on this runner (a failure that is the runner's), or when a test said to have run on Spark
ran no pipeline there.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from validates_runner.conftest import RUNNER_PROPERTY
from validates_runner.report import ROOT, plugin_pytest_command

_LOGGER = logging.getLogger("validates_runner.dataframe")

MODULES = (
    "apache_beam.dataframe.transforms_test",
    "apache_beam.dataframe.io_test",
)

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"
RUNNERS = ("DirectRunner", "SparkStructuredRunner")


def read_results(junit: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """Test id -> (outcome, runners its pipelines ran on), from a pytest junitxml file."""
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        classname = case.get("classname", "")
        module = re.search(r"apache_beam\..*", classname)
        test_id = f"{module.group(0) if module else classname}::{case.get('name', '')}"
        runners = frozenset(
            prop.get("value", "")
            for prop in case.iter("property")
            if prop.get("name") == RUNNER_PROPERTY
        )
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = FAILED
        elif case.find("skipped") is not None:
            outcome = SKIPPED
        else:
            outcome = PASSED
        results[test_id] = (outcome, runners)
    return results


def run(out_dir: Path, runner: str, extra: list[str]) -> dict[str, tuple[str, frozenset[str]]]:
    """Runs the modules in one pytest process on ``runner``; returns each test's result."""
    junit = out_dir / f"{runner}.xml"
    log = out_dir / f"{runner}.log"
    command = plugin_pytest_command("validates_runner.conftest", junit)
    if runner == "SparkStructuredRunner":
        command += ["-p", "validates_runner.force_runner"]
    command += ["--pyargs", *MODULES, *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    _LOGGER.info("Running Beam's DataFrame tests on %s (log: %s)", runner, log)
    with log.open("w", encoding="utf-8") as log_file:
        subprocess.run(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    if not junit.exists():
        raise RuntimeError(f"pytest wrote no results; see {log}")
    return read_results(junit)


def runner_failures(
    direct: dict[str, tuple[str, frozenset[str]]],
    spark: dict[str, tuple[str, frozenset[str]]],
) -> list[str]:
    """Tests that pass on DirectRunner but fail (or are missing) on SparkStructuredRunner,
    or that passed without running any pipeline on it while DirectRunner ran one."""
    failures = []
    for test, (outcome, direct_runners) in sorted(direct.items()):
        spark_outcome, spark_runners = spark.get(test, (FAILED, frozenset()))
        if outcome == PASSED and spark_outcome != PASSED:
            failures.append(f"{test}: passes on DirectRunner, {spark_outcome} on Spark")
        elif spark_outcome == PASSED and direct_runners and spark_runners != {RUNNERS[1]}:
            failures.append(f"{test}: ran pipelines on {sorted(spark_runners)}, not only Spark")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=None, help="logs and junitxml")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="dataframe-check-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    direct = run(out_dir, RUNNERS[0], args.pytest_args)
    spark = run(out_dir, RUNNERS[1], args.pytest_args)
    width = max((len(test) for test in direct), default=0)
    lines = [f"{'test':<{width}}  {RUNNERS[0]:<12}  {RUNNERS[1]}"]
    for test in sorted(set(direct) | set(spark)):
        direct_outcome = direct.get(test, ("missing", frozenset()))[0]
        spark_outcome = spark.get(test, ("missing", frozenset()))[0]
        lines.append(f"{test:<{width}}  {direct_outcome:<12}  {spark_outcome}")
    for name, results in zip(RUNNERS, (direct, spark), strict=True):
        counts = Counter(outcome for outcome, _ in results.values())
        summary = ", ".join(f"{counts[o]} {o}" for o in (PASSED, FAILED, SKIPPED))
        lines.append(f"{name}: {summary}")
    failures = runner_failures(direct, spark)
    lines.append(f"Failures that are the runner's: {len(failures)}")
    lines.extend(f"  {failure}" for failure in failures)
    lines.append(f"Logs: {out_dir}")
    sys.stdout.write("\n".join(lines) + "\n")
    ran_on_spark = sum(
        1 for outcome, runners in spark.values() if outcome == PASSED and RUNNERS[1] in runners
    )
    if not ran_on_spark:
        sys.stdout.write("No test passed with a pipeline on Spark: the check proved nothing.\n")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
