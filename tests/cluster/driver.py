"""Beam pipelines the cluster tests run in a driver process of their own.

Run as a script (``python driver.py ...`` or ``spark-submit driver.py ...``), never imported
by pytest's process: the runner keeps one SparkSession per process, and the other tests in
the pytest process run on local[2]. Each pipeline's outcome goes to a JSON report that the
tests read:

    python driver.py suite --input words.txt --output-dir DIR --report r.json [beam args]
    python driver.py wordcount --input words.txt --output PREFIX [--report r.json] [beam args]

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
from apache_beam.io import ReadFromText, WriteToText
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

NAMESPACE = "cluster_test"


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
    """Records, as a string set metric, which JVM runs this DoFn's Python worker."""

    def setup(self) -> None:
        self._jvm = _jvm_ancestor()
        self._jvms = Metrics.string_set(NAMESPACE, "jvms")

    def process(self, element: Any):
        self._jvms.add(self._jvm)
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


# --- (b) GroupByKey, side input, tagged outputs, CombinePerKey -------------------------------


class SplitByParity(beam.DoFn):
    """Tags each (key, value) by the value's parity, naming the key's group from a side input."""

    def process(self, element: tuple[str, int], groups: dict[str, str]):
        key, value = element
        tag = "odd" if value % 2 else "even"
        yield beam.pvalue.TaggedOutput(tag, (groups[key], value))
        yield f"{key}-{value}"


def mixed(beam_args: list[str]) -> dict[str, Any]:
    keys = [f"k{i}" for i in range(20)]
    values = [(keys[i % 20], i) for i in range(2000)]
    groups = {key: f"g{int(key[1:]) % 3}" for key in keys}
    expected_group_sum: dict[str, int] = {}
    expected_tagged: dict[str, dict[str, int]] = {"odd": {}, "even": {}}
    for key, value in values:
        expected_group_sum[key] = expected_group_sum.get(key, 0) + value
        tag = "odd" if value % 2 else "even"
        bucket = expected_tagged[tag]
        bucket[groups[key]] = bucket.get(groups[key], 0) + value

    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    pairs = (
        pipeline
        | "Values" >> beam.Create(values)
        | "Spread" >> beam.Reshuffle()
        | "Where" >> beam.ParDo(RecordJvm())
    )
    group_names = pipeline | "Groups" >> beam.Create(sorted(groups.items()))
    grouped = (
        pairs
        | "GroupByKey" >> beam.GroupByKey()
        | "SumGroups" >> beam.MapTuple(lambda key, vs: (key, sum(vs), len(list(vs))))
    )
    assert_that(
        grouped,
        equal_to([(key, total, 100) for key, total in expected_group_sum.items()]),
        label="CheckGroupByKey",
    )
    tagged = pairs | "Split" >> beam.ParDo(
        SplitByParity(), groups=beam.pvalue.AsDict(group_names)
    ).with_outputs("odd", "even", main="main")
    assert_that(
        tagged.main | "CountMain" >> beam.combiners.Count.Globally(),
        equal_to([2000]),
        label="CheckMain",
    )
    for tag in ("odd", "even"):
        summed = tagged[tag] | f"Sum{tag}" >> beam.CombinePerKey(sum)
        assert_that(summed, equal_to(sorted(expected_tagged[tag].items())), label=f"Check{tag}")
    # A list side input too, read by every element of a second stage.
    totals = pairs | "Values only" >> beam.Values() | "Total" >> beam.CombineGlobally(sum)
    shares = pairs | "Share" >> beam.Map(
        lambda kv, total: kv[1] * 0 + total[0], total=beam.pvalue.AsList(totals)
    )
    assert_that(
        shares | "DistinctShare" >> beam.Distinct(),
        equal_to([sum(range(2000))]),
        label="CheckListSideInput",
    )
    result = pipeline.run()
    result.wait_until_finish()
    return _describe(result)


# --- (c) user metrics ----------------------------------------------------------------------


class CountingDoFn(beam.DoFn):
    def __init__(self) -> None:
        self.elements = Metrics.counter(NAMESPACE, "elements")
        self.multiples = Metrics.counter(NAMESPACE, "multiples_of_7")
        self.sizes = Metrics.distribution(NAMESPACE, "sizes")

    def process(self, element: int):
        self.elements.inc()
        if element % 7 == 0:
            self.multiples.inc()
        self.sizes.update(element)
        yield element


def metrics(beam_args: list[str]) -> dict[str, Any]:
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    (
        pipeline
        | "Numbers" >> beam.Create(list(range(10_000)))
        | "Spread" >> beam.Reshuffle()
        | "Where" >> beam.ParDo(RecordJvm())
        | "Counting" >> beam.ParDo(CountingDoFn())
        | "Sum" >> beam.CombineGlobally(sum)
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
    return report


# --- plumbing ------------------------------------------------------------------------------


def _describe(result: Any) -> dict[str, Any]:
    """State, Spark application and master, and the JVMs user code ran in."""
    report: dict[str, Any] = {
        "state": str(result.state),
        "spark_application_id": getattr(result, "spark_application_id", None),
        "driver_pid": os.getpid(),
        "jvms": [],
    }
    string_sets = result.metrics().query(MetricsFilter().with_name("jvms"))["string_sets"]
    for entry in string_sets:
        report["jvms"] = sorted(set(report["jvms"]) | set(entry.committed))
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
    parser.add_argument("command", choices=["suite", "wordcount"])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", help="wordcount: output prefix")
    parser.add_argument("--output-dir", help="suite: directory for the word count output")
    parser.add_argument("--report", help="JSON report to write")
    known, beam_args = parser.parse_known_args(argv)
    reports: dict[str, Any] = {}
    if known.command == "wordcount":
        reports["wordcount"] = _run("wordcount", wordcount, known.input, known.output, beam_args)
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
