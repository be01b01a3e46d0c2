"""Beam's streaming test modules on SparkStructuredRunner, with every pipeline on it.

``python -m validates_runner.teststream`` (``make teststream-check``) runs Beam's own test
modules that use TestStream or ``PeriodicImpulse`` (``MODULES``) with every pipeline forced
onto SparkStructuredRunner (:mod:`validates_runner.force_runner`). Pipelines with a
TestStream or ``PeriodicImpulse`` run in streaming; the modules' other tests run theirs in
batch. Each test must pass, or fail as ``LISTED`` says, by name: refused before Spark
starts, or a case that is not the runner's (a Beam limitation on every portable runner, a
test that reads its results from the memory of the test process, assumes one bundle or one
worker, or asserts what only an in-process runner gives: Spark's Python workers are other
processes). Any other failure or refusal fails the check, and so does a listed test that
no longer fails as listed. Passed tests are counted apart by whether they ran a pipeline on
SparkStructuredRunner (the plugin counts them).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from validates_runner import force_runner
from validates_runner.report import ROOT, plugin_pytest_command

_LOGGER = logging.getLogger("validates_runner.teststream")

MODULES = (
    "apache_beam.testing.test_stream_test",
    "apache_beam.transforms.trigger_test",
    "apache_beam.transforms.deduplicate_test",
    "apache_beam.transforms.periodicsequence_test",
    "apache_beam.transforms.userstate_test",
    "apache_beam.transforms.sideinputs_test",
    "apache_beam.transforms.combiners_test",
    "apache_beam.transforms.window_test",
    "apache_beam.io.fileio_test",
    "apache_beam.runners.common_test",
    "apache_beam.transforms.util_test",
)

PASSED_ON_SPARK = "passed, ran a pipeline on SparkStructuredRunner"
PASSED_NO_PIPELINE = "passed, ran no pipeline on SparkStructuredRunner"
REFUSED = "refused before Spark, listed by name"
BEAM_CANNOT_TRANSLATE = "Beam cannot translate it to the portable model, listed by name"
TEST_PROCESS_MEMORY = "reads results from the test process's memory, listed by name"
ONE_BUNDLE = "assumes one bundle or one worker, listed by name"
DIRECT_ONLY = "asserts what only an in-process runner gives, listed by name"
SKIPPED = "skipped by Beam"
REFUSED_UNLISTED = "FAILED: refused before Spark, not listed"
NO_LONGER_LISTED = "FAILED: listed, but no longer fails so"
UNEXPECTED = "FAILED otherwise"

# The categories that fail the check.
FAILING = (REFUSED_UNLISTED, NO_LONGER_LISTED, UNEXPECTED)
# The categories of LISTED.
EXCUSED = (BEAM_CANNOT_TRANSLATE, TEST_PROCESS_MEMORY, ONE_BUNDLE, DIRECT_ONLY)


@dataclass(frozen=True)
class Listed:
    """A test that may fail here, by name: how (a part of its failure text) and why."""

    category: str  # REFUSED or one of EXCUSED
    expect: str
    reason: str
    # Other failure texts of the same cause, where it shows in more than one way.
    also: tuple[str, ...] = ()

    def matches(self, failure_text: str) -> bool:
        """Whether ``failure_text`` is this listed failure's."""
        return any(expect in failure_text for expect in (self.expect, *self.also))


_TEST_STREAM = "apache_beam.testing.test_stream_test"
_TRIGGER = "apache_beam.transforms.trigger_test"
_USERSTATE = "apache_beam.transforms.userstate_test"
_COMBINERS = "apache_beam.transforms.combiners_test"
_FILEIO = "apache_beam.io.fileio_test"
_COMMON = "apache_beam.runners.common_test"
_UTIL = "apache_beam.transforms.util_test"

# Beam's to_runner_api has no portable form of this timestamp combiner (FnApiRunner's
# BatchTranscriptTest skips it).
_EARLIEST_TRANSFORMED = Listed(
    BEAM_CANNOT_TRANSLATE,
    'unknown enum label "OUTPUT_AT_EARLIEST_TRANSFORMED"',
    "Beam has no portable form of the OUTPUT_AT_EARLIEST_TRANSFORMED timestamp combiner",
)
# ReverseTestStream's Python-only transforms are pickled, not portable (FnApiRunner cannot
# run them either).
_PICKLED_PYTHON = Listed(
    BEAM_CANNOT_TRANSLATE,
    "has URN beam:transform:pickled_python:v1",
    "ReverseTestStream's transforms are pickled Python, which no portable runner executes",
)
# StatefulDoFnOnDirectRunnerTest's DoFns append to a class attribute its setUp creates in
# the test process, and its assertions read it. A worker started afresh lacks the attribute;
# one forked from the driver (the local zygote, after the setUp) appends to its own copy,
# so the test process reads an empty list.
_CLASS_RECORD = Listed(
    TEST_PROCESS_MEMORY,
    "type object 'StatefulDoFnOnDirectRunnerTest' has no attribute 'all_records'",
    "its DoFns record into a class attribute of the test process; Spark's Python workers "
    "are other processes",
    # unittest's assertEqual against the empty list, or Beam's equal_to (test_hash_join).
    also=("!= []", "Failed assert: [] == ["),
)
# ``[...] | Top.Of(3)`` runs a pipeline on the default runner and gathers its output in a
# list of the test process; Beam's transform refuses any runner out of that process.
_MATERIALIZED = Listed(
    TEST_PROCESS_MEMORY,
    "Materialization in out-of-process and remote runners is not yet supported",
    "applies a transform to a plain list, which Beam materializes into the test process's "
    "memory and refuses on any out-of-process runner",
)
_FILEIO_RECORD = Listed(
    TEST_PROCESS_MEMORY,
    "type object 'WriteFilesTest' has no attribute 'all_records'",
    "its DoFn records into a class attribute of the test process; Spark's Python workers "
    "are other processes",
)
_COMMON_RECORD = Listed(
    TEST_PROCESS_MEMORY,
    "'NoneType' object has no attribute 'append'",
    "its DoFn appends to DoFnProcessTest.all_records, which only the test process's setUp "
    "makes a list; Spark's Python workers are other processes",
)

# Every test that may fail here, by id, with how and why. Any other failure or refusal
# fails the check, and so does a listed test that no longer fails as listed (the list
# must stay true: remove it).
LISTED: dict[str, Listed] = {
    f"{_TEST_STREAM}.ReverseTestStreamTest::test_basic_execution": _PICKLED_PYTHON,
    f"{_TEST_STREAM}.ReverseTestStreamTest::test_basic_execution_in_records_format": (
        _PICKLED_PYTHON
    ),
    f"{_TEST_STREAM}.ReverseTestStreamTest::test_windowing": _PICKLED_PYTHON,
    f"{_TRIGGER}.TestStreamTranscriptTest"
    "::test_timestamp_combiner_custom_timestamping_earliest_1": _EARLIEST_TRANSFORMED,
    f"{_TRIGGER}.WeakTestStreamTranscriptTest"
    "::test_timestamp_combiner_custom_timestamping_earliest_1": _EARLIEST_TRANSFORMED,
    f"{_COMBINERS}.CombineTest::test_top_key": _MATERIALIZED,
    f"{_FILEIO}.WriteFilesTest::test_streaming_complex_timing": _FILEIO_RECORD,
    # Beam's comment: "Test assumes that all records will be handled by same worker
    # process"; on local[2] each destination gets a file per partition.
    f"{_FILEIO}.WriteFilesTest::test_write_to_dynamic_destination": Listed(
        ONE_BUNDLE,
        "Failed assert: [('odd', [1, 3",
        "expects one file per destination, written by one worker (Beam pins it to "
        "FnApiRunner for that); on local[2] each destination gets a file per partition",
    ),
    f"{_COMMON}.DoFnProcessTest::test_dofn_process_keyparam": _COMMON_RECORD,
    f"{_COMMON}.DoFnProcessTest::test_dofn_yielding_str_is_not_flagged": _COMMON_RECORD,
    f"{_COMMON}.DoFnProcessTest::test_dofn_process_keyparam_error_no_key": Listed(
        DIRECT_ONLY,
        "ValueError: Input value to a stateful DoFn or KeyParam must be a KV tuple",
        "asserts the ValueError its DoFn raises reaches the test as a ValueError, which only "
        "an in-process runner re-raises; here it is raised in a Spark worker and the run "
        "fails with PipelineExecutionError (a RuntimeError) carrying that ValueError's text",
    ),
    **{
        f"{_UTIL}.BatchElementsTest::{name}": Listed(
            ONE_BUNDLE,
            expect,
            "BatchElements batches within a bundle (or a shared key per bundle's task); the "
            "test expects Create's elements in one bundle, where local[2] gives two",
        )
        for name, expect in (
            ("test_constant_batch", "Failed assert: [10, 10, 10, 5]"),
            ("test_constant_batch_no_metrics", "Failed assert: [10, 10, 10, 5]"),
            ("test_grows_to_max_batch", "Failed assert: [1, 1, 2, 4, 8, 16, 32, 50, 50]"),
            ("test_length_fn_without_stateful_is_ignored", "Failed assert: [3]"),
            ("test_padding_efficiency_bimodal", "expected < 70% for bimodal distribution"),
            ("test_stateful_constant_batch", "Failed assert: [10, 10, 10, 5]"),
            ("test_stateful_grows_to_max_batch", "Failed assert: [1, 1, 2, 4, 8, 16, 32, 50, 50]"),
        )
    },
    **{
        f"{_UTIL}.ReshuffleTest::test_reshuffle_custom_window_preserves_metadata_{i}": Listed(
            DIRECT_ONLY,
            "timestamp=Timestamp(9223371950454.774999)",
            "expects the global window's end to the microsecond; Beam's windowed-value coder "
            "keeps milliseconds, so a runner that encodes elements between steps truncates it",
        )
        for i in (0, 1)
    },
    **{
        f"{_UTIL}.LogElementsTest::{name}": Listed(
            TEST_PROCESS_MEMORY,
            "Received from stdout",
            "captures the test process's stdout; LogElements prints in Spark's Python workers",
        )
        for name in ("test_stdout_logs", "test_stdout_logs_without_rfc3339")
    },
    f"{_UTIL}.TeeTest::test_tee": Listed(
        TEST_PROCESS_MEMORY,
        "AssertionError: 0 != 1",
        "counts the tee's side effects in a variable of the test process",
    ),
    f"{_UTIL}.WaitOnTest::test_find": Listed(
        TEST_PROCESS_MEMORY,
        "Failed assert: [(None, '",
        "numbers elements with a counter kept on the beam module of one process; Spark's "
        "Python workers are several processes",
    ),
    **{
        f"{_USERSTATE}.StatefulDoFnOnDirectRunnerTest::{name}": _CLASS_RECORD
        for name in (
            "test_clearing_bag_state",
            "test_clearing_read_modify_write_state",
            "test_clearing_set_state",
            "test_dynamic_timer_and_simple_timer",
            "test_dynamic_timer_clear_timer",
            "test_dynamic_timer_multiple",
            "test_dynamic_timer_simple_dofn",
            "test_generate_sequence_with_realtime_timer",
            "test_hash_join",
            "test_index_assignment",
            "test_simple_read_modify_write_stateful_dofn",
            "test_simple_set_stateful_dofn",
            "test_simple_stateful_dofn",
            "test_simple_stateful_dofn_combining",
            "test_timer_default_tag",
            "test_timer_output_timestamp",
            "test_timer_output_timestamp_and_window",
            "test_two_timers_one_function",
        )
    },
}


def classify_failure(test_id: str, failure_text: str, listed: dict[str, Listed]) -> str:
    """The category of a failed test, from its id and failure text."""
    entry = listed.get(test_id)
    if entry is not None and entry.matches(failure_text):
        return entry.category
    if "UnsupportedFeatureError" in failure_text:
        return REFUSED_UNLISTED
    return UNEXPECTED


@dataclass(frozen=True)
class Result:
    """One test's outcome: its category and the pipelines it ran on SparkStructuredRunner."""

    category: str
    pipelines_ran: int | None  # None: the junitxml does not say
    detail: str = ""


def _properties(case: ET.Element) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}


def read_results(junit: Path, listed: dict[str, Listed] | None = None) -> dict[str, Result]:
    """Test id -> result, from a pytest junitxml file."""
    listed = LISTED if listed is None else listed
    results = {}
    for case in ET.parse(junit).iter("testcase"):
        classname = case.get("classname", "")
        module = re.search(r"apache_beam\..*", classname)
        properties = _properties(case)
        test_id = properties.get(force_runner.TEST_ID_PROPERTY) or (
            f"{module.group(0) if module else classname}::{case.get('name', '')}"
        )
        ran_text = properties.get(force_runner.RAN_PROPERTY)
        ran = int(ran_text) if ran_text is not None else None
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            text = "\n".join(filter(None, [failure.get("message"), failure.text]))
            first = (failure.get("message") or "").strip().splitlines()[:1]
            results[test_id] = Result(
                classify_failure(test_id, text, listed), ran, first[0][:300] if first else ""
            )
        elif case.find("skipped") is not None:
            results[test_id] = Result(SKIPPED, ran)
        elif test_id in listed:
            results[test_id] = Result(
                NO_LONGER_LISTED, ran, f"passed; listed as: {listed[test_id].reason}"
            )
        else:
            results[test_id] = Result(PASSED_ON_SPARK if ran else PASSED_NO_PIPELINE, ran)
    return results


def summary_line(results: dict[str, Result]) -> str:
    """passed (ran a pipeline here / ran none) / refused by name / excused by name / ..."""
    counts = Counter(result.category for result in results.values())
    passed = counts[PASSED_ON_SPARK] + counts[PASSED_NO_PIPELINE]
    failed = sum(counts[category] for category in FAILING)
    return (
        f"{passed} passed ({counts[PASSED_ON_SPARK]} ran a pipeline on SparkStructuredRunner, "
        f"{counts[PASSED_NO_PIPELINE]} ran none) / {counts[REFUSED]} refused by name / "
        f"{sum(counts[category] for category in EXCUSED)} excused by name / "
        f"{counts[SKIPPED]} skipped by Beam / {failed} failed"
    )


def module_of(test_id: str) -> str:
    """The Beam module of a test id, ``module.Class::test`` or ``module::test``."""
    dotted = test_id.split("::", 1)[0]
    head, _, last = dotted.rpartition(".")
    return head if head and last[:1].isupper() else dotted


def module_lines(results: dict[str, Result]) -> list[str]:
    """One summary line per Beam module, in the order of their names."""
    by_module: dict[str, dict[str, Result]] = {}
    for test, result in results.items():
        by_module.setdefault(module_of(test), {})[test] = result
    return [f"  {module}: {summary_line(by_module[module])}" for module in sorted(by_module)]


def report(results: dict[str, Result], listed: dict[str, Listed] | None = None) -> list[str]:
    """The report's lines: counts per category, then every test not plainly passed."""
    listed = LISTED if listed is None else listed
    counts = Counter(result.category for result in results.values())
    width = max(len(category) for category in counts) if counts else 0
    lines = ["Beam's TestStream tests on SparkStructuredRunner:"]
    lines += [f"  {category:<{width}}  {counts[category]:>4}" for category in sorted(counts)]
    for category in (REFUSED, *EXCUSED, *FAILING):
        for test in sorted(t for t, r in results.items() if r.category == category):
            entry = listed.get(test)
            why = (
                entry.reason if entry and category in (REFUSED, *EXCUSED) else results[test].detail
            )
            lines.append(f"  {category}: {test}" + (f" ({why})" if why else ""))
    # Only the modules that ran: ``--modules`` may have left the others out.
    ran_modules = {module_of(test) for test in results}
    missing = sorted(test for test in set(listed) - set(results) if module_of(test) in ran_modules)
    if missing:
        lines.append(f"  listed but not collected (left out by -k or gone from Beam): {missing}")
    lines.append("Per module:")
    lines += module_lines(results)
    lines.append(summary_line(results))
    return lines


def run(out_dir: Path, extra: list[str], modules: tuple[str, ...] = MODULES) -> dict[str, Result]:
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
    parser.add_argument(
        "--junit", type=Path, default=None, help="check this run's junitxml instead of running"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.junit is not None:
        return check(read_results(args.junit), args.junit.parent)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="teststream-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = run(out_dir, args.pytest_args, tuple(args.modules.split(",")))
    code = check(results, out_dir)
    sys.stdout.write(f"Ran in {(time.monotonic() - started) / 60:.1f} min\n")
    return code


def check(results: dict[str, Result], out_dir: Path) -> int:
    """Prints the report; 0 only if every test passed or failed as listed, and some ran."""
    sys.stdout.write("\n".join(report(results)) + "\n")
    if not results:
        sys.stdout.write(f"pytest collected no tests: the check proved nothing. Logs: {out_dir}\n")
        return 1
    failing = [test for test, result in results.items() if result.category in FAILING]
    if failing:
        sys.stdout.write(
            f"{len(failing)} test(s) failed, were refused without being listed, or are listed "
            "(LISTED in validates_runner/teststream.py) but no longer fail so: fix the "
            f"runner, or update the list with the reason. Logs: {out_dir}\n"
        )
        return 1
    if not any(result.category == PASSED_ON_SPARK for result in results.values()):
        sys.stdout.write(
            f"No test passed with a pipeline on SparkStructuredRunner: the check proved "
            f"nothing. Logs: {out_dir}\n"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
