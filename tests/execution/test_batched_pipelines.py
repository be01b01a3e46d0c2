"""The batched path in whole pipelines on local[2]: results and metrics, path on and off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]


class Tag(beam.DoFn):
    def process(self, element: int, ts: Any = beam.DoFn.TimestampParam) -> Iterator[Any]:
        Metrics.counter("batched", "tagged").inc()
        yield element % 3, (element, int(ts))


def _expected() -> list[Any]:
    groups: dict[Any, list[Any]] = {}
    for x in range(1, 61):
        if x % 4 != 0:
            groups.setdefault(((x * 10) % 3, (x * 10) // 20 * 20), []).append(x * 10)
    return sorted((key[0], sorted(values)) for key, values in groups.items())


def _run(batched: str) -> Any:
    options = PipelineOptions([*SPARK_ARGS, f"--spark_batched_steps={batched}"])
    p = beam.Pipeline(options=options)
    grouped = (
        p
        | beam.Create(range(1, 61))
        | beam.Filter(lambda x: x % 4 != 0)
        | "Stamp" >> beam.Map(lambda x: window.TimestampedValue(x * 10, x * 10))
        | beam.WindowInto(window.FixedWindows(20))
        | beam.ParDo(Tag())
        | beam.MapTuple(lambda k, v: (k, v[0]))
        | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, sorted(vs)))
    )
    assert_that(grouped, equal_to(_expected()))
    result = p.run()
    result.wait_until_finish()
    return result


@pytest.mark.spark
def test_a_pipeline_gives_the_same_results_and_metrics_with_the_path_on_and_off() -> None:
    results = {batched: _run(batched) for batched in ("on", "off")}
    for result in results.values():
        (counter,) = result.metrics().query(MetricsFilter().with_name("tagged"))["counters"]
        assert counter.key.step == "ParDo(Tag)"
        assert counter.committed == 45
    counts = {
        batched: {
            (c.key.step, str(c.key.metric.name)): c.committed
            for c in result.monitoring_metrics().query()["counters"]
            if "element_count" in str(c.key.metric.name)
        }
        for batched, result in results.items()
    }
    assert counts["on"] == counts["off"]
    assert counts["on"], "no element counts"


class KeepHighest(beam.DoFn):
    """Nexmark q7's selection: a user DoFn taking the element and its window's maximum."""

    def process(self, element: int, highest: int) -> Iterator[int]:
        Metrics.counter("batched", "compared").inc()
        if element == highest:
            yield element


def _windowed_sides(batched: str) -> None:
    options = PipelineOptions([*SPARK_ARGS, f"--spark_batched_steps={batched}"])
    p = beam.Pipeline(options=options)
    values = (
        p
        | beam.Create(range(60))
        | "Stamp" >> beam.Map(lambda x: window.TimestampedValue(x * 7 % 61, x))
        | beam.WindowInto(window.FixedWindows(10))
    )
    highest = beam.pvalue.AsSingleton(values | beam.CombineGlobally(max).without_defaults())
    kept = values | beam.ParDo(KeepHighest(), highest)
    below = (
        values
        | beam.Filter(lambda x, top: x < top, highest)
        | beam.Map(lambda x, top: (top, x), highest)
        | "Count" >> beam.combiners.Count.PerKey()
    )
    windows = [[x * 7 % 61 for x in range(start, start + 10)] for start in range(0, 60, 10)]
    assert_that(kept, equal_to([max(w) for w in windows]), label="Kept")
    assert_that(below, equal_to([(max(w), 9) for w in windows]), label="Below")
    p.run().wait_until_finish()


@pytest.mark.spark
def test_windowed_side_inputs_give_each_window_its_value_with_the_path_on_and_off() -> None:
    for batched in ("on", "off"):
        _windowed_sides(batched)


def _cogroup(batched: str) -> None:
    """A CoGroupByKey in fixed windows, its result checked: the stage of its Flatten's read
    and GroupByKey's write passes the elements on (their bytes, with the path on)."""
    options = PipelineOptions([*SPARK_ARGS, f"--spark_batched_steps={batched}"])
    p = beam.Pipeline(options=options)
    stamped = (
        p
        | beam.Create(range(60))
        | beam.Map(lambda x: window.TimestampedValue(x, x))
        | beam.WindowInto(window.FixedWindows(20))
    )
    left = stamped | "Left" >> beam.Map(lambda x: (x % 4, x))
    right = stamped | "Right" >> beam.Map(lambda x: (x % 3, str(x)))
    joined = (
        {"left": left, "right": right}
        | beam.CoGroupByKey()
        | beam.Map(
            lambda kv, w=beam.DoFn.WindowParam: (
                int(w.start),
                kv[0],
                sorted(kv[1]["left"]),
                sorted(kv[1]["right"]),
            )
        )
    )
    expected = [
        (
            start,
            key,
            [x for x in range(start, start + 20) if x % 4 == key],
            sorted(str(x) for x in range(start, start + 20) if x % 3 == key),
        )
        for start in (0, 20, 40)
        for key in range(4)
    ]
    assert_that(joined, equal_to(expected))
    p.run().wait_until_finish()


@pytest.mark.spark
def test_a_cogroup_by_key_gives_the_same_results_with_the_path_on_and_off() -> None:
    for batched in ("on", "off"):
        _cogroup(batched)
