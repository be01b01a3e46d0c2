"""Tests for worker_zygote: the local worker daemon forked from the driver, reset as new."""

from __future__ import annotations

import json
import os
import textwrap
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from beam_spark_runner.workers import zygote as worker_zygote

# A driver in a fresh interpreter: some state of its own (a logging handler, a global in
# its __main__, an exit handler, captured stdout as a test runner has it), then a pipeline
# whose workers report what they see of it.
_DRIVER = textwrap.dedent(
    """
    import atexit, io, json, logging, os, sys
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    report, exits, token = sys.argv[1], sys.argv[2], sys.argv[3]
    DRIVER_ONLY = token


    class DriverHandler(logging.Handler):
        def emit(self, record):
            pass


    logging.getLogger().addHandler(DriverHandler())
    atexit.register(lambda: open(exits, "a").write("exit\\n"))


    class Report(beam.DoFn):
        def process(self, element):
            import logging, os, sys
            daemon = os.getppid()
            with open(f"/proc/{daemon}/cmdline") as cmdline:
                command = cmdline.read().replace("\\0", " ")
            ancestors, pid = [], daemon
            while pid > 1:
                ancestors.append(pid)
                with open(f"/proc/{pid}/stat") as stat:
                    pid = int(stat.read().rsplit(")", 1)[1].split()[1])
            line = {
                "ancestors": ancestors,
                "daemon_command": command,
                "main_has_driver_global": "DRIVER_ONLY" in vars(sys.modules["__main__"]),
                "driver_handlers": [
                    type(h).__name__ for h in logging.getLogger().handlers
                    if type(h).__name__ == "DriverHandler"
                ],
                "offer": os.environ.get("BEAM_SPARK_RUNNER_ZYGOTE"),
                "stdout": sys.stdout.fileno(),
            }
            with open(report, "a") as out:
                out.write(json.dumps(line) + "\\n")
            yield element


    options = PipelineOptions(["--runner=SparkStructuredRunner", "--spark_master=local[2]"])
    sys.stdout = io.StringIO()  # as pytest's capture: no descriptor of its own
    with beam.Pipeline(options=options) as pipeline:
        assert_that(pipeline | beam.Create([1, 2, 3]) | beam.ParDo(Report()), equal_to([1, 2, 3]))
    sys.stdout = sys.__stdout__
    print("offer left in the driver's environment:", os.environ.get("BEAM_SPARK_RUNNER_ZYGOTE"))
    print("driver", os.getpid())
    """
)


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline") as cmdline:
                if token in cmdline.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.spark
@pytest.mark.parametrize("offered", [True, False])
def test_a_fresh_drivers_worker_daemon_is_forked_from_it_and_reset(
    run_python: Callable[..., Any], tmp_path: Any, offered: bool
) -> None:
    report, exits, token = tmp_path / "report", tmp_path / "exits", uuid.uuid4().hex
    env = {worker_zygote.ENVIRONMENT: None if offered else "0"}
    result = run_python(["-c", _DRIVER, str(report), str(exits), token], env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert lines
    driver = int(result.stdout.split("driver ")[1].split()[0])
    for line in lines:
        # The workers are in the driver's process tree, as a freshly started daemon's are.
        assert driver in line["ancestors"], line
        # Forked from the driver, the daemon shows the driver's command line; else its own.
        assert (token in line["daemon_command"]) is offered, line
        assert ("beam_spark_runner.spark.worker_daemon" in line["daemon_command"]) is not offered
        assert not line["main_has_driver_global"]
        assert line["driver_handlers"] == []
        assert (line["offer"] not in (None, "0")) is offered
        assert line["stdout"] == 1
    # Withdrawn once the JVM has it; a user's 0 stays.
    left = "None" if offered else "0"
    assert f"offer left in the driver's environment: {left}" in result.stdout
    # The driver's exit handler ran once: the zygote and the daemon never ran it.
    assert exits.read_text() == "exit\n"
    # Nothing of the driver outlives it: neither the zygote nor the daemon.
    deadline = time.monotonic() + 15
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(token) == []


_FORK_SAFE = textwrap.dedent(
    """
    import threading, time
    import numpy, pyarrow  # their native pools fork safely, as in PySpark's daemon
    from beam_spark_runner.workers import zygote as worker_zygote
    print(worker_zygote.fork_safe())
    thread = threading.Thread(target=time.sleep, args=(1,))
    thread.start()
    print(worker_zygote.fork_safe())
    print(worker_zygote.start("/tmp"))
    """
)


def test_only_a_driver_without_other_threads_forks(run_python: Callable[..., Any]) -> None:
    result = run_python(["-c", _FORK_SAFE])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "False", "False"]


def test_set_to_0_the_variable_turns_the_zygote_off(run_python: Callable[..., Any]) -> None:
    code = "from beam_spark_runner.workers import zygote; print(zygote.start('/tmp'))"
    result = run_python(["-c", code], env={worker_zygote.ENVIRONMENT: "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False"]


# Forks, resets the child as a daemon's, and prints what the child then has.
_RESET = textwrap.dedent(
    """
    import atexit, io, json, logging, os, signal, sys, warnings
    from beam_spark_runner.workers import zygote as worker_zygote

    DRIVER_ONLY = 1
    logging.getLogger().addHandler(logging.StreamHandler(io.StringIO()))
    logging.getLogger("some.library").setLevel(logging.DEBUG)
    warnings.simplefilter("error")
    signal.signal(signal.SIGTERM, lambda *_: None)
    atexit.register(lambda: print("driver exit handler"))
    sys.stdout.flush()
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        worker_zygote._reset({"PYTHONPATH": "/nowhere/a:/nowhere/b", "ONLY": "this"}, "/", ["d"])
        atexit._run_exitfuncs()
        state = {
            "environment": dict(os.environ),
            "cwd": os.getcwd(),
            "argv": sys.argv,
            "path": sys.path[:2],
            "main": sorted(k for k in vars(sys.modules["__main__"]) if not k.startswith("__")),
            "handlers": len(logging.getLogger().handlers),
            "library_level": logging.getLogger("some.library").level,
            "root_level": logging.getLogger().level,
            "error_filters": [f for f in warnings.filters if f[0] == "error"],
            "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "stdout": sys.stdout.fileno(),
        }
        os.write(write, json.dumps(state).encode())
        os._exit(0)
    os.close(write)
    os.wait()
    print(os.read(read, 1 << 16).decode())
    """
)


def test_a_forked_daemon_has_a_fresh_interpreters_state(run_python: Callable[..., Any]) -> None:
    result = run_python(["-c", _RESET])
    assert result.returncode == 0, result.stderr[-3000:]
    state_line, exit_line = result.stdout.strip().splitlines()
    state = json.loads(state_line)
    assert state == {
        "environment": {"PYTHONPATH": "/nowhere/a:/nowhere/b", "ONLY": "this"},
        "cwd": "/",
        "argv": ["d"],
        "path": ["/nowhere/a", "/nowhere/b"],
        "main": [],
        "handlers": 0,
        "library_level": 0,
        "root_level": 30,
        "error_filters": [],
        "sigterm_default": True,
        "stdout": 1,
    }
    # The driver's own exit handler: run once, by the driver, not by the reset child.
    assert exit_line == "driver exit handler"


def test_without_an_offer_from_this_jvms_driver_the_daemon_starts_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(worker_zygote.ENVIRONMENT, raising=False)
    assert worker_zygote.hand_over() is None
    # An offer from a process that is not this one's grandparent (its JVM's parent).
    monkeypatch.setenv(worker_zygote.ENVIRONMENT, f"{os.getpid()}:/nonexistent/zygote.sock")
    assert worker_zygote.hand_over() is None
    monkeypatch.setenv(worker_zygote.ENVIRONMENT, "0")
    assert worker_zygote.hand_over() is None


_STOP_AND_AGAIN = textwrap.dedent(
    """
    import os, time
    from beam_spark_runner.workers import zygote as worker_zygote

    def gone(path):
        deadline = time.monotonic() + 10
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not os.path.exists(path)

    assert worker_zygote.start("/tmp")
    first = os.environ[worker_zygote.ENVIRONMENT].partition(":")[2]
    worker_zygote.withdraw()
    print("offered", os.path.exists(first), worker_zygote.ENVIRONMENT in os.environ)
    worker_zygote.stop()  # the JVM it was for did not start: it leaves
    print("stopped", gone(first))
    assert worker_zygote.start("/tmp")  # the next JVM's
    second = os.environ[worker_zygote.ENVIRONMENT].partition(":")[2]
    print("again", second != first, os.path.exists(second))
    assert worker_zygote.start("/tmp")  # forked again: the unserved one before it leaves
    print("replaced", gone(second))
    print(os.environ[worker_zygote.ENVIRONMENT].partition(":")[2])
    """
)


def test_a_zygote_no_daemon_was_handed_to_leaves_when_stopped_or_replaced(
    run_python: Callable[..., Any],
) -> None:
    result = run_python(["-c", _STOP_AND_AGAIN], env={worker_zygote.ENVIRONMENT: None})
    assert result.returncode == 0, result.stderr[-3000:]
    *lines, last = result.stdout.splitlines()
    assert lines == ["offered True False", "stopped True", "again True True", "replaced True"]
    # The last one leaves with the driver.
    deadline = time.monotonic() + 10
    while os.path.exists(last) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(last)


_OTHER_INTERPRETER = textwrap.dedent(
    """
    import os, sys
    from beam_spark_runner.workers import zygote as worker_zygote

    assert worker_zygote.start("/tmp")
    path = os.environ[worker_zygote.ENVIRONMENT].partition(":")[2]
    other = {**worker_zygote._request(), "prefix": "/another/venv"}
    print("forked", worker_zygote._ask(path, other))
    print("still offered", os.path.exists(path))
    """
)


def test_a_daemon_of_another_interpreter_is_not_forked_from_the_driver(
    run_python: Callable[..., Any],
) -> None:
    """``PYSPARK_PYTHON`` may name another interpreter: that daemon starts itself."""
    result = run_python(["-c", _OTHER_INTERPRETER], env={worker_zygote.ENVIRONMENT: None})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:2] == ["forked None", "still offered True"]
