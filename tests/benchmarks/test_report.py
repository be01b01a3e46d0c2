"""The batch benchmark's report: ours' CPU against the user code alone, beside DirectRunner's."""

from __future__ import annotations

from typing import Any

from benchmarks import report


def _result(runner: str, cpu: float, results: int = 10, checksum: int = 55) -> dict[str, Any]:
    return {
        "workload": "w",
        "runner": runner,
        "status": "ok",
        "median_seconds": cpu,
        "median_cpu_seconds": cpu,
        "results": results,
        "checksum": checksum,
    }


def _row(table: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith("| w "))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_cpu_table_sets_ours_and_direct_runners_cpu_against_the_user_code() -> None:
    results = [
        _result("user-code", 10.0),
        _result("ours", 12.0),
        _result("direct-mp", 30.0),
        _result("direct", 20.0),
    ]
    assert _row(report.cpu_table(results)) == [
        "w",
        "10.00",
        "12.00",
        "1.20",
        "yes",
        "30.00",
        "3.00",
        "20.00",
        "2.00",
    ]


def test_cpu_table_says_no_above_the_target_and_when_outputs_differ() -> None:
    above = [_result("user-code", 10.0), _result("ours", 13.0)]
    assert _row(report.cpu_table(above))[4] == "no"
    differ = [_result("user-code", 10.0), _result("ours", 11.0, results=0, checksum=0)]
    assert _row(report.cpu_table(differ))[4] == "yes (outputs differ)"


def test_the_user_code_takes_part_in_the_same_output_rule() -> None:
    results = [
        _result("ours", 1.0),
        _result("pyspark", 1.0, results=9),
        _result("user-code", 1.0, results=9),
    ]
    verdicts = report.consistency(results)
    assert verdicts[("w", "ours")] == "DIFFERENT"
    assert verdicts[("w", "user-code")] == "same"


def test_wall_target_is_within_1_3x_of_the_faster_pyspark_line() -> None:
    results = [
        _result("ours", 13.5),
        _result("pyspark", 11.0),
        _result("pyspark-arrow", 10.0),
    ]
    table = report.ratio_table(results)
    assert "within 1.3x of PySpark?" in table
    assert _row(table)[10] == "no"  # 13.5 s against the Arrow line's 10 s
