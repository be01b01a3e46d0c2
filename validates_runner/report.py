"""Runs Beam's runner test suites on SparkStructuredRunner and prints a summary.

Usage::

    python -m validates_runner.report [--suite fnapi|validatesrunner|all] [-k EXPR]
                                      [--out-dir DIR] [--verbose] [-- PYTEST_ARGS...]

Each suite runs in its own pytest process (one SparkSession each) with junitxml output;
the report prints passed/skipped/failed per suite, the skipped tests with their reasons and
the failed tests with the root-cause error. It exits non-zero if a test failed or a suite
could not run or collected no tests.

The results are saved as JSON (``results.json`` in ``--out-dir``). A complete run (both
suites, no ``-k``, no extra pytest arguments) also saves them as
``build/validates-runner/results.json`` and regenerates ``docs/capabilities.md`` from them
(:mod:`validates_runner.capabilities_doc`; ``make capabilities`` redoes only that).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from validates_runner import capabilities_doc
from validates_runner.conftest import (
    DEFAULT_TEST_PIPELINE_OPTIONS,
    KEY_PROPERTY,
    RUNNER_PROPERTY,
)
from validates_runner.reasons import HARNESS_REASONS

_LOGGER = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITES = ("fnapi", "validatesrunner")
RUNNER_NAME = "SparkStructuredRunner"
VALIDATES_RUNNER_MARKER = "pytest.mark.it_validatesrunner"
# pytest exit codes that still mean "the suite ran": all passed, some failed, none collected.
_RAN_EXIT_CODES = (0, 1, 5)


CANONICAL_RESULTS = capabilities_doc.DEFAULT_RESULTS
CAPABILITIES_DOC = capabilities_doc.DEFAULT_OUTPUT


@dataclass
class TestResult:
    """The outcome of one test."""

    test_id: str
    outcome: str  # "passed", "skipped" or "failed"
    message: str = ""
    runners: tuple[str, ...] = ()


@dataclass
class SuiteRun:
    """One suite's pytest run."""

    suite: str
    exit_code: int
    seconds: float
    log: Path
    junit_written: bool = False
    results: list[TestResult] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """Whether pytest ran to the end and wrote its junitxml."""
        return self.junit_written and self.exit_code in _RAN_EXIT_CODES

    def count(self, outcome: str) -> int:
        """Number of tests with ``outcome``."""
        return sum(1 for r in self.results if r.outcome == outcome)


def validates_runner_modules() -> list[str]:
    """Modules of the installed apache_beam with tests marked ``it_validatesrunner``."""
    spec = importlib.util.find_spec("apache_beam")  # finds Beam without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("apache_beam is not installed in this interpreter")
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    modules = []
    for path in sorted(package.rglob("*_test.py")):
        if VALIDATES_RUNNER_MARKER in path.read_text(encoding="utf-8", errors="replace"):
            relative = path.relative_to(package.parent).with_suffix("")
            modules.append(".".join(relative.parts))
    return modules


def plugin_pytest_command(plugin: str, junit: Path) -> list[str]:
    """A quiet pytest command line with ``plugin`` standing in for Beam's conftest."""
    return [
        sys.executable,
        "-m",
        "pytest",
        # The plugin stands in for Beam's conftest; no other conftest applies (and loading
        # validates_runner/conftest.py a second time as a conftest would clash with -p).
        "--noconftest",
        "-p",
        plugin,
        "-p",
        "no:cacheprovider",
        "-q",
        "--rootdir",
        str(ROOT),
        f"--junitxml={junit}",
    ]


def pytest_command(suite: str, junit: Path, args: argparse.Namespace) -> list[str]:
    """The pytest command line running ``suite``."""
    command = plugin_pytest_command("validates_runner.conftest", junit)
    command.append(f"--test-pipeline-options={args.test_pipeline_options}")
    if args.k:
        command += ["-k", args.k]
    if suite == "fnapi":
        command.append(str(HERE / "fn_runner_spark_test.py"))
    else:
        command += ["-m", "it_validatesrunner", "--pyargs", *validates_runner_modules()]
    return command + list(args.pytest_args)


def _pump(stream: IO[str], log: IO[str], echo: bool) -> None:
    for line in stream:
        log.write(line)
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()


def run_suite(suite: str, args: argparse.Namespace, out_dir: Path) -> SuiteRun:
    """Runs one suite in its own pytest process and reads its junitxml."""
    junit = out_dir / f"{suite}.xml"
    log = out_dir / f"{suite}.log"
    junit.unlink(missing_ok=True)
    command = pytest_command(suite, junit, args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    _LOGGER.info("Running suite %s (log: %s)", suite, log)
    _LOGGER.debug("Command: %s", command)
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as log_file:
        log_file.write(" ".join(command) + "\n")
        log_file.flush()
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert process.stdout is not None
        pump = threading.Thread(target=_pump, args=(process.stdout, log_file, args.verbose))
        pump.start()
        try:
            exit_code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            _LOGGER.error("Suite %s exceeded --timeout=%.0fs; killing it", suite, args.timeout)
            os.killpg(process.pid, signal.SIGKILL)
            exit_code = process.wait()
        except KeyboardInterrupt:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
        finally:
            pump.join()
    seconds = time.monotonic() - start
    run = SuiteRun(suite, exit_code, seconds, log)
    if junit.exists():
        run.junit_written = True
        run.results = parse_junit(junit)
    return run


def _short_id(classname: str, name: str) -> str:
    match = re.search(r"(apache_beam|validates_runner)\..*", classname)
    return f"{match.group(0) if match else classname}::{name}"


def root_cause(element: ET.Element) -> str:
    """A few lines naming the error of a failed test."""
    message = (element.get("message") or "").strip()
    text = element.text or ""
    lines = [message.splitlines()[0][:300]] if message else []
    # The last "SomeError: ..." line pytest marked with "E" is the innermost error, e.g. the
    # user-code error inside a PipelineExecutionError.
    errors = [
        line[1:].strip()
        for line in text.splitlines()
        if line.startswith("E ") and re.match(r"\s*[\w.]+(Error|Exception|Exit)\b", line[1:])
    ]
    if errors and (not lines or errors[-1][:300] != lines[0]):
        lines.append(errors[-1][:300])
    return "\n".join(lines)


def parse_junit(path: Path) -> list[TestResult]:
    """The results in a pytest junitxml file."""
    results = []
    for case in ET.parse(path).iter("testcase"):
        properties = [
            (p.get("name"), p.get("value") or "") for p in case.iter("property") if p.get("name")
        ]
        keys = [value for name, value in properties if name == KEY_PROPERTY]
        test_id = keys[0] if keys else _short_id(case.get("classname", ""), case.get("name", ""))
        runners = tuple(value for name, value in properties if name == RUNNER_PROPERTY)
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            results.append(TestResult(test_id, "failed", root_cause(failure), runners))
        elif skipped is not None:
            reason = skipped.get("message") or ""
            results.append(TestResult(test_id, "skipped", reason, runners))
        else:
            results.append(TestResult(test_id, "passed", "", runners))
    return results


def skip_kind(reason: str) -> str:
    """Who skipped: "capability" (this harness), else "upstream" (Beam)."""
    if any(reason.startswith(known) for known in HARNESS_REASONS):
        return "capability"
    return "upstream"


def format_report(runs: list[SuiteRun]) -> str:
    """The summary table, skipped tests with reasons and failed tests with their errors."""
    out = []
    header = f"{'suite':<16}{'passed':>8}{'skipped':>9}{'failed':>8}{'total':>7}{'time':>9}"
    out += [header, "-" * len(header)]
    for run in runs:
        status = "" if run.completed else f"  (incomplete: pytest exit code {run.exit_code})"
        out.append(
            f"{run.suite:<16}{run.count('passed'):>8}{run.count('skipped'):>9}"
            f"{run.count('failed'):>8}{len(run.results):>7}{run.seconds:>8.0f}s{status}"
        )
    if len(runs) > 1:
        total = sum(len(r.results) for r in runs)
        out.append(
            f"{'all':<16}{sum(r.count('passed') for r in runs):>8}"
            f"{sum(r.count('skipped') for r in runs):>9}{sum(r.count('failed') for r in runs):>8}"
            f"{total:>7}{sum(r.seconds for r in runs):>8.0f}s"
        )

    for title, kind in (
        ("Skipped on this runner (missing capability)", "capability"),
        ("Skipped by Beam's tests themselves or the environment", "upstream"),
    ):
        by_reason: dict[str, list[str]] = defaultdict(list)
        for run in runs:
            for r in run.results:
                if r.outcome == "skipped" and skip_kind(r.message) == kind:
                    by_reason[r.message].append(f"[{run.suite}] {r.test_id}")
        if by_reason:
            out += ["", f"{title}: {sum(len(v) for v in by_reason.values())}"]
            for reason, tests in sorted(by_reason.items()):
                out.append(f"  {reason}")
                out += [f"    - {test}" for test in sorted(tests)]

    other_runner = [
        f"  [{run.suite}] {r.test_id}: ran on {', '.join(r.runners)}"
        for run in runs
        for r in run.results
        if r.outcome == "passed" and r.runners and RUNNER_NAME not in r.runners
    ]
    if other_runner:
        out += ["", "Passed without running a pipeline on SparkStructuredRunner:", *other_runner]

    failed = [(run.suite, r) for run in runs for r in run.results if r.outcome == "failed"]
    out += ["", f"Failed: {len(failed)}"]
    for suite, r in failed:
        out.append(f"  [{suite}] {r.test_id}")
        out += [f"      {line}" for line in r.message.splitlines()]
    for run in runs:
        if not run.completed:
            out.append(
                f"  [{run.suite}] pytest did not complete (exit {run.exit_code}); see {run.log}"
            )
        elif not run.results:
            out.append(f"  [{run.suite}] pytest collected no tests: it proved nothing")
    if runs:
        out += ["", f"Logs and junitxml: {runs[0].log.parent}"]
    return "\n".join(out)


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str:
    """The checked-out commit, with "+changes" if the work tree differs (read-only git)."""
    git = shutil.which("git")
    if git is None:
        return "unknown"

    def output(*args: str) -> str:
        return subprocess.run(
            [git, *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        head = output("rev-parse", "--short", "HEAD")
        status = output("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+changes" if status else head


def _java() -> str:
    from beam_spark_runner.spark.java import java_executable, java_version

    java = java_executable()
    version = java_version(java) if java else None
    return f"{version} ({java})" if version else "unknown"


def versions() -> dict[str, str]:
    """The versions the suites ran with (the suites run in this interpreter)."""
    return {
        "apache-beam": _distribution_version("apache-beam"),
        "pyspark": _distribution_version("pyspark"),
        "beam-spark-runner": _distribution_version("beam-spark-runner"),
        "python": platform.python_version(),
        "java": _java(),
        "git_commit": _git_commit(),
    }


def is_complete_run(args: argparse.Namespace) -> bool:
    """Whether the run covers everything: both suites, no test selection."""
    return args.suite == "all" and not args.k and not args.pytest_args


def save_results(
    runs: list[SuiteRun], args: argparse.Namespace, path: Path, started: datetime.datetime
) -> None:
    """Saves the runs' results as JSON, the input of ``capabilities_doc``."""
    data = {
        "format": capabilities_doc.RESULTS_FORMAT,
        "saved_as": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "run": {
            "started_at": f"{started:%Y-%m-%d %H:%M}",
            "finished_at": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
            "test_pipeline_options": args.test_pipeline_options,
            "k": args.k,
            "pytest_args": list(args.pytest_args),
        },
        "versions": versions(),
        "validatesrunner_modules": validates_runner_modules()
        if any(run.suite == "validatesrunner" for run in runs)
        else [],
        "suites": [
            {
                "suite": run.suite,
                "exit_code": run.exit_code,
                "seconds": round(run.seconds, 1),
                "completed": run.completed,
                "results": [
                    {
                        "test_id": r.test_id,
                        "outcome": r.outcome,
                        "message": r.message,
                        "kind": skip_kind(r.message) if r.outcome == "skipped" else "",
                        "runners": list(r.runners),
                    }
                    for r in run.results
                ],
            }
            for run in runs
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    _LOGGER.info("Saved results to %s", path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m validates_runner.report",
        description="Run Beam's runner test suites on SparkStructuredRunner and summarize.",
    )
    parser.add_argument("--suite", choices=(*SUITES, "all"), default="all")
    parser.add_argument("-k", default=None, help="pytest -k expression, passed through")
    parser.add_argument(
        "--test-pipeline-options",
        default=DEFAULT_TEST_PIPELINE_OPTIONS,
        help=f"options for the tests' pipelines (default: {DEFAULT_TEST_PIPELINE_OPTIONS!r})",
    )
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="where to write logs and junitxml"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds allowed per suite (default 3600)"
    )
    parser.add_argument("--verbose", action="store_true", help="also stream pytest's output")
    parser.add_argument(
        "--write-capabilities",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"write the capabilities document there (default after a complete run: "
        f"{CAPABILITIES_DOC.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--no-capabilities",
        action="store_true",
        help="do not save build/validates-runner/results.json nor write the document",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Runs the chosen suites, prints the report; 0 only if nothing failed."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="validates_runner-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    suites = SUITES if args.suite == "all" else (args.suite,)
    started = datetime.datetime.now(datetime.timezone.utc)
    runs = [run_suite(suite, args, out_dir) for suite in suites]
    print(format_report(runs))
    results = out_dir / "results.json"
    save_results(runs, args, results, started)
    if is_complete_run(args) and not args.no_capabilities:
        save_results(runs, args, CANONICAL_RESULTS, started)
        results = CANONICAL_RESULTS
    document = args.write_capabilities
    if document is None and is_complete_run(args) and not args.no_capabilities:
        document = CAPABILITIES_DOC
    if document is not None:
        capabilities_doc.write(results, document)
    return exit_code(runs)


def exit_code(runs: list[SuiteRun]) -> int:
    """0 only if every suite ran to the end, collected tests, and none failed."""
    failed = any(run.count("failed") for run in runs)
    broken = not all(run.completed for run in runs)
    empty = not runs or any(not run.results for run in runs)
    return 1 if failed or broken or empty else 0


if __name__ == "__main__":
    sys.exit(main())
