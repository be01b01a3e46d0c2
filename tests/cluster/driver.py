"""Beam pipelines the cluster tests run in a driver process of their own.

Run as a script (``python driver.py ...`` or ``spark-submit driver.py ...``), never imported
by pytest's process: the runner keeps one SparkSession per process, and the other tests in
the pytest process run on local[2]. Each pipeline's outcome goes to a JSON report that the
tests read:

    python driver.py suite --input words.txt --output-dir DIR --report r.json [beam args]
    python driver.py wordcount --input words.txt --output PREFIX [--report r.json] [beam args]
    python driver.py mixed|metrics [--report r.json] [beam args]

Every report names the JVMs whose Python workers ran user code (``jvms``: JVM main class
and pid, with the number of elements each saw), so a test can tell executor JVMs from the
driver's. Use absolute paths: on a cluster, relative ones resolve against each executor's
working directory.

``suite`` runs the word count, the GroupByKey/side input/tagged outputs/CombinePerKey
pipeline and the metrics pipeline one after the other on one Spark session (starting Spark
and executors once), recording each pipeline's error separately so one failure does not
hide the others. Unknown arguments are Beam pipeline options (``--runner``,
``--spark_master``, ``--spark_conf`` ...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from typing import Any

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.io import ReadFromText, WriteToText
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.window import GlobalWindow

NAMESPACE = "cluster_test"
JVM_NAMESPACE = "cluster_jvm"


def _jvm_ancestor() -> str:
    """``<main class>:<pid>`` of the nearest JVM among this process's ancestors.

    A Python worker started by a Spark executor descends from
    ``org.apache.spark.executor.CoarseGrainedExecutorBackend``; one started by a local[*]
    driver descends from the driver's JVM (``org.apache.spark.deploy.SparkSubmit``).
    """
    pid = os.getpid()
    for _ in range(20):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                stat = handle.read()
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: the parent pid
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
        except (OSError, IndexError, ValueError):
            return "unknown"
        if argv and os.path.basename(argv[0]) == "java":
            classes = [a for a in argv if re.fullmatch(r"org\.apache\.spark\.[\w.]+", a)]
            return f"{classes[0] if classes else 'java'}:{pid}"
        if pid <= 1:
            break
    return "unknown"


class RecordJvm(beam.DoFn):
    """Counts elements per JVM running this DoFn's Python worker (``jvm:<class>:<pid>``).

    Counters rather than a string set: counters are summed across tasks by every runner,
    so this evidence does not depend on how the runner merges other metric kinds.
    """

    def setup(self) -> None:
        self._counter = Metrics.counter(JVM_NAMESPACE, f"jvm:{_jvm_ancestor()}")

    def process(self, element: Any):
        self._counter.inc()
        yield element


# --- (a) word count -----------------------------------------------------------------------


def wordcount(input_path: str, output_prefix: str, beam_args: list[str]) -> dict[str, Any]:
    options = PipelineOptions(beam_args)
    pipeline = beam.Pipeline(options=options)
    (
        pipeline
        | "Read" >> ReadFromText(input_path)
        | "Split" >> beam.FlatMap(lambda line: re.findall(r"[A-Za-z']+", line))
        | "Where" >> beam.ParDo(RecordJvm())
        | "Count" >> beam.combiners.Count.PerElement()
        | "Format" >> beam.MapTuple(lambda word, count: f"{word}: {count}")
        | "Write" >> WriteToText(output_prefix)
    )
    result = pipeline.run()
    result.wait_until_finish()
    return _describe(result)


# --- (b) GroupByKey, side inputs, tagged outputs, CombinePerKey ------------------------------

KEYS = 20
VALUES = 2000


def mixed_expected() -> list[tuple[str, Any]]:
    """What :func:`mixed` must produce, computed in plain Python."""
    groups = {f"k{i}": f"g{i % 3}" for i in range(KEYS)}
    by_key: dict[str, list[int]] = {}
    by_group: dict[tuple[str, str], int] = {}
    for value in range(VALUES):
        key = f"k{value % KEYS}"
        by_key.setdefault(key, []).append(value)
        parity = "odd" if value % 2 else "even"
        by_group[parity, groups[key]] = by_group.get((parity, groups[key]), 0) + value
    expected: list[tuple[str, Any]] = [
        ("gbk", (key, sum(vs), len(vs), VALUES - 1)) for key, vs in by_key.items()
    ]
    expected += [("sum", (parity, group, s)) for (parity, group), s in by_group.items()]
    expected.append(("sum", ("main", "all", VALUES)))
    expected += [("state", (key, len(vs), sum(vs))) for key, vs in by_key.items()]
    return expected


class CountAndSumPerKey(beam.DoFn):
    """State and an event-time timer: each key's count and sum, emitted when it fires."""

    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())
    VALUES = userstate.BagStateSpec("values", VarIntCoder())
    END = userstate.TimerSpec("end", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        element: Any,
        count: Any = beam.DoFn.StateParam(COUNT),
        values: Any = beam.DoFn.StateParam(VALUES),
        end: Any = beam.DoFn.TimerParam(END),
    ) -> None:
        count.write((count.read() or 0) + 1)
        values.add(element[1])
        end.set(GlobalWindow().max_timestamp())

    @userstate.on_timer(END)
    def flush(
        self,
        key: Any = beam.DoFn.KeyParam,
        count: Any = beam.DoFn.StateParam(COUNT),
        values: Any = beam.DoFn.StateParam(VALUES),
    ) -> Any:
        yield "state", (key, count.read(), sum(values.read()))


def summarise_group(group: tuple[str, Any], maxima: list[int]) -> tuple[str, Any]:
    key, values = group
    values = list(values)
    return "gbk", (key, sum(values), len(values), max(maxima))


class SplitByParity(beam.DoFn):
    """Tags each (key, value) by parity; names the key's group from a dict side input.

    Outputs are keyed by (tag, group) so one CombinePerKey sums all three outputs.
    """

    def process(self, element: tuple[str, int], groups: dict[str, str]):
        key, value = element
        parity = "odd" if value % 2 else "even"
        yield beam.pvalue.TaggedOutput(parity, ((parity, groups[key]), value))
        yield ("main", "all"), 1


def mixed(beam_args: list[str]) -> dict[str, Any]:
    """GroupByKey + AsDict and AsList side inputs + tagged outputs + CombinePerKey + state.

    Every result is tagged and flattened into one ``assert_that``: each assert_that costs
    a GroupByKey and Spark jobs of its own, and this runs on a 2-core machine. For the
    same reason it avoids CombineGlobally (its default-value handling adds side inputs).
    """
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    pairs = (
        pipeline
        | "Values" >> beam.Create([(f"k{v % KEYS}", v) for v in range(VALUES)])
        | "Spread" >> beam.Reshuffle()
        | "Where" >> beam.ParDo(RecordJvm())
    )
    groups = pipeline | "Groups" >> beam.Create([(f"k{i}", f"g{i % 3}") for i in range(KEYS)])
    # A list side input computed on the executors: each key's largest value.
    maxima = pairs | "MaxPerKey" >> beam.CombinePerKey(max) | "Maxima" >> beam.Values()
    grouped = (
        pairs
        | "GroupByKey" >> beam.GroupByKey()
        | "SumGroups" >> beam.Map(summarise_group, maxima=beam.pvalue.AsList(maxima))
    )
    tagged = pairs | "Split" >> beam.ParDo(
        SplitByParity(), groups=beam.pvalue.AsDict(groups)
    ).with_outputs("odd", "even", main="main")
    sums = (
        (tagged.main, tagged.odd, tagged.even)
        | "FlattenTagged" >> beam.Flatten()
        | "SumPerTagAndGroup" >> beam.CombinePerKey(sum)
        | "Label" >> beam.MapTuple(lambda tag_group, total: ("sum", (*tag_group, total)))
    )
    stateful = pairs | "CountAndSum" >> beam.ParDo(CountAndSumPerKey())
    assert_that(
        (grouped, sums, stateful) | "FlattenAll" >> beam.Flatten(),
        equal_to(mixed_expected()),
        label="CheckAll",
    )
    result = pipeline.run()
    result.wait_until_finish()
    return _describe(result)


# --- (c) user metrics ----------------------------------------------------------------------

NUMBERS = 10_000


class CountingDoFn(beam.DoFn):
    """A counter, a distribution, and a string set naming each bundle, plus a bundle count."""

    def __init__(self) -> None:
        self.elements = Metrics.counter(NAMESPACE, "elements")
        self.multiples = Metrics.counter(NAMESPACE, "multiples_of_7")
        self.sizes = Metrics.distribution(NAMESPACE, "sizes")
        self.bundles = Metrics.counter(NAMESPACE, "bundles")
        self.bundle_ids = Metrics.string_set(NAMESPACE, "bundle_ids")

    def setup(self) -> None:
        self._bundle_serial = 0

    def start_bundle(self) -> None:
        self._bundle_serial += 1
        self._bundle = f"{os.getpid()}-{id(self)}-{self._bundle_serial}"
        self._bundle_seen = False

    def process(self, element: int):
        if not self._bundle_seen:  # only bundles with elements: empty ones report nothing
            self._bundle_seen = True
            self.bundles.inc()
            self.bundle_ids.add(self._bundle)
        self.elements.inc()
        if element % 7 == 0:
            self.multiples.inc()
        self.sizes.update(element)
        yield element


def metrics(beam_args: list[str]) -> dict[str, Any]:
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    (
        pipeline
        | "Numbers" >> beam.Create(list(range(NUMBERS)))
        | "Spread" >> beam.Reshuffle()
        | "Where" >> beam.ParDo(RecordJvm())
        | "Counting" >> beam.ParDo(CountingDoFn())
    )
    result = pipeline.run()
    result.wait_until_finish()
    report = _describe(result)
    query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    report["counters"] = {
        c.key.metric.name: {"committed": c.committed, "attempted": c.attempted}
        for c in query["counters"]
    }
    report["distributions"] = {
        d.key.metric.name: {
            "count": d.committed.count,
            "sum": d.committed.sum,
            "min": d.committed.min,
            "max": d.committed.max,
        }
        for d in query["distributions"]
    }
    report["string_sets"] = {s.key.metric.name: sorted(s.committed) for s in query["string_sets"]}
    return report


# --- plumbing ------------------------------------------------------------------------------


def _describe(result: Any) -> dict[str, Any]:
    """State, Spark application and master, and the JVMs user code ran in."""
    report: dict[str, Any] = {
        "state": str(result.state),
        "spark_application_id": getattr(result, "spark_application_id", None),
        "driver_pid": os.getpid(),
        "jvms": {},
    }
    query = result.metrics().query(MetricsFilter().with_namespace(JVM_NAMESPACE))
    for counter in query["counters"]:
        name = counter.key.metric.name.removeprefix("jvm:")
        report["jvms"][name] = report["jvms"].get(name, 0) + counter.committed
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:
            report["spark_master"] = session.sparkContext.master
    except Exception:  # noqa: BLE001 - DirectRunner runs have no Spark
        pass
    return report


def _run(name: str, function: Any, *args: Any) -> dict[str, Any]:
    started = time.monotonic()
    try:
        report = function(*args)
        report["ok"] = True
    except BaseException as error:  # noqa: BLE001 - reported to the test
        report = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        report["traceback"] = traceback.format_exc()
        traceback.print_exc()
    report["seconds"] = round(time.monotonic() - started, 1)
    print(f"driver.py: {name}: ok={report['ok']} in {report['seconds']} s", file=sys.stderr)
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["suite", "wordcount", "mixed", "metrics"])
    parser.add_argument("--input", help="word count: input file")
    parser.add_argument("--output", help="wordcount: output prefix")
    parser.add_argument("--output-dir", help="suite: directory for the word count output")
    parser.add_argument("--report", help="JSON report to write")
    known, beam_args = parser.parse_known_args(argv)
    reports: dict[str, Any] = {}
    if known.command == "wordcount":
        reports["wordcount"] = _run("wordcount", wordcount, known.input, known.output, beam_args)
    elif known.command == "mixed":
        reports["mixed"] = _run("mixed", mixed, beam_args)
    elif known.command == "metrics":
        reports["metrics"] = _run("metrics", metrics, beam_args)
    else:
        prefix = os.path.join(known.output_dir, "counts")
        reports["wordcount"] = _run("wordcount", wordcount, known.input, prefix, beam_args)
        reports["mixed"] = _run("mixed", mixed, beam_args)
        reports["metrics"] = _run("metrics", metrics, beam_args)
    if known.report:
        with open(known.report, "w") as handle:
            json.dump(reports, handle, indent=2)
    return 0 if all(r["ok"] for r in reports.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
