"""The CPU-per-event helper's pure parts: reading a session's CPU time, the fixed batches."""

from __future__ import annotations

import os
import sys
import time

import pytest

from benchmarks import streaming
from benchmarks.streaming_cpu import _fixed_batches, session_cpu


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sessions_cpu_time_grows_with_the_work_of_its_processes() -> None:
    session = os.getsid(0)
    _, before = session_cpu(session)
    began = time.process_time()
    while time.process_time() - began < 0.3:  # this process is in the session
        sum(range(10_000))
    _, after = session_cpu(session)
    assert after - before >= 0.2
    assert session_cpu(-1) == (0.0, 0.0)  # no process leads a session -1


def test_every_micro_batch_holds_the_same_rows_at_the_triggers_pace() -> None:
    options = _fixed_batches(1234)
    assert options["rowsPerBatch"] == 1234
    assert options["numPartitions"] == 2
    assert options["advanceMillisPerBatch"] == streaming.TRIGGER_SECONDS * 1000
    assert abs(options["startTimestamp"] / 1000 - time.time()) < 60
