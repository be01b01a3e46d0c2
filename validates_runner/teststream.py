"""Beam's streaming test modules on SparkStructuredRunner, with every pipeline on it.

``python -m validates_runner.teststream`` (``make teststream-check``) runs Beam's own
TestStream-, trigger-, deduplicate-, periodic-sequence- and user-state test modules with
every pipeline forced onto SparkStructuredRunner (:mod:`validates_runner.force_runner`).
Their pipelines run in streaming (a TestStream or ``PeriodicImpulse`` makes them unbounded;
most also set ``--streaming``). Each test must pass, or be refused before Spark starts
(listed by name), or be one of the known cases below that are not the runner's: a Beam
limitation on every portable runner, or a test that reads its results from the memory of
the test process (a class attribute or a module global its DoFns append to: Spark's Python
workers are other processes). Anything else fails the check.
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

from validates_runner.report import ROOT, plugin_pytest_command

_LOGGER = logging.getLogger("validates_runner.teststream")

MODULES = (
    "apache_beam.testing.test_stream_test",
    "apache_beam.transforms.trigger_test",
    "apache_beam.transforms.deduplicate_test",
    "apache_beam.transforms.periodicsequence_test",
    "apache_beam.transforms.userstate_test",
)

REFUSED = "refused before Spark"
PASSED = "passed"
SKIPPED = "skipped by Beam"
BEAM_CANNOT_TRANSLATE = "Beam cannot translate it to the portable model"
TEST_PROCESS_MEMORY = "reads results from the test process's memory"
UNEXPECTED = "FAILED otherwise"

# Failures that are Beam's, on every portable runner: Beam's to_runner_api has no
# portable form of this timestamp combiner (FnApiRunner's BatchTranscriptTest skips it).
_BEAM_LIMITS = ('unknown enum label "OUTPUT_AT_EARLIEST_TRANSFORMED"',)

# Tests whose DoFns record into the test process (class attributes, module globals) and
# whose assertions read that record: on Spark the DoFns run in other processes. Each was
# checked to fail on SparkStructuredRunner for that reason only.
READS_TEST_PROCESS_MEMORY: frozenset[str] = frozenset()


def classify(failure_text: str, test_id: str = "") -> str:
    """The category of a failed test, from its failure text (and its id)."""
    if "UnsupportedFeatureError" in failure_text:
        return REFUSED
    if any(limit in failure_text for limit in _BEAM_LIMITS):
        return BEAM_CANNOT_TRANSLATE
    if test_id in READS_TEST_PROCESS_MEMORY:
        return TEST_PROCESS_MEMORY
    return UNEXPECTED


def read_results(junit: Path) -> dict[str, str]:
    """Test id -> category, from a pytest junitxml file."""
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        classname = case.get("classname", "")
        module = re.search(r"apache_beam\..*", classname)
        test_id = f"{module.group(0) if module else classname}::{case.get('name', '')}"
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            text = "\n".join(filter(None, [failure.get("message"), failure.text]))
            results[test_id] = classify(text, test_id)
        elif case.find("skipped") is not None:
            results[test_id] = SKIPPED
        else:
            results[test_id] = PASSED
    return results


def run(out_dir: Path, extra: list[str], modules: tuple[str, ...] = MODULES) -> dict[str, str]:
    """Runs the modules in one pytest process; returns each test's category."""
    junit = out_dir / "teststream.xml"
    log = out_dir / "teststream.log"
    command = plugin_pytest_command("validates_runner.force_runner", junit)
    command += ["--pyargs", *modules, *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    _LOGGER.info("Running Beam's TestStream tests on SparkStructuredRunner (log: %s)", log)
    with log.open("w", encoding="utf-8") as log_file:
        subprocess.run(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    if not junit.exists():
        raise RuntimeError(f"pytest wrote no results; see {log}")
    return read_results(junit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=None, help="logs and junitxml")
    parser.add_argument(
        "--modules", default=",".join(MODULES), help="comma-separated Beam test modules"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="teststream-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results = run(out_dir, args.pytest_args, tuple(args.modules.split(",")))
    counts = Counter(results.values())
    width = max(len(category) for category in counts) if counts else 0
    lines = [f"{category:<{width}}  {counts[category]:>4}" for category in sorted(counts)]
    sys.stdout.write("\n".join(["Beam's TestStream tests on SparkStructuredRunner:", *lines]))
    sys.stdout.write("\n")
    for category in (REFUSED, TEST_PROCESS_MEMORY, UNEXPECTED):
        for test in sorted(t for t, c in results.items() if c == category):
            sys.stdout.write(f"  {category}: {test}\n")
    unexpected = [test for test, category in results.items() if category == UNEXPECTED]
    if unexpected:
        sys.stdout.write(
            f"{len(unexpected)} test(s) neither passed nor were refused nor are known not to "
            f"be the runner's. Logs: {out_dir}\n"
        )
        return 1
    if not counts[PASSED]:
        sys.stdout.write(f"No test passed: the check proved nothing. Logs: {out_dir}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
