"""CPU time per event of a streaming Nexmark query, ours against the Python-per-event floor.

``python -m benchmarks.streaming_cpu --queries 0,1,2,7 [--rows 200000] [--batches 4]``

On a shared machine the highest rate a runner keeps up with (``benchmarks.streaming``)
moves with the other processes' load; the CPU time a query spends per event moves far less.
Each trial runs one query of ``benchmarks.streaming`` (``ours`` or ``pyspark-python``) in a
process of its own, in a session of its own, over Spark's ``rate-micro-batch`` source (the
``rate`` source's columns, a fixed number of rows per micro-batch, event time advancing by
the trigger interval per batch), so each micro-batch holds the same events whatever the
load. After two micro-batches (Python workers start, state stores open), the CPU time of
every process of the trial's session (the JVM, the Python workers, the driver) is read
from ``/proc`` at the end of one micro-batch and of ``--batches`` later ones, and divided
by their events. The driver's own time is reported apart and left out of the total: it
is mostly this module waiting for the batches. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import streaming
from benchmarks.trial_process import ROOT, trial_environment

_LOGGER = logging.getLogger(__name__)
_TICK = os.sysconf("SC_CLK_TCK")
# The trigger interval: longer than a micro-batch takes on a loaded machine, so that the
# CPU time is read between batches.
TRIGGER_SECONDS = 10.0
_WARM_BATCHES = 2


def session_cpu(session: int) -> tuple[float, float]:
    """CPU seconds (user and system) of the live processes of ``session``: (JVMs, others)."""
    java = other = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat_file:
                stat = stat_file.read()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) != session:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / _TICK
        if "java" in stat[stat.index("(") + 1 : stat.rindex(")")]:
            java += seconds
        else:
            other += seconds
    return java, other


def _fixed_batches(rows: int) -> dict[str, Any]:
    """The ``rate-micro-batch`` options: ``rows`` a batch in 2 partitions, from now."""
    return {
        "rowsPerBatch": rows,
        "numPartitions": 2,
        "startTimestamp": int(time.time() * 1000),
        "advanceMillisPerBatch": int(streaming.TRIGGER_SECONDS * 1000),
    }


def _measure(
    batches: int, window: dict[str, Any]
) -> Callable[[Callable[[], Sequence[Any]], float], Any]:
    """A stand-in for ``streaming._after_first_batch`` that measures ``batches`` batches."""

    def measured(active: Callable[[], Sequence[Any]], unused_seconds: float) -> Any:
        deadline = time.time() + streaming.STARTUP_LIMIT_SECONDS + batches * 10 * TRIGGER_SECONDS

        def completed(count: int) -> Any:
            while True:
                queries = active()
                if len(queries) == 1 and len(queries[0].recentProgress) >= count:
                    return queries[0]
                if time.time() > deadline:
                    raise TimeoutError(f"fewer than {count} micro-batches completed in time")
                time.sleep(0.5)

        session = os.getsid(0)
        query = completed(_WARM_BATCHES)
        driver, (java, other), began = sum(os.times()[:2]), session_cpu(session), time.time()
        completed(_WARM_BATCHES + batches)
        driver_end, (java_end, other_end) = sum(os.times()[:2]), session_cpu(session)
        progress = query.recentProgress[_WARM_BATCHES : _WARM_BATCHES + batches]
        window.update(
            seconds=round(time.time() - began, 1),
            events=sum(p["numInputRows"] for p in progress),
            jvm=java_end - java,
            driver=driver_end - driver,
            workers=other_end - other - (driver_end - driver),
            durations=[round(p["durationMs"]["triggerExecution"] / 1000, 2) for p in progress],
        )
        return query

    return measured


def run_trial(runner: str, query: int, rows: int, batches: int) -> dict[str, Any]:
    """One trial in this process (see the module doc); its figures."""
    import beam_spark_runner.io as runner_io

    fixed = _fixed_batches(rows)
    read = runner_io.ReadFromSparkStream

    def fixed_read(unused_format: str, options: Any = None, **kwargs: Any) -> Any:
        return read("rate-micro-batch", options=dict(fixed), **kwargs)

    def fixed_stream(unused_rate: int) -> Any:
        reader = streaming.peer_session().readStream.format("rate-micro-batch")
        for key, value in fixed.items():
            reader = reader.option(key, value)
        return reader.load()

    window: dict[str, Any] = {}
    runner_io.ReadFromSparkStream = fixed_read  # type: ignore[assignment,misc]
    streaming._rate_stream = fixed_stream  # type: ignore[assignment]
    streaming._after_first_batch = _measure(batches, window)  # type: ignore[assignment]
    trial = streaming._run_here(runner, query, rows, 0, TRIGGER_SECONDS)
    if trial.error or not window:
        return {"runner": runner, "query": query, "error": trial.error or "no figures"}
    events = window["events"]
    return {
        "runner": runner,
        "query": query,
        "rows_per_batch": rows,
        "cpu_us_per_event": round((window["jvm"] + window["workers"]) / events * 1e6, 2),
        "workers_us_per_event": round(window["workers"] / events * 1e6, 2),
        "jvm_us_per_event": round(window["jvm"] / events * 1e6, 2),
        "driver_seconds": round(window["driver"], 2),
        "load_average": round(os.getloadavg()[0], 1),
        **{k: window[k] for k in ("seconds", "events", "durations")},
    }


def run_in_subprocess(runner: str, query: int, rows: int, batches: int) -> dict[str, Any]:
    """One trial in a process leading a session of its own (whose processes it measures)."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.streaming_cpu",
        f"--trial={runner},{query}",
        f"--rows={rows}",
        f"--batches={batches}",
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=trial_environment(),
        cwd=ROOT,
        start_new_session=True,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    return {"runner": runner, "query": query, "error": done.stderr[-2000:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queries", default="0,1,2,7")
    parser.add_argument("--runners", default="ours,pyspark-python")
    parser.add_argument("--rows", type=int, default=200_000, help="events per micro-batch")
    parser.add_argument("--batches", type=int, default=4, help="micro-batches measured")
    parser.add_argument("--trial", help=argparse.SUPPRESS)  # RUNNER,QUERY: one trial, here
    args = parser.parse_args(argv)
    if args.trial:
        runner, query = args.trial.split(",")
        figures = run_trial(runner, int(query), args.rows, args.batches)
        print(json.dumps(figures), flush=True)
        # The streaming query's threads would keep the process alive.
        os._exit(0)
    # Beam sets the root logger to WARNING when imported: the trials report on a handler of
    # their own.
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s streaming-cpu %(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    for query in (int(q) for q in args.queries.split(",")):
        for runner in args.runners.split(","):
            figures = run_in_subprocess(runner, query, args.rows, args.batches)
            _LOGGER.info("%s", json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
