"""The CPU-per-event helper's pure parts: reading a session's CPU time, the fixed batches."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks import streaming
from benchmarks.streaming_cpu import _fixed_batches, session_cpu


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sessions_cpu_time_grows_with_the_work_of_its_processes() -> None:
    # A session of its own: other processes of the test's session may end meanwhile.
    burner = subprocess.Popen(
        [sys.executable, "-c", _BURN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert burner.stdout is not None and burner.stdin is not None
        assert burner.stdout.readline() == b"ready\n"
        _, before = session_cpu(burner.pid)
        burner.stdin.write(b"go\n")
        burner.stdin.flush()
        assert burner.stdout.readline() == b"done\n"  # it burnt 0.3 s of CPU, and lives on
        _, after = session_cpu(burner.pid)
    finally:
        burner.kill()
        burner.wait()
    assert after - before >= 0.2
    assert session_cpu(-1) == (0.0, 0.0)  # no process leads a session -1


# Says ready, waits for a line, burns 0.3 s of CPU, says done, waits to be killed.
_BURN = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
began = time.process_time()
while time.process_time() - began < 0.3:
    sum(range(10_000))
print("done", flush=True)
sys.stdin.readline()
"""


def test_every_micro_batch_holds_the_same_rows_at_the_triggers_pace() -> None:
    options = _fixed_batches(1234)
    assert options["rowsPerBatch"] == 1234
    assert options["numPartitions"] == 2
    assert options["advanceMillisPerBatch"] == streaming.TRIGGER_SECONDS * 1000
    assert abs(options["startTimestamp"] / 1000 - time.time()) < 60
