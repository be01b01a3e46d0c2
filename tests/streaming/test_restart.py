"""Exactly once across restarts: a streaming driver SIGKILLed and restarted (long).

The unbounded pipeline of ``tests/cluster/streaming_driver.py`` is killed mid-batch,
during its sink's commit and after a commit, restarted each time with the same
``--spark_checkpoint_location``, and must write exactly the files of an uninterrupted run
(DirectRunner's, which ``test_streaming.py`` shows ours equal). Each driver run starts a JVM
and the query: several minutes in all, so it runs in ``make restart-test``, not in
``make unit-test``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from tests.cluster.restarts import (
    AFTER_COMMIT,
    MID_BATCH,
    SINK_COMMIT,
    STREAMING_DRIVER,
    run_with_kills,
    written,
)

pytestmark = [
    pytest.mark.restart,
    pytest.mark.skipif(
        pyspark_version() < OLDEST_STREAMING_SPARK, reason="streaming needs PySpark 3.5+"
    ),
]

# Long enough that the query still runs at each kill point: a driver's start and first
# micro-batch (Python workers for every level) take 20-60 s on a busy 2-core machine, and a
# restarted query catches up at once with what became due meanwhile.
SECONDS = 240


def _env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _command(
    output: Path, start: float, runner: list[str], seconds: int = SECONDS, sink: str = "text"
) -> list[str]:
    return [
        sys.executable,
        str(STREAMING_DRIVER),
        f"--output-dir={output}",
        f"--start={start}",
        f"--seconds={seconds}",
        f"--sink={sink}",
        *runner,
    ]


# Beam's two file sinks in streaming: WriteToText(triggering_frequency=...) and
# fileio.WriteToFiles (one shard: its shard assignment is random otherwise, and a re-run
# batch could then name different files than the killed one).
@pytest.mark.parametrize("sink", ["text", "files"])
def test_a_killed_and_restarted_query_writes_exactly_the_uninterrupted_output(
    tmp_path: Path, sink: str
) -> None:
    # Aligned to the 5 s windows, started 5 s ago: the files do not depend on the start.
    start = float(int(time.time()) // 5 * 5 - 5)
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    # DirectRunner's uninterrupted run, beside the killed ones (it takes SECONDS as well).
    direct_log = tmp_path / "direct.log"
    with direct_log.open("wb") as log:
        direct = subprocess.Popen(
            _command(reference, start, ["--runner=DirectRunner"], sink=sink),
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    output = tmp_path / "restarted"
    output.mkdir()
    checkpoint = tmp_path / "checkpoint"
    events = run_with_kills(
        _command(
            output,
            start,
            [
                "--runner=SparkStructuredRunner",
                "--spark_master=local[2]",
                f"--spark_checkpoint_location={checkpoint}",
            ],
            sink=sink,
        ),
        checkpoint,
        output,
        [SINK_COMMIT, MID_BATCH, AFTER_COMMIT],
        tmp_path,
        _env(),
    )
    print("\n".join(events))
    assert direct.wait(timeout=600) == 0, direct_log.read_text()[-3000:]
    expected = written(reference)
    assert len(expected) >= SECONDS // 5
    assert written(output) == expected
    # The killed attempts' temporary files went with the restart that finished.
    assert not sorted(p.name for p in output.glob("beam-temp-*"))


def test_a_crash_in_user_code_names_the_stage_shows_nothing_uncommitted_and_restarts(
    tmp_path: Path,
) -> None:
    start = float(int(time.time()) // 5 * 5 - 5)
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    # The failing element comes well after the first micro-batch (20-60 s here), so that
    # earlier batches have committed windows before it.
    seconds = 90
    direct = subprocess.Popen(
        _command(reference, start, ["--runner=DirectRunner"], seconds),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    output = tmp_path / "crashed"
    output.mkdir()
    spark = [
        "--runner=SparkStructuredRunner",
        "--spark_master=local[2]",
        f"--spark_checkpoint_location={tmp_path / 'checkpoint'}",
    ]
    # The element 70 s in fails: the window [70, 75) and every later one never fire.
    crashed = subprocess.run(
        [*_command(output, start, spark, seconds), "--fail-at=70"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert crashed.returncode != 0
    error = crashed.stderr[crashed.stderr.rfind("PipelineExecutionError: ") :]
    assert error.startswith("PipelineExecutionError: Beam stage '"), crashed.stderr[-3000:]
    assert "failed on Spark. The error from user code:" in error
    assert "the driver was told to fail on the element" in error
    assert "[while running 'Key']" in error
    visible = sorted(written(output))
    assert visible, "the windows before the failing element should have fired"
    assert all(float(name.split("[")[1].split(",")[0]) < start + 70 for name in visible)
    # Restarted from its checkpoint without the failure: exactly the uninterrupted files.
    restarted = subprocess.run(
        _command(output, start, spark, seconds),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert direct.wait(timeout=600) == 0
    assert written(output) == written(reference)
