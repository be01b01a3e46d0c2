"""Beam's DataFrame API, and the splittable DoFn with a side input its readers use.

Beam's DataFrame readers (``read_csv``, ``read_parquet``, ...) are splittable DoFns with a
side input; the Reshuffle that Beam's ``expand_sdf`` inserts before their process step
carries every input of the DoFn, side inputs included (issue 13).
"""

from __future__ import annotations

import glob
import typing
from pathlib import Path

import apache_beam as beam
from apache_beam.dataframe.convert import to_dataframe, to_pcollection
from apache_beam.dataframe.io import read_csv
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.core import RestrictionProvider

from beam_spark_runner.planning import build_plan


class _CountUpTo(RestrictionProvider):
    def initial_restriction(self, element: int) -> OffsetRange:
        return OffsetRange(0, element)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: int, restriction: OffsetRange) -> int:
        return restriction.size()


class _EmitWithOffset(beam.DoFn):
    """A splittable DoFn that also reads a side input."""

    def process(
        self,
        element: int,
        offset: int,
        tracker: OffsetRestrictionTracker = beam.DoFn.RestrictionParam(_CountUpTo()),
    ) -> typing.Iterator[int]:
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            yield position + offset
            position += 1


def _sdf_with_side_input(pipeline: beam.Pipeline) -> beam.PCollection:
    offset = pipeline | "Offset" >> beam.Create([100])
    return (
        pipeline
        | "Sizes" >> beam.Create([2, 3])
        | beam.ParDo(_EmitWithOffset(), beam.pvalue.AsSingleton(offset))
    )


def test_splittable_dofn_with_a_side_input_plans() -> None:
    pipeline = beam.Pipeline()
    _sdf_with_side_input(pipeline)
    plan = build_plan(pipeline.to_runner_api())
    assert any(buffer.kind == "reshuffle" for buffer in plan.buffers.values())


def test_splittable_dofn_with_a_side_input_runs(beam_options: list[str]) -> None:
    with beam.Pipeline(options=PipelineOptions(beam_options)) as pipeline:
        assert_that(_sdf_with_side_input(pipeline), equal_to([100, 101, 100, 101, 102]))


def _csv_group_sum(runner_args: list[str], source: Path, output: Path) -> list[str]:
    with beam.Pipeline(options=PipelineOptions(runner_args)) as pipeline:
        frame = pipeline | read_csv(str(source))
        frame.groupby("city").sum().to_csv(str(output))
    lines: list[str] = []
    for path in sorted(glob.glob(f"{output}*")):
        lines.extend(Path(path).read_text().splitlines())
    return lines


def test_read_csv_groupby_sum_to_csv_matches_direct_runner(
    beam_options: list[str], tmp_path: Path
) -> None:
    source = tmp_path / "sales.csv"
    rows = [f"{city},{amount},{amount * 2}" for city, amount in [("ams", 3), ("ber", 5)] * 30]
    source.write_text("city,amount,tax\n" + "\n".join(rows) + "\n")

    expected = _csv_group_sum(["--runner=DirectRunner"], source, tmp_path / "direct")
    actual = _csv_group_sum(beam_options, source, tmp_path / "spark")

    assert sorted(actual) == sorted(expected)
    assert "ams,90,180" in actual and "ber,150,300" in actual


class Sale(typing.NamedTuple):
    city: str
    amount: int


beam.coders.registry.register_coder(Sale, beam.coders.RowCoder)


def test_to_dataframe_and_back_on_a_schemad_pcollection(beam_options: list[str]) -> None:
    with beam.Pipeline(options=PipelineOptions(beam_options)) as pipeline:
        sales = pipeline | beam.Create(
            [Sale("ams", 3), Sale("ber", 5), Sale("ams", 4)]
        ).with_output_types(Sale)
        frame = to_dataframe(sales)
        totals = frame.groupby("city").sum()
        rows = to_pcollection(totals, include_indexes=True)
        assert_that(
            rows | beam.Map(lambda row: (row.city, row.amount)),
            equal_to([("ams", 7), ("ber", 5)]),
        )
