"""validates_runner.teststream: how Beam's TestStream test results are read and checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from validates_runner import teststream
from validates_runner.teststream import Listed, Result

MODULE = "apache_beam.transforms.trigger_test.T::"
REFUSAL = "carry their own windows"
LISTED = {
    MODULE + "refused": Listed(teststream.REFUSED, REFUSAL, "WindowedValueHolder elements"),
    MODULE + "fixed": Listed(teststream.REFUSED, REFUSAL, "WindowedValueHolder elements"),
    MODULE + "enum": Listed(teststream.BEAM_CANNOT_TRANSLATE, "OUTPUT_AT_EARLIEST", "Beam's"),
    MODULE + "enum2": Listed(teststream.BEAM_CANNOT_TRANSLATE, "OUTPUT_AT_EARLIEST", "Beam's"),
    MODULE + "memory": Listed(teststream.TEST_PROCESS_MEMORY, "no attribute 'all'", "memory"),
}


def _ran(count: int) -> str:
    return f'<properties><property name="spark_pipelines_ran" value="{count}"/></properties>'


JUNIT = f"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname=".venv.lib.site-packages.apache_beam.transforms.trigger_test.T" name="ok">
  {_ran(2)}</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="no_pipeline">{_ran(0)}</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="refused">{_ran(0)}
  <failure message="beam_spark_runner.errors.UnsupportedFeatureError: Transform 'S' is a
  TestStream whose elements carry their own windows">...</failure>
</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="refused_otherwise">
  <failure message="UnsupportedFeatureError: Stage 'X' reads side input 'y'">...</failure>
</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="fixed">{_ran(1)}</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="wrong">{_ran(1)}
  <failure message="AssertionError: Unmatched output">BeamAssertException</failure>
</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="enum">
  <error message="RuntimeError">ValueError: unknown enum label "OUTPUT_AT_EARLIEST"</error>
</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="memory">
  <failure message="AssertionError: [] != [1]">...</failure>
</testcase>
<testcase classname="U" name="enum_outside_rootdir"><properties>
  <property name="beam_test_id" value="apache_beam.transforms.trigger_test.T::enum2"/>
  </properties>
  <error message="RuntimeError">ValueError: unknown enum label "OUTPUT_AT_EARLIEST"</error>
</testcase>
<testcase classname="apache_beam.testing.test_stream_test.U" name="skip">
  <skipped message="Beam skips it"/>
</testcase>
</testsuite></testsuites>
"""


@pytest.fixture
def results(tmp_path: Path) -> dict[str, Result]:
    junit = tmp_path / "results.xml"
    junit.write_text(JUNIT, encoding="utf-8")
    return teststream.read_results(junit, LISTED)


def test_each_test_gets_its_category(results: dict[str, Result]) -> None:
    assert {test: result.category for test, result in results.items()} == {
        MODULE + "ok": teststream.PASSED_ON_SPARK,
        MODULE + "no_pipeline": teststream.PASSED_NO_PIPELINE,
        MODULE + "refused": teststream.REFUSED,
        # Refused, but not listed: the check fails.
        MODULE + "refused_otherwise": teststream.REFUSED_UNLISTED,
        # Listed as refused, but it passed: the list is out of date.
        MODULE + "fixed": teststream.NO_LONGER_LISTED,
        MODULE + "wrong": teststream.UNEXPECTED,
        MODULE + "enum": teststream.BEAM_CANNOT_TRANSLATE,
        # Its id from the plugin's property: the classname lacks the module when Beam is
        # installed outside pytest's rootdir.
        MODULE + "enum2": teststream.BEAM_CANNOT_TRANSLATE,
        # Listed as reading the test process's memory, but failing another way.
        MODULE + "memory": teststream.UNEXPECTED,
        "apache_beam.testing.test_stream_test.U::skip": teststream.SKIPPED,
    }
    assert results[MODULE + "ok"].pipelines_ran == 2
    assert results[MODULE + "refused_otherwise"].pipelines_ran is None


def test_the_summary_counts_passes_with_and_without_a_pipeline(
    results: dict[str, Result],
) -> None:
    assert teststream.summary_line(results) == (
        "2 passed (1 ran a pipeline on SparkStructuredRunner, 1 ran none) / 1 refused by "
        "name / 2 excused by name / 1 skipped by Beam / 4 failed"
    )


def test_the_report_names_each_refusal_and_what_no_longer_fails(
    monkeypatch: pytest.MonkeyPatch, results: dict[str, Result]
) -> None:
    monkeypatch.setattr(teststream, "LISTED", LISTED)
    lines = teststream.report(results)
    assert f"  {teststream.REFUSED}: {MODULE}refused (WindowedValueHolder elements)" in lines
    assert any(
        line.startswith(f"  {teststream.NO_LONGER_LISTED}: {MODULE}fixed (passed; listed")
        for line in lines
    )
    assert any(
        line.startswith(f"  {teststream.REFUSED_UNLISTED}: {MODULE}refused_otherwise")
        for line in lines
    )
    assert not any("listed but not collected" in line for line in lines)


def _result(category: str, ran: int = 1) -> Result:
    return Result(category, ran)


@pytest.mark.parametrize(
    ("results", "code"),
    [
        ({}, 1),  # nothing collected
        ({"a": _result(teststream.PASSED_NO_PIPELINE, 0)}, 1),  # no pipeline ran here
        ({"a": _result(teststream.PASSED_ON_SPARK)}, 0),
        ({"a": _result(teststream.PASSED_ON_SPARK), "b": _result(teststream.REFUSED)}, 0),
        ({"a": _result(teststream.PASSED_ON_SPARK), "b": _result(teststream.UNEXPECTED)}, 1),
        (
            {"a": _result(teststream.PASSED_ON_SPARK), "b": _result(teststream.REFUSED_UNLISTED)},
            1,
        ),
        (
            {"a": _result(teststream.PASSED_ON_SPARK), "b": _result(teststream.NO_LONGER_LISTED)},
            1,
        ),
    ],
)
def test_the_check_passes_only_when_every_failure_is_listed_and_a_pipeline_ran(
    results: dict[str, Result], code: int, tmp_path: Path
) -> None:
    assert teststream.check(results, tmp_path) == code


def test_every_listed_test_says_how_it_fails_and_why() -> None:
    for test, entry in teststream.LISTED.items():
        assert test.startswith("apache_beam.") and "::" in test
        assert entry.category in (teststream.REFUSED, *teststream.EXCUSED)
        assert entry.expect and entry.reason


@pytest.mark.parametrize(
    ("test_id", "module"),
    [
        ("apache_beam.transforms.trigger_test.T::ok", "apache_beam.transforms.trigger_test"),
        ("apache_beam.io.fileio_test::test_x", "apache_beam.io.fileio_test"),
        (
            "apache_beam.examples.cookbook.ordered_window_elements.streaming_test.OrderedTest::t",
            "apache_beam.examples.cookbook.ordered_window_elements.streaming_test",
        ),
    ],
)
def test_a_test_id_names_its_module(test_id: str, module: str) -> None:
    assert teststream.module_of(test_id) == module


def test_the_report_sums_up_each_module(
    monkeypatch: pytest.MonkeyPatch, results: dict[str, Result]
) -> None:
    monkeypatch.setattr(teststream, "LISTED", LISTED)
    lines = teststream.report(results)
    per_module = lines[lines.index("Per module:") + 1 : -1]
    assert per_module == [
        "  apache_beam.testing.test_stream_test: 0 passed (0 ran a pipeline on "
        "SparkStructuredRunner, 0 ran none) / 0 refused by name / 0 excused by name / "
        "1 skipped by Beam / 0 failed",
        "  apache_beam.transforms.trigger_test: 2 passed (1 ran a pipeline on "
        "SparkStructuredRunner, 1 ran none) / 1 refused by name / 2 excused by name / "
        "0 skipped by Beam / 4 failed",
    ]


def test_the_report_names_listed_tests_missing_only_from_the_modules_that_ran(
    results: dict[str, Result],
) -> None:
    listed = {
        **LISTED,
        MODULE + "gone": Listed(teststream.TEST_PROCESS_MEMORY, "x", "memory"),
        "apache_beam.io.fileio_test.W::not_run": Listed(teststream.ONE_BUNDLE, "x", "one"),
    }
    lines = teststream.report(results, listed)
    missing = [line for line in lines if "listed but not collected" in line]
    assert missing == [
        f"  listed but not collected (left out by -k or gone from Beam): ['{MODULE}gone']"
    ]


def test_a_listed_failure_may_show_in_several_ways_and_no_other() -> None:
    listed = Listed(teststream.TEST_PROCESS_MEMORY, "no attribute 'all'", "memory", also=("!= []",))
    assert listed.matches("AttributeError: type object 'T' has no attribute 'all'")
    assert listed.matches("AssertionError: Lists differ: [1, 2] != []")
    assert not listed.matches("AssertionError: Lists differ: [1, 2] != [1]")
    assert not Listed(teststream.TEST_PROCESS_MEMORY, "x", "memory").matches("!= []")
