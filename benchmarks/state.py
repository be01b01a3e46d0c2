"""State at scale: a GroupByKey's micro-batches with few and with many keys in state.

    .venv/bin/python -m benchmarks.state [--keys 1000,2000000] [--sessions 1000000]
        [--stateful 1000,2000000] [--side 1000,100000] [--rate 5000] [--seconds 120]

The same pipeline at the same input rate, once per ``--keys`` (each in a process of its own,
so each starts its own Spark session): ``PeriodicImpulse`` ticking every ``TICK_SECONDS``
feeds a ``GroupByKey`` in the global window under ``Repeatedly(AfterCount(COUNT))``,
discarding, and a count per pane. The trigger driver (the runner's ``CountDriver``) keeps
every key it has seen (its count and pane index), so the keys stay in state for the whole
run. With
``--sessions``, the same ticks feed a ``GroupByKey`` over ``Sessions(SESSION_GAP_SECONDS)``
under the default trigger: each key one session that stays open for the whole run. With
``--stateful``, the same ticks feed a stateful DoFn keeping a ``ReadModifyWriteState``
counter per key (in the global window: every key stays in state). With ``--side``, the
same ticks are the main input of a stage reading a streamed multimap side input: each key's
latest value, from a ``GroupByKey`` in the global window firing on every element, every
key given one during the prefill and ``SIDE_PER_TICK`` keys a new one each tick after it;
every shard of the stage holds every key's. The first
ticks put every key in state once, ``PREFILL_RATE`` keys a second; after them each tick
emits ``rate × TICK_SECONDS`` elements of keys drawn at random from all keys. So after the
prefill a micro-batch brings the same number of elements whatever the keys held, and its
cost should not grow with them.

Measured over the micro-batches that start ``SETTLE_SECONDS`` after the prefill's last tick
was due (and after ``--seconds`` of run past it):

* the median micro-batch (Spark's ``triggerExecution``);
* checkpoint bytes written per micro-batch: the bytes of files that appear in the
  checkpoint's ``state/`` directory, watched every ``WATCH_SECONDS``, over the batches
  committed meanwhile (RocksDB uploads each commit's new files; nothing is rewritten);
* the state store's rows (Spark's ``numRowsTotal``, summed over the stateful operators);
* peak resident memory of the JVM and of the Python workers (every other process of the
  run but the driver: RSS, and PSS which counts shared pages once), from ``/proc``
  (``benchmarks.memory``).

``benchmarks.streaming`` runs it after the Nexmark trials (``make bench-streaming``);
``--keys`` small and ``--seconds`` short make a smoke run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from benchmarks import memory
from benchmarks.trial_process import run_trial_process

_LOGGER = logging.getLogger(__name__)

TICK_SECONDS = 0.1
TRIGGER_SECONDS = 2.0
# Keys put in state per second during the prefill.
PREFILL_RATE = 50_000
# A key's pane fires after this many elements (rare at the steady rate: state stays).
COUNT = 100
SETTLE_SECONDS = 10.0
# Side-input values after the prefill, per tick (``--side``): few beside those held.
SIDE_PER_TICK = 1
# A session's gap: longer than any run, so every key's session stays open.
SESSION_GAP_SECONDS = 3600
WATCH_SECONDS = 0.5
STARTUP_LIMIT_SECONDS = 300.0
# How long the micro-batch that first puts a key in state may take per key: the prefill's
# keys land in one or two micro-batches, whose cost is not the steady state measured.
FIRST_FILL_SECONDS_PER_KEY = 1e-3


@dataclasses.dataclass
class StateTrial:
    """One run of the pipeline with ``keys`` keys in state."""

    keys: int
    rate: int
    # Measured micro-batches: (input rows, seconds, checkpoint bytes written).
    batches: list[tuple[int, float, int]]
    # "global" (AfterCount in the global window), "sessions", "stateful" or "side".
    pipeline: str = "global"
    state_rows: int | None = None
    jvm_peak_rss_mib: float = 0.0
    python_workers_peak_rss_mib: float = 0.0
    python_workers_peak_pss_mib: float = 0.0
    driver_peak_rss_mib: float = 0.0
    prefill_seconds: float = 0.0
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        """The trial as one JSON-able row."""
        durations = [d for _, d, _ in self.batches]
        written = [w for _, _, w in self.batches]
        return {
            "pipeline": self.pipeline,
            "keys": self.keys,
            "rate": self.rate,
            "batches": len(self.batches),
            "median_batch_s": round(statistics.median(durations), 3) if durations else None,
            "median_checkpoint_kib": round(statistics.median(written) / 1024, 1)
            if written
            else None,
            "mean_checkpoint_kib": round(statistics.mean(written) / 1024, 1) if written else None,
            "state_rows": self.state_rows,
            "jvm_peak_rss_mib": round(self.jvm_peak_rss_mib),
            "python_workers_peak_rss_mib": round(self.python_workers_peak_rss_mib),
            "python_workers_peak_pss_mib": round(self.python_workers_peak_pss_mib),
            "driver_peak_rss_mib": round(self.driver_peak_rss_mib),
            "prefill_s": round(self.prefill_seconds, 1),
            "error": self.error,
        }


class _Elements(beam.DoFn):  # type: ignore[misc]
    """A tick's elements: the prefill's keys in order, then ``per_tick`` random keys; each
    with 1, or with ``side`` the tick's index (a side input's value, other keys drawn)."""

    def __init__(self, start: float, keys: int, per_tick: int, side: bool = False) -> None:
        self.start = start
        self.keys = keys
        self.per_tick = per_tick
        self.side = side
        self.prefill_ticks = prefill_ticks(keys)

    def process(self, tick: Any) -> Iterator[tuple[int, int]]:
        index = round((float(tick) - self.start) / TICK_SECONDS)
        value = index if self.side else 1
        if index < self.prefill_ticks:
            chunk = -(-self.keys // self.prefill_ticks)
            for key in range(index * chunk, min(self.keys, (index + 1) * chunk)):
                yield key, value
            return
        draw = random.Random(-index if self.side else index).randrange
        for _ in range(self.per_tick):
            yield draw(self.keys), value


def _looked_up(element: tuple[int, int], side: Any) -> bool:
    """Whether the element's key has a side value (the lookup the stage exists for)."""
    return bool(side[element[0]])


class _Counter(beam.DoFn):  # type: ignore[misc]
    """A stateful DoFn: a count per key in a ``ReadModifyWriteState``; emits nothing."""

    COUNT = beam.transforms.userstate.ReadModifyWriteStateSpec("count", beam.coders.VarIntCoder())

    def process(
        self,
        element: tuple[int, int],
        count: Any = beam.DoFn.StateParam(COUNT),  # noqa: B008 - Beam's idiom
    ) -> Iterator[int]:
        count.write((count.read() or 0) + element[1])
        return iter(())


def prefill_ticks(keys: int) -> int:
    """The ticks that put every key in state once."""
    return max(1, -(-keys // round(PREFILL_RATE * TICK_SECONDS)))


def build(
    pipeline: beam.Pipeline,
    start: float,
    stop: float,
    keys: int,
    rate: int,
    pipeline_name: str = "global",
) -> None:
    """The benchmark's pipeline, ticking from ``start`` to ``stop`` (seconds since the epoch)."""
    from apache_beam.transforms import trigger, window
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    from apache_beam.utils.timestamp import Timestamp

    per_tick = max(1, round(rate * TICK_SECONDS))
    ticks = pipeline | "Ticks" >> PeriodicImpulse(
        start_timestamp=Timestamp(start),
        stop_timestamp=Timestamp(stop),
        fire_interval=TICK_SECONDS,
    )
    elements = ticks | "Elements" >> beam.ParDo(_Elements(start, keys, per_tick))
    if pipeline_name == "side":
        side = (
            ticks
            | "SideValues" >> beam.ParDo(_Elements(start, keys, SIDE_PER_TICK, side=True))
            | "SideWindow"
            >> beam.WindowInto(
                window.GlobalWindows(),
                trigger=trigger.Repeatedly(trigger.AfterCount(1)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
            )
            | "SideGroup" >> beam.GroupByKey()
        )
        _ = (
            elements
            | "Window" >> beam.WindowInto(window.GlobalWindows())
            | "Lookup" >> beam.Filter(_looked_up, beam.pvalue.AsMultiMap(side))
            | "Drop" >> beam.Filter(lambda _: False)
        )
        return
    if pipeline_name == "stateful":
        _ = (
            elements
            | "Window" >> beam.WindowInto(window.GlobalWindows())
            | "Count" >> beam.ParDo(_Counter())
        )
        return
    windowing = (
        beam.WindowInto(window.Sessions(SESSION_GAP_SECONDS))
        if pipeline_name == "sessions"
        else beam.WindowInto(
            window.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(COUNT)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
    )
    _ = (
        elements
        | "Window" >> windowing
        | "Group" >> beam.GroupByKey()
        | "Count" >> beam.Map(lambda kv: (kv[0], len(list(kv[1]))))
        | "Drop" >> beam.Filter(lambda _: False)
    )


class _CheckpointWatch:
    """Bytes of the files that appear under a directory, and when, watched in a thread."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.seen: dict[str, int] = {}
        # (wall time, bytes of files new since the last look)
        self.appeared: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="checkpoint-watch", daemon=True)

    def look(self) -> None:
        new = 0
        for folder, _, files in os.walk(self.directory):
            for name in files:
                path = os.path.join(folder, name)
                if path in self.seen:
                    continue
                with contextlib.suppress(OSError):
                    self.seen[path] = os.path.getsize(path)
                    new += self.seen[path]
        self.appeared.append((time.time(), new))

    def between(self, start: float, end: float) -> int:
        """Bytes that appeared after ``start`` and by ``end``."""
        return sum(size for at, size in self.appeared if start < at <= end)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(WATCH_SECONDS)

    def __enter__(self) -> _CheckpointWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _batch_times(progress: dict[str, Any]) -> tuple[float, float]:
    """A progress report's micro-batch start and end (wall, seconds since the epoch)."""
    from datetime import datetime

    start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return start, start + progress["durationMs"]["triggerExecution"] / 1000


def _measured(progress: list[Any], start: float) -> list[dict[str, Any]]:
    """The micro-batches that ran (not idle reports) from ``start``, the first two left out
    (Python workers start, state stores open)."""
    batches = [p for p in progress if "triggerExecution" in p.get("durationMs", {})]
    return [p for p in batches[2:] if _batch_times(p)[0] >= start]


class _Memory:
    """Peak memory of the driver, the JVM and the Python workers.

    Workers are every other process of the tree: PySpark's daemon and the workers forked
    from it, or from the runner's zygote (a child of the driver). Their RSS counts the
    pages they share copy-on-write once per process; their PSS splits them.
    """

    def __init__(self) -> None:
        self.peaks = {"driver": 0.0, "jvm": 0.0, "workers": 0.0, "workers_pss": 0.0}

    def sample(self) -> None:
        driver = os.getpid()
        tree = memory.process_tree(driver)
        jvm = [pid for pid in tree if _command(pid) == "java"]
        workers = [pid for pid in tree if pid != driver and pid not in jvm]
        rss = {pid: memory._status_kib(pid, b"VmRSS:") / 1024 for pid in tree}
        for name, value in (
            ("driver", rss.get(driver, 0.0)),
            ("jvm", sum(rss.get(pid, 0.0) for pid in jvm)),
            ("workers", sum(rss.get(pid, 0.0) for pid in workers)),
            ("workers_pss", sum(memory._pss_kib(pid) / 1024 for pid in workers)),
        ):
            self.peaks[name] = max(self.peaks[name], value)


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


def run_here(keys: int, rate: int, seconds: float, pipeline_name: str = "global") -> StateTrial:
    """One trial in this process."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from pyspark.sql import SparkSession

    checkpoint = tempfile.mkdtemp(prefix="bench-state-checkpoint-")
    options = PipelineOptions(
        [
            "--runner=SparkStructuredRunner",
            "--spark_master=local[2]",
            f"--spark_trigger_interval={TRIGGER_SECONDS}",
            f"--spark_checkpoint_location={checkpoint}",
            "--streaming",
        ]
    )
    # Ticks start a little ahead: the query takes seconds to start.
    start = time.time() + 5
    prefill_end = start + prefill_ticks(keys) * TICK_SECONDS
    stop = prefill_end + SETTLE_SECONDS + seconds + STARTUP_LIMIT_SECONDS
    pipeline = beam.Pipeline(options=options)
    build(pipeline, start, stop, keys, rate, pipeline_name)
    trial = StateTrial(keys, rate, [], pipeline=pipeline_name, prefill_seconds=prefill_end - start)
    mem = _Memory()
    result = pipeline.run()
    try:
        with _CheckpointWatch(os.path.join(checkpoint, "state")) as watch:
            spark = SparkSession.builder.getOrCreate()
            measure_from = prefill_end + SETTLE_SECONDS
            deadline = (
                time.time()
                + STARTUP_LIMIT_SECONDS
                + prefill_end
                - start
                + keys * FIRST_FILL_SECONDS_PER_KEY
            )
            query = None
            while True:
                mem.sample()
                active = spark.streams.active
                query = active[0] if active else None
                progress = query.recentProgress if query is not None else []
                measured = _measured(progress, measure_from)
                if measured and _batch_times(measured[0])[1] + seconds <= time.time():
                    break
                if not measured and time.time() > deadline:
                    raise TimeoutError(
                        f"no micro-batch started {SETTLE_SECONDS} s after the prefill"
                    )
                time.sleep(1.0)
            assert query is not None
            watch.look()
            progress = query.recentProgress
            measured = _measured(progress, measure_from)
            # Each batch's files: those that appeared after the batch before it ended.
            previous_end = _batch_times(measured[0])[1] + WATCH_SECONDS
            for report in measured[1:]:
                begin, end = _batch_times(report)
                written = watch.between(previous_end, end + WATCH_SECONDS)
                trial.batches.append((int(report.get("numInputRows", 0)), end - begin, written))
                previous_end = end + WATCH_SECONDS
            trial.state_rows = sum(
                int(op.get("numRowsTotal", 0)) for op in progress[-1].get("stateOperators", [])
            )
    except Exception as caught:  # noqa: BLE001 - reported in the table
        trial.error = f"{type(caught).__name__}: {caught}"
    finally:
        result.cancel()
        shutil.rmtree(checkpoint, ignore_errors=True)
    trial.jvm_peak_rss_mib = mem.peaks["jvm"]
    trial.python_workers_peak_rss_mib = mem.peaks["workers"]
    trial.python_workers_peak_pss_mib = mem.peaks["workers_pss"]
    trial.driver_peak_rss_mib = mem.peaks["driver"]
    return trial


def run_in_subprocess(
    keys: int, rate: int, seconds: float, log_dir: str, pipeline_name: str = "global"
) -> StateTrial:
    """One trial in a process of its own (its own Spark session and JVM)."""
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"state-{pipeline_name}-{keys}.log")
    limit = (
        seconds
        + 2 * STARTUP_LIMIT_SECONDS
        + prefill_ticks(keys) * TICK_SECONDS * 4
        + keys * FIRST_FILL_SECONDS_PER_KEY
    )
    with tempfile.TemporaryDirectory(prefix="bench-state-trial-") as directory:
        output = os.path.join(directory, "trial.json")
        command = [
            sys.executable,
            "-m",
            "benchmarks.state",
            f"--trial={keys}",
            f"--trial-pipeline={pipeline_name}",
            f"--rate={rate}",
            f"--seconds={seconds}",
            f"--trial-output={output}",
        ]
        error = run_trial_process(command, log_path, limit)
        if not os.path.exists(output):
            return StateTrial(keys, rate, [], pipeline=pipeline_name, error=error)
        with open(output) as saved:
            data = json.load(saved)
    data["batches"] = [(int(r), float(d), int(w)) for r, d, w in data["batches"]]
    return StateTrial(**data)


def markdown_table(trials: list[StateTrial]) -> str:
    """The trials as a Markdown table."""
    rows = [t.summary() for t in trials]
    columns = [
        "pipeline",
        "keys",
        "rate",
        "batches",
        "median_batch_s",
        "median_checkpoint_kib",
        "state_rows",
        "jvm_peak_rss_mib",
        "python_workers_peak_rss_mib",
        "python_workers_peak_pss_mib",
        "error",
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs one trial per ``--keys``, prints and saves the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", default="1000,2000000", help="keys in state, comma-separated")
    parser.add_argument(
        "--sessions",
        default="1000000",
        help="then the sessions pipeline with these open sessions, comma-separated ('' for none)",
    )
    parser.add_argument(
        "--stateful",
        default="1000,2000000",
        help="then the stateful DoFn pipeline with these keys in state, comma-separated "
        "('' for none)",
    )
    parser.add_argument(
        "--side",
        default="1000,100000",
        help="then the streamed side input pipeline with these keys in its side input, "
        "comma-separated ('' for none)",
    )
    parser.add_argument("--rate", type=int, default=5000, help="elements/s after the prefill")
    parser.add_argument("--seconds", type=float, default=120, help="measured seconds")
    parser.add_argument("--output", default="benchmarks/results/state.json")
    parser.add_argument("--trial", type=int, help=argparse.SUPPRESS)  # KEYS: one trial
    parser.add_argument("--trial-output", help=argparse.SUPPRESS)
    parser.add_argument("--trial-pipeline", default="global", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s bench-state %(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    if args.trial is not None:
        trial = run_here(args.trial, args.rate, args.seconds, args.trial_pipeline)
        with open(args.trial_output, "w") as out:
            json.dump(dataclasses.asdict(trial), out)
        return 0
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    log_dir = os.path.join(os.path.dirname(args.output) or ".", "logs", "state")
    trials = []
    runs = [("global", int(k)) for k in args.keys.split(",") if k]
    runs += [("sessions", int(k)) for k in args.sessions.split(",") if k]
    runs += [("stateful", int(k)) for k in args.stateful.split(",") if k]
    runs += [("side", int(k)) for k in args.side.split(",") if k]
    for name, keys in runs:
        trial = run_in_subprocess(keys, args.rate, args.seconds, log_dir, name)
        trials.append(trial)
        _LOGGER.info("%s", json.dumps(trial.summary()))
        with open(args.output, "w") as out:
            json.dump([t.summary() for t in trials], out, indent=1)
    print(markdown_table(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
