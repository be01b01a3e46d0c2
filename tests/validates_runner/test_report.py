"""validates_runner.report: when a run of Beam's suites passes."""

from __future__ import annotations

from pathlib import Path

from validates_runner import report
from validates_runner.report import SuiteRun, exit_code, format_report


def _run(exit: int, outcomes: list[str], junit_written: bool = True) -> SuiteRun:
    results = [report.TestResult(f"t{i}", outcome) for i, outcome in enumerate(outcomes)]
    return SuiteRun("fnapi", exit, 1.0, Path("fnapi.log"), junit_written, results)


def test_a_suite_that_collected_nothing_fails_the_run() -> None:
    # pytest's exit code 5: no tests collected, e.g. a -k that matches nothing.
    empty = _run(5, [])
    assert empty.completed
    assert exit_code([empty]) == 1
    assert exit_code([_run(0, ["passed"]), empty]) == 1
    assert exit_code([]) == 1
    assert "[fnapi] pytest collected no tests" in format_report([empty])


def test_a_run_passes_only_if_every_suite_completed_without_failures() -> None:
    assert exit_code([_run(0, ["passed", "skipped"])]) == 0
    assert exit_code([_run(1, ["passed", "failed"])]) == 1
    assert exit_code([_run(0, ["passed"], junit_written=False)]) == 1
