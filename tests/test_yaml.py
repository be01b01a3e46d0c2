"""A Beam YAML pipeline on this runner (``pip install beam-spark-runner[yaml]``)."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

PIPELINE = textwrap.dedent(
    """
    pipeline:
      type: chain
      transforms:
        - type: ReadFromCsv
          config:
            path: {source}
        - type: Filter
          config:
            language: python
            keep: "amount > 3"
        - type: Combine
          config:
            group_by: city
            combine:
              amount: sum
        - type: LogForTesting
        - type: MapToFields
          config:
            language: python
            fields:
              line: "city + ':' + str(amount)"
        - type: WriteToText
          config:
            path: {output}
    """
)


def test_a_yaml_pipeline_runs_on_spark(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
) -> None:
    source = tmp_path / "sales.csv"
    source.write_text("city,amount\nams,3\nber,5\nams,4\nber,9\nosl,1\n", encoding="utf-8")
    spec = tmp_path / "pipeline.yaml"
    spec.write_text(PIPELINE.format(source=source, output=tmp_path / "totals"), encoding="utf-8")
    result = run_python(
        ["-m", "apache_beam.yaml.main", f"--yaml_pipeline_file={spec}", *beam_options],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(
        line for path in tmp_path.glob("totals*") for line in path.read_text().splitlines()
    )
    assert lines == ["ams:4", "ber:14"]
    assert "finished on Spark in" in result.stderr
    # LogForTesting logs each element at INFO in a worker; the record reaches the driver.
    logged = [line for line in result.stderr.splitlines() if "LogForTesting" in line]
    assert len([line for line in logged if '"city": "ber"' in line]) == 1, logged
