"""Generates docs/capabilities.md from the saved results of ``python -m validates_runner.report``.

Usage::

    python -m validates_runner.capabilities_doc [--results build/validates-runner/results.json]
                                                [--output docs/capabilities.md]

Per Beam capability, the document shows our status (the tests of Beam's runner suites that
passed, were skipped with which reason, or failed on SparkStructuredRunner) next to Beam's
portable Spark runner's status (the tests its ``spark_runner_test.py`` skips, read with
:mod:`validates_runner.portable_spark`). ``make validates-runner`` regenerates it after a
complete run; ``make capabilities`` regenerates it from the saved results without rerunning.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import logging
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validates_runner import portable_spark
from validates_runner.portable_spark import TestStatus

_LOGGER = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_RESULTS = ROOT / "build" / "validates-runner" / "results.json"
DEFAULT_OUTPUT = ROOT / "docs" / "capabilities.md"
RESULTS_FORMAT = 1


@dataclass(frozen=True)
class Capability:
    """A Beam capability and the tests exercising it (a regex on ``Class::test``)."""

    name: str
    pattern: str


# First match wins; the order resolves tests that touch two capabilities (a stateful test
# of a CombineFn's lifecycle counts as state and timers, which it needs).
CAPABILITIES: tuple[Capability, ...] = (
    Capability("Dynamic timers", r"dynamic_timer"),
    Capability("State-backed iterables (large GroupByKey values)", r"statebackedcodertest::"),
    Capability("Runner-initiated splits", r"splittest::|split_manager"),
    Capability("Draining (SDF truncation)", r"drain|truncate"),
    Capability(
        "TestStream, streaming and unbounded PCollections",
        r"teststream|unbounded|streaming|timestampcombinertest::|multi_triggered",
    ),
    Capability("Bundle finalization", r"finaliz|callbacks_with_exception"),
    Capability("State and timers", r"state|timer|deduplicat"),
    Capability("Metrics", r"metric|counter"),
    Capability("Splittable DoFn (SDF) and bounded reads", r"sdf|checkpoint|::test_read$"),
    Capability(
        "Custom window types and merging windows",
        r"custom_window|custom_merging_window|after_custom_window",
    ),
    Capability("Sliding windows", r"sliding"),
    Capability("Flatten and GroupByKey sharing an input", r"flatten_and_gbk"),
    Capability(
        "Side inputs",
        r"side_?input|sideinputstest::|as_dict|as_list|singleton|multimap",
    ),
    Capability("DoFn and CombineFn lifecycle", r"lifecycle"),
    Capability("Flatten", r"flatten"),
    Capability(
        "GroupByKey, Combine and Reshuffle",
        r"group_by_key|gbk|combine|pack_combiners|reshuffle",
    ),
    Capability("Batched DoFns", r"batch"),
    Capability("Windowing and timestamps", r"window|timestamp|first_pane"),
)
CORE = Capability("ParDo, Create, Impulse and other core behaviour", r"")


def capability_of(class_and_test: str) -> Capability:
    """The capability a test (``Class::test_name``) exercises."""
    key = class_and_test.lower()
    return next((c for c in CAPABILITIES if re.search(c.pattern, key)), CORE)


@dataclass
class OurTest:
    """One test of our run, as saved by report.py."""

    suite: str
    test_id: str
    outcome: str
    message: str
    kind: str  # for skips: "capability" or "upstream"

    @property
    def class_and_test(self) -> str:
        return "::".join(self.test_id.split("::")[-2:])


def load_results(path: Path) -> dict[str, Any]:
    """The results report.py saved."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path}: unknown results format {data.get('format')!r}")
    return data


def our_tests(data: dict[str, Any]) -> list[OurTest]:
    """Every test of the saved run."""
    return [
        OurTest(suite["suite"], r["test_id"], r["outcome"], r["message"], r.get("kind", ""))
        for suite in data["suites"]
        for r in suite["results"]
    ]


def fnapi_roots() -> dict[str, str]:
    """Our fnapi test classes and the Beam suite each runs (e.g. FnApiRunnerTest)."""
    module = "validates_runner.fn_runner_spark_test"
    path = portable_spark.module_path(module)
    if path is None:
        return {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            roots[node.name] = portable_spark.suite_root(
                portable_spark.load_class(module, node.name)
            )
    return roots


def beam_name(test: OurTest, roots: dict[str, str]) -> str:
    """The test named as in Beam: ``FnApiRunnerTest::test_x`` or ``module::Class::test``."""
    parts = test.test_id.split("::")
    if len(parts) >= 3 and parts[-2] in roots:
        return f"{roots[parts[-2]]}::{parts[-1]}"
    return test.test_id.removeprefix("apache_beam.")


@dataclass
class MarkerCount:
    """The ``it_validatesrunner`` markers in Beam's sources and the tests they cover."""

    markers: int
    modules: int
    class_markers: list[tuple[str, int]]  # (module::Class, tests defined in the class)


def count_markers(modules: list[str]) -> MarkerCount:
    """Counts ``@pytest.mark.it_validatesrunner`` decorators in ``modules`` (with ast)."""
    markers = 0
    class_markers: list[tuple[str, int]] = []
    for module in modules:
        path = portable_spark.module_path(module)
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                continue
            marked = any(
                ast.unparse(d).endswith("mark.it_validatesrunner") for d in node.decorator_list
            )
            if not marked:
                continue
            markers += 1
            if isinstance(node, ast.ClassDef):
                tests = sum(
                    isinstance(n, ast.FunctionDef) and n.name.startswith("test") for n in node.body
                )
                class_markers.append((f"{module}::{node.name}", tests))
    return MarkerCount(markers, len(modules), class_markers)


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _our_cell(test: OurTest | None) -> str:
    if test is None:
        return "not in our suites"
    if test.outcome == "passed":
        return "passed"
    if test.outcome == "skipped":
        who = {"upstream": "skipped by Beam"}
        return f"{who.get(test.kind, 'skipped')}: {_cell(test.message)}"
    return f"**failed**: {_cell(test.message.splitlines()[0] if test.message else '')}"


def _portable_cell(status: TestStatus | None, root: str) -> str:
    if status is None:
        return "not in its suite"
    where = (
        ""
        if status.defined_in == portable_spark.PORTABLE_SPARK_CLASS
        else (f" (in {status.defined_in})")
    )
    if status.status == portable_spark.RUNS:
        return "runs" if status.defined_in == root else f"runs (added by {status.defined_in})"
    return f"{status.status}{where}: {_cell(status.reason)}"


def render(data: dict[str, Any], generated_at: datetime.datetime) -> str:
    """The Markdown document."""
    tests = our_tests(data)
    roots = fnapi_roots()
    portable_class, portable = portable_spark.portable_spark_suite()
    portable_root = portable_spark.suite_root(portable_class)

    # Rows keyed by the Beam name, so our FnApiRunnerTest tests meet the portable runner's.
    ours: dict[str, OurTest] = {beam_name(t, roots): t for t in tests}
    portable_by_name = {f"{portable_root}::{name}": s for name, s in portable.items()}
    rows: dict[Capability, list[str]] = defaultdict(list)
    for name in sorted(set(ours) | set(portable_by_name)):
        rows[capability_of("::".join(name.split("::")[-2:]))].append(name)

    versions = data.get("versions", {})
    run = data.get("run", {})
    out = [
        "# Capabilities: SparkStructuredRunner next to Beam's portable Spark runner",
        "",
        "<!-- Generated by `python -m validates_runner.capabilities_doc` from the results of",
        "     `make validates-runner`; regenerate with `make capabilities`. Do not edit. -->",
        "",
        f"Generated {generated_at:%Y-%m-%d %H:%M} UTC from the `make validates-runner` run of "
        f"{run.get('finished_at', '?')} UTC "
        f"(saved in `{data.get('saved_as', 'build/validates-runner/results.json')}`).",
        "",
        "| | |",
        "|---|---|",
        f"| apache-beam | {versions.get('apache-beam', '?')} |",
        f"| pyspark (Spark) | {versions.get('pyspark', '?')} |",
        f"| Python | {versions.get('python', '?')} |",
        f"| Java | {_cell(versions.get('java', '?'))} |",
        f"| beam-spark-runner | {versions.get('beam-spark-runner', '?')} "
        f"(commit {versions.get('git_commit', '?')}) |",
        f"| Test pipeline options | `{run.get('test_pipeline_options', '')}` |",
    ]
    if run.get("k") or run.get("pytest_args") or len(data["suites"]) < 2:
        out += [
            "",
            f"**Partial run** (suites {[s['suite'] for s in data['suites']]}, "
            f"-k {run.get('k')!r}, pytest args {run.get('pytest_args')}): "
            "tests not selected are missing below.",
        ]
    incomplete = [s["suite"] for s in data["suites"] if not s.get("completed", True)]
    if incomplete:
        out += ["", f"**Incomplete suites** (pytest did not finish): {', '.join(incomplete)}."]

    out += [
        "",
        "**SparkStructuredRunner** (ours): Beam's own runner tests from the installed "
        "apache-beam, run by `make validates-runner` (`validates_runner/`): the `fnapi` suite "
        "(FnApiRunnerTest and friends, subclassed with our runner) and the `validatesrunner` "
        "suite (every `it_validatesrunner` test). A test is skipped here only for a "
        "capability we lack (reasons in `validates_runner/reasons.py`); tests that name their "
        "own runner or options have their pipelines forced onto ours (`FORCED_ONTO_SPARK` in "
        '`validates_runner/conftest.py`); "skipped by Beam" means Beam\'s test skips itself '
        "on every runner or environment.",
        "",
        "**Beam's portable Spark runner**: Beam's Python test of it, "
        f"`{portable_spark.PORTABLE_SPARK_MODULE.replace('.', '/')}.py` "
        f"(`{' → '.join(c.name for c in portable_class.chain())}`), read with `ast`: every "
        f"test of {portable_root} it skips (its own skips and inherited ones), runs reduced "
        "or adds. Its suite has only those tests; the `it_validatesrunner` tests and "
        'FnApiRunnerTest\'s sibling classes show "not in its suite". "runs" means it is '
        "not skipped there, not that it passed.",
        "",
        "## Summary",
        "",
        "| Capability | Ours: passed | skipped | failed | Portable Spark: in suite | skipped |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ordered = [c for c in (*CAPABILITIES, CORE) if rows.get(c)]
    totals: Counter[str] = Counter()
    for capability in ordered:
        names = rows[capability]
        counts = Counter(ours[n].outcome for n in names if n in ours)
        theirs = [portable_by_name[n] for n in names if n in portable_by_name]
        skipped = sum(s.status not in (portable_spark.RUNS, portable_spark.REDUCED) for s in theirs)
        totals.update(counts)
        totals["portable"] += len(theirs)
        totals["portable_skipped"] += skipped
        anchor = re.sub(r"[^a-z0-9 -]", "", capability.name.lower()).replace(" ", "-")
        out.append(
            f"| [{capability.name}](#{anchor}) | {counts['passed']} | {counts['skipped']} | "
            f"{counts['failed']} | {len(theirs)} | {skipped} |"
        )
    out.append(
        f"| **All** | {totals['passed']} | {totals['skipped']} | {totals['failed']} | "
        f"{totals['portable']} | {totals['portable_skipped']} |"
    )

    for capability in ordered:
        names = rows[capability]
        counts = Counter(ours[n].outcome for n in names if n in ours)
        theirs = [portable_by_name[n] for n in names if n in portable_by_name]
        skipped = sum(s.status not in (portable_spark.RUNS, portable_spark.REDUCED) for s in theirs)
        out += [
            "",
            f"## {capability.name}",
            "",
            f"Ours: {counts['passed']} passed, {counts['skipped']} skipped, "
            f"{counts['failed']} failed. Portable Spark runner: {skipped} of {len(theirs)} "
            "tests of its suite skipped.",
        ]
        notable = [
            n
            for n in names
            if (n in ours and ours[n].outcome != "passed")
            or (
                n in portable_by_name
                and (
                    portable_by_name[n].status != portable_spark.RUNS
                    or portable_by_name[n].defined_in != portable_root
                )
            )
            or n not in ours
        ]
        if notable:
            out += [
                "",
                "| Test | SparkStructuredRunner | Beam's portable Spark runner |",
                "|---|---|---|",
            ]
            out += [
                f"| `{n}` | {_our_cell(ours.get(n))} | "
                f"{_portable_cell(portable_by_name.get(n), portable_root)} |"
                for n in notable
            ]
        passing = [n for n in names if n not in notable]
        if passing:
            for label, group in (
                ("Passed here, run there too", [n for n in passing if n in portable_by_name]),
                (
                    "Passed here, not in its suite",
                    [n for n in passing if n not in portable_by_name],
                ),
            ):
                if group:
                    out += ["", f"{label}: {', '.join(f'`{n}`' for n in group)}."]

    out += _marker_section(data)
    return "\n".join(out) + "\n"


def _marker_section(data: dict[str, Any]) -> list[str]:
    modules = data.get("validatesrunner_modules") or []
    suite = next((s for s in data["suites"] if s["suite"] == "validatesrunner"), None)
    run = data.get("run", {})
    if not modules or suite is None or run.get("k") or run.get("pytest_args"):
        return []  # the count needs every it_validatesrunner test collected
    counted = count_markers(modules)
    collected = len(suite["results"])
    versions = data.get("versions", {})
    lines = [
        "",
        "## How many `it_validatesrunner` tests: 41 or 47?",
        "",
        f"apache-beam {versions.get('apache-beam', '?')} has **{counted.markers}** "
        f"`@pytest.mark.it_validatesrunner` markers in {counted.modules} test modules (counted "
        f"with `ast` by `validates_runner/capabilities_doc.py`); pytest collects "
        f"**{collected}** tests from them, the `validatesrunner` suite above. Counting the "
        'markers (`grep -c`) gives the first number, the issue\'s "41"; they differ because a '
        "marker on a class marks each of its tests, and parameterized tests count once per "
        "parameter set. Class markers:",
        "",
    ]
    lines += [
        f"- `{name}`: {tests} test{'s' if tests != 1 else ''}"
        for name, tests in counted.class_markers
    ]
    expanded = counted.markers + sum(tests - 1 for _, tests in counted.class_markers)
    if expanded != collected:
        lines += [
            "",
            f"Expanding the class markers gives {expanded} tests; parameterized tests make up "
            f"the difference of {collected - expanded} (e.g. `PTransformTest::"
            "test_group_by_key_importable_special_types`, collected once per parameter).",
        ]
    return lines


def write(results: Path, output: Path) -> None:
    """Renders ``results`` into ``output``."""
    data = load_results(results)
    text = render(data, datetime.datetime.now(datetime.timezone.utc))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    _LOGGER.info("Wrote %s from %s", output, results)


def main(argv: list[str] | None = None) -> int:
    """Command line: regenerate the document from saved results."""
    parser = argparse.ArgumentParser(
        prog="python -m validates_runner.capabilities_doc",
        description="Generate docs/capabilities.md from validates_runner.report's results.",
    )
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not args.results.exists():
        _LOGGER.error("No results at %s: run `make validates-runner` first", args.results)
        return 2
    write(args.results, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
