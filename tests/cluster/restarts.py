"""Kill a streaming driver (SIGKILL) at chosen moments and restart it from its checkpoint.

Used by the restart tests on ``local[2]`` (tests/streaming/test_restart.py) and on the
standalone cluster (tests/cluster/test_streaming_restart_standalone.py). The driver is
``streaming_driver.py``: PeriodicImpulse -> FixedWindows -> CombinePerKey -> WriteToText
with ``triggering_frequency``, writing ``counts-<window>-...`` files.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
STREAMING_DRIVER = HERE / "streaming_driver.py"
# How long one driver run may take before the harness gives up on it.
_RUN_TIMEOUT = 600.0


@dataclasses.dataclass(frozen=True)
class Run:
    """What a driver run sees when it starts: the batches and files already there."""

    checkpoint: Path
    output: Path
    offsets_at_start: int
    commits_at_start: int
    files_at_start: frozenset[str]


def _batch_ids(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def final_files(output: Path) -> frozenset[str]:
    """The sink's final files (not Beam's temporary directories)."""
    return frozenset(p.name for p in output.glob("counts-*") if p.is_file())


@dataclasses.dataclass(frozen=True)
class KillPoint:
    """A moment to SIGKILL the driver at, as a predicate polled every few milliseconds."""

    name: str
    ready: Callable[[Run], bool]


def _mid_batch(run: Run) -> bool:
    # A micro-batch planned (its offsets written) and not committed, two batches on.
    offsets = _batch_ids(run.checkpoint / "offsets")
    commits = set(_batch_ids(run.checkpoint / "commits"))
    return any(b >= run.offsets_at_start + 2 and b not in commits for b in offsets)


def _sink_commit(run: Run) -> bool:
    # The sink has just renamed a new final file into place (its commit is under way).
    return bool(final_files(run.output) - run.files_at_start)


def _after_commit(run: Run) -> bool:
    # Two more micro-batches committed.
    commits = _batch_ids(run.checkpoint / "commits")
    return bool(commits) and commits[-1] >= run.commits_at_start + 2


MID_BATCH = KillPoint("mid-batch", _mid_batch)
SINK_COMMIT = KillPoint("during the sink's commit", _sink_commit)
AFTER_COMMIT = KillPoint("after a commit", _after_commit)


def _start(command: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # Its own process group: the kill takes the driver's JVM with it.
        return subprocess.Popen(
            list(command), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _kill(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def run_with_kills(
    command: Sequence[str],
    checkpoint: Path,
    output: Path,
    kill_points: Sequence[KillPoint],
    logs: Path,
    env: dict[str, str],
) -> list[str]:
    """Runs ``command``, SIGKILLs it at each kill point in turn, restarting it each time
    with the same checkpoint, then lets the last run finish. Returns what happened.

    Fails (``AssertionError``) if a run ends before its kill point is reached, or the last
    run does not end with status 0.
    """
    events = []
    for number, point in enumerate(kill_points):
        run = Run(
            checkpoint,
            output,
            offsets_at_start=max(_batch_ids(checkpoint / "offsets"), default=-1),
            commits_at_start=max(_batch_ids(checkpoint / "commits"), default=-1),
            files_at_start=final_files(output),
        )
        log = logs / f"run-{number}.log"
        process = _start(command, log, env)
        deadline = time.monotonic() + _RUN_TIMEOUT
        while not point.ready(run):
            if process.poll() is not None:
                raise AssertionError(
                    f"run {number} ended (status {process.returncode}) before the kill point "
                    f"'{point.name}'; its log: {log}"
                )
            if time.monotonic() > deadline:
                _kill(process)
                raise AssertionError(f"run {number} never reached '{point.name}'; log: {log}")
            time.sleep(0.005)
        _kill(process)
        events.append(
            f"run {number}: killed {point.name} (batches committed: "
            f"{_batch_ids(checkpoint / 'commits')[-1:]}, files: {len(final_files(output))})"
        )
    log = logs / f"run-{len(kill_points)}.log"
    process = _start(command, log, env)
    try:
        status = process.wait(timeout=_RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(process)
        raise AssertionError(f"the last run did not finish; log: {log}") from None
    assert status == 0, f"the last run failed (status {status}); log: {log}"
    events.append(f"run {len(kill_points)}: finished")
    return events


def written(output: Path) -> dict[str, list[str]]:
    """Each final file's lines, sorted."""
    return {name: sorted((output / name).read_text().splitlines()) for name in final_files(output)}
