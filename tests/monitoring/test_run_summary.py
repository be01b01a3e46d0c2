"""The summary a finished run logs at the default level: duration and files written."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner.monitoring import run_summary


def test_a_run_says_how_long_it_took_and_which_files_it_wrote(
    beam_options: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = tmp_path / "counts-stale.txt"
    stale.write_text("from an earlier run\n")
    os.utime(stale, (time.time() - 60, time.time() - 60))
    caplog.set_level(logging.WARNING, logger=run_summary.SUMMARY_LOGGER.name)
    with beam.Pipeline(options=PipelineOptions([*beam_options, "--job_name=summary"])) as p:
        (
            p
            | beam.Create(["a", "b"])
            | beam.io.WriteToText(str(tmp_path / "counts"), file_name_suffix=".txt", num_shards=1)
        )
    summaries = [r for r in caplog.records if r.name == run_summary.SUMMARY_LOGGER.name]
    assert len(summaries) == 1
    assert summaries[0].levelno == logging.WARNING  # shown under Python's default config
    message = summaries[0].getMessage()
    assert message.startswith("Beam pipeline summary finished on Spark in ")
    assert message.endswith(f"it wrote 1 file: {tmp_path / 'counts-00000-of-00001.txt'}.")


def test_describe_lists_a_few_files() -> None:
    files = [f"/out/part-{i}" for i in range(7)]
    assert run_summary.describe("job", 1.25, []) == "Beam pipeline job finished on Spark in 1.2 s."
    assert run_summary.describe("job", 2.0, files).endswith(
        "it wrote 7 files: /out/part-0, /out/part-1, /out/part-2, /out/part-3, /out/part-4 "
        "and 2 more."
    )


@pytest.mark.slow
def test_a_normal_run_is_quiet_and_ends_with_the_summary(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
) -> None:
    script = tmp_path / "wordcount.py"
    script.write_text(
        "import sys\nimport apache_beam as beam\n"
        "from apache_beam.options.pipeline_options import PipelineOptions\n"
        "with beam.Pipeline(options=PipelineOptions(sys.argv[2:])) as p:\n"
        "    (p | beam.Create(['a b', 'b']) | beam.FlatMap(str.split)\n"
        "       | beam.combiners.Count.PerElement() | beam.io.WriteToText(sys.argv[1]))\n",
        encoding="utf-8",
    )
    result = run_python([str(script), str(tmp_path / "out"), *beam_options], timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    for noise in ("log4j profile", "NativeCodeLoader", "loopback address", "SparkUI"):
        assert not [line for line in lines if noise in line], lines
    # Beam's own import-time warning, printed once by the driver as on DirectRunner.
    assert len([line for line in lines if "apitools not found" in line]) <= 1, lines
    assert "finished on Spark in" in lines[-1] and "out-00000-of-" in lines[-1]
    assert len(lines) <= 4, lines
