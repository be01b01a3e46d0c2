"""Beam's TestStream tests on SparkStructuredRunner: each passes or is refused up front.

``python -m validates_runner.teststream`` (``make teststream-check``) runs Beam's own
TestStream-heavy test modules with every pipeline forced onto SparkStructuredRunner
(:mod:`validates_runner.force_runner`). The runner runs a TestStream in batch only where
no transform downstream could tell the batch run from a streaming one
(``beam_spark_runner.batch_test_stream``), and refuses every other TestStream before
Spark starts. So each test must either pass or fail with that refusal; any other failure
means a TestStream was run in batch where a streaming run differs (or a Beam limitation
listed below), and the check fails.
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
)

REFUSED = "refused before Spark (needs streaming)"
PASSED = "passed"
SKIPPED = "skipped by Beam"
BEAM_CANNOT_TRANSLATE = "Beam cannot translate it to the portable model"
UNEXPECTED = "FAILED otherwise"

# Failures that are Beam's, on every portable runner: Beam's to_runner_api has no
# portable form of this timestamp combiner (FnApiRunner's BatchTranscriptTest skips it).
_BEAM_LIMITS = ('unknown enum label "OUTPUT_AT_EARLIEST_TRANSFORMED"',)


def classify(failure_text: str) -> str:
    """The category of a failed test, from its failure text."""
    if "UnsupportedFeatureError" in failure_text and "beam:transform:teststream:v1" in failure_text:
        return REFUSED
    if any(limit in failure_text for limit in _BEAM_LIMITS):
        return BEAM_CANNOT_TRANSLATE
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
            results[test_id] = classify(text)
        elif case.find("skipped") is not None:
            results[test_id] = SKIPPED
        else:
            results[test_id] = PASSED
    return results


def run(out_dir: Path, extra: list[str]) -> dict[str, str]:
    """Runs the modules in one pytest process; returns each test's category."""
    junit = out_dir / "teststream.xml"
    log = out_dir / "teststream.log"
    command = plugin_pytest_command("validates_runner.force_runner", junit)
    command += ["--pyargs", *MODULES, *extra]
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
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="teststream-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results = run(out_dir, args.pytest_args)
    counts = Counter(results.values())
    width = max(len(category) for category in counts) if counts else 0
    lines = [f"{category:<{width}}  {counts[category]:>4}" for category in sorted(counts)]
    sys.stdout.write("\n".join(["Beam's TestStream tests on SparkStructuredRunner:", *lines]))
    sys.stdout.write("\n")
    unexpected = sorted(test for test, category in results.items() if category == UNEXPECTED)
    for test in unexpected:
        sys.stdout.write(f"  {UNEXPECTED}: {test}\n")
    if unexpected:
        sys.stdout.write(
            f"{len(unexpected)} test(s) neither passed nor were refused: a TestStream ran in "
            f"batch where a streaming run differs, or another failure. Logs: {out_dir}\n"
        )
        return 1
    if not counts[PASSED]:
        sys.stdout.write(f"No test passed: the check proved nothing. Logs: {out_dir}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
