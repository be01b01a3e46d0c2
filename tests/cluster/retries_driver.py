"""A pipeline whose task attempts fail once, run clean and with failures; used by
``tests/monitoring/test_failed_attempts.py`` (local[2,2]) and
``tests/cluster/test_retries_standalone.py``.

Run as a script in a driver process of its own, never imported by pytest's process::

    python retries_driver.py --output-dir DIR --report r.json [beam args]

It runs the same pipeline twice on one Spark session: once clean, once with DoFns that
raise on the first attempt of every Spark task (``TaskContext.attemptNumber() == 0``),
after counting a few elements. Spark retries those tasks (the master or
``spark.task.maxFailures`` must allow a second attempt). Both a stage fed by a Reshuffle
and one fed by a GroupByKey fail. The report holds, per run, the output lines, the user
counters and distribution (committed and attempted), the committed element count of each
PCollection per stage, and the number of failed attempts that reported metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.io import WriteToText
from apache_beam.metrics import Metrics, monitoring_infos
from apache_beam.options.pipeline_options import PipelineOptions

NAMESPACE = "retries_test"
ELEMENTS = 2_000
KEYS = 13
# A failing attempt counts this many elements of its bundle, then raises.
FAIL_AFTER = 5


class FailFirstAttempt(beam.DoFn):
    """Counts elements; on a task's first attempt raises after ``FAIL_AFTER`` of a bundle."""

    def __init__(self, name: str, fail: bool) -> None:
        self._name = name
        self._fail = fail

    def setup(self) -> None:
        self._elements = Metrics.counter(NAMESPACE, f"{self._name}_elements")
        self._values = Metrics.distribution(NAMESPACE, f"{self._name}_values")

    def start_bundle(self) -> None:
        self._seen = 0

    def process(self, element: Any) -> Any:
        from pyspark import TaskContext

        self._elements.inc()
        self._values.update(element if isinstance(element, int) else element[0])
        self._seen += 1
        context = TaskContext.get()
        if self._fail and context is not None and context.attemptNumber() == 0:
            if self._seen >= FAIL_AFTER:
                raise RuntimeError(
                    f"deliberate failure of {self._name} in the first attempt of "
                    f"partition {context.partitionId()}"
                )
        yield element


def build(pipeline: beam.Pipeline, output: str, fail: bool) -> None:
    _ = (
        pipeline
        | beam.Create(range(ELEMENTS))
        | "First" >> beam.ParDo(FailFirstAttempt("first", fail))
        | beam.Map(lambda x: (x % KEYS, x))
        | beam.GroupByKey()
        | "Second" >> beam.ParDo(FailFirstAttempt("second", fail))
        | beam.MapTuple(lambda key, values: f"{key}: {sorted(values)}")
        | WriteToText(output)
    )


def read_lines(prefix: Path) -> list[str]:
    shards = sorted(prefix.parent.glob(prefix.name + "-*-of-*"))
    return sorted(line for shard in shards for line in shard.read_text().splitlines())


def run_once(name: str, fail: bool, output_dir: Path, beam_args: list[str]) -> dict[str, Any]:
    prefix = output_dir / name / "out"
    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    build(pipeline, str(prefix), fail)
    result = pipeline.run()
    result.wait_until_finish()
    metrics = result.metrics().query()
    counters = {
        r.key.metric.name: {"committed": r.committed, "attempted": r.attempted}
        for r in metrics["counters"]
        if r.key.metric.namespace == NAMESPACE
    }
    distributions = {
        r.key.metric.name: {
            kind: {
                "count": value.count,
                "sum": value.sum,
                "min": value.min,
                "max": value.max,
            }
            for kind, value in (("committed", r.committed), ("attempted", r.attempted))
        }
        for r in metrics["distributions"]
        if r.key.metric.namespace == NAMESPACE
    }
    element_counts: dict[str, int] = {}
    for stage, infos in result.monitoring_infos_by_stage().items():
        for info in infos:
            if info.urn == monitoring_infos.ELEMENT_COUNT_URN:
                pcollection = info.labels[monitoring_infos.PCOLLECTION_LABEL]
                element_counts[f"{stage}/{pcollection}"] = monitoring_infos.extract_counter_value(
                    info
                )
    return {
        "output": read_lines(prefix),
        "element_counts": element_counts,
        "counters": counters,
        "distributions": distributions,
        "failed_attempts": getattr(result, "failed_attempts", None),
        "spark_master": _spark_master(),
    }


def _spark_master() -> str | None:
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    return session.sparkContext.master if session is not None else None


def check_retried_run(report: dict[str, Any]) -> None:
    """The retried run matches the clean one; its failed attempts show in attempted only."""
    clean, retried = report["clean"], report["retried"]
    assert clean["output"], "the clean run wrote no output"
    assert retried["output"] == clean["output"]
    assert len(retried["output"]) == len(set(retried["output"]))
    assert clean["failed_attempts"] == 0
    assert retried["failed_attempts"] >= 2, "expected failed attempts in both failing stages"
    for name in ("first_elements", "second_elements"):
        clean_counter, counter = clean["counters"][name], retried["counters"][name]
        assert clean_counter["attempted"] == clean_counter["committed"], name
        assert counter["committed"] == clean_counter["committed"], name
        # Each failing attempt counted some elements before raising.
        assert counter["attempted"] > counter["committed"], name
    # System metrics too: elements per PCollection and stage, committed attempts only.
    assert clean["element_counts"], "the clean run reported no element counts"
    assert retried["element_counts"] == clean["element_counts"]
    elements = clean["counters"]["first_elements"]["committed"]
    assert elements == ELEMENTS
    assert clean["counters"]["second_elements"]["committed"] == KEYS  # one element per key
    first = retried["distributions"]["first_values"]
    assert first["committed"] == clean["distributions"]["first_values"]["committed"]
    assert first["committed"]["count"] == elements
    assert first["attempted"]["count"] == retried["counters"]["first_elements"]["attempted"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output-dir", required=True, type=Path)
    parser.add_argument("--report", required=True, type=Path)
    args, beam_args = parser.parse_known_args(argv)
    report = {
        "clean": run_once("clean", False, args.output_dir, beam_args),
        "retried": run_once("retried", True, args.output_dir, beam_args),
    }
    args.report.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
