"""noxfile.py's sessions: the streaming checks of another line stay out of CI's matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _sessions() -> dict[str, dict]:
    # The main venv has nox (a dev dependency); the matrix's own venvs run these tests too.
    pytest.importorskip("nox", reason="nox lists the sessions: the main venv has it")
    listed = subprocess.run(
        [sys.executable, "-m", "nox", "--no-color", "-l", "--json", "-k", "smoke or streaming"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {session["session"]: session for session in json.loads(listed.stdout)}


def test_the_4_0_line_has_a_streaming_session_outside_the_smoke_tag() -> None:
    sessions = _sessions()
    assert "streaming-spark4.0" in sessions, f"sessions: {sorted(sessions)}"
    # ci/matrix.sh runs the sessions tagged smoke; the streaming session takes over an hour.
    assert "smoke" not in sessions["streaming-spark4.0"].get("tags", [])
    assert "smoke" in sessions["smoke-spark4.0"]["tags"]


def test_the_make_target_runs_the_streaming_session_of_the_line() -> None:
    dry_run = subprocess.run(
        ["make", "-n", "teststream-check-matrix", "LINE=spark4.0", "PARTS=restart"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "-s streaming-spark4.0 -- restart" in dry_run.stdout
