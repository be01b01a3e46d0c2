"""validates_runner.teststream: how Beam's TestStream test results are read."""

from __future__ import annotations

from pathlib import Path

import pytest

from validates_runner import teststream

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname=".venv.lib.site-packages.apache_beam.transforms.trigger_test.T" name="ok"/>
<testcase classname="apache_beam.transforms.trigger_test.T" name="refused">
  <failure message="beam_spark_runner.errors.UnsupportedFeatureError: Transform 'S' is a
  TestStream (beam:transform:teststream:v1) that needs streaming execution">...</failure>
</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="wrong">
  <failure message="AssertionError: Unmatched output">BeamAssertException</failure>
</testcase>
<testcase classname="apache_beam.transforms.trigger_test.T" name="enum">
  <error message="RuntimeError">ValueError: unknown enum label "OUTPUT_AT_EARLIEST_TRANSFORMED"
  </error>
</testcase>
<testcase classname="apache_beam.testing.test_stream_test.U" name="skip">
  <skipped message="Beam skips it"/>
</testcase>
</testsuite></testsuites>
"""


def test_each_test_is_passed_refused_skipped_or_unexpected(tmp_path: Path) -> None:
    junit = tmp_path / "results.xml"
    junit.write_text(JUNIT, encoding="utf-8")
    prefix = "apache_beam.transforms.trigger_test.T::"
    assert teststream.read_results(junit) == {
        prefix + "ok": teststream.PASSED,
        prefix + "refused": teststream.REFUSED,
        prefix + "wrong": teststream.UNEXPECTED,
        prefix + "enum": teststream.BEAM_CANNOT_TRANSLATE,
        "apache_beam.testing.test_stream_test.U::skip": teststream.SKIPPED,
    }


def test_any_refusal_before_spark_is_a_refusal() -> None:
    text = "UnsupportedFeatureError: Transform 'X' reads side input 'y'; not supported yet"
    assert teststream.classify(text) == teststream.REFUSED


def test_only_listed_tests_may_fail_by_reading_the_test_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed = "apache_beam.transforms.userstate_test.T::records"
    monkeypatch.setattr(teststream, "READS_TEST_PROCESS_MEMORY", {"T::records": "no attribute"})
    failure = "AttributeError: type object 'T' has no attribute 'all'"
    assert teststream.classify(failure, listed) == teststream.TEST_PROCESS_MEMORY
    # Listed, but failing another way; or failing that way, but not listed.
    assert teststream.classify("AssertionError: [] != [1]", listed) == teststream.UNEXPECTED
    assert teststream.classify(failure, listed + "2") == teststream.UNEXPECTED
