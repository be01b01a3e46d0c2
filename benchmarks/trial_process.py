"""A benchmark trial in a process of its own: its own Spark session and JVM, killed at a limit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trial_environment() -> dict[str, str]:
    """This process's environment, with Spark's and Beam's workers importing this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def run_trial_process(command: list[str], log_path: str, limit: float) -> str:
    """Runs ``command`` with its output in ``log_path``, for at most ``limit`` seconds.

    Returns what to report if it left no result: how it ended. The process leads its own
    group, so its JVM and Python workers end with it whatever happens.
    """
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=trial_environment(),
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=limit)
            return f"its process exited with code {process.returncode}, see {log_path}"
        except subprocess.TimeoutExpired:
            return f"no result after {limit:.0f} s, see {log_path}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
