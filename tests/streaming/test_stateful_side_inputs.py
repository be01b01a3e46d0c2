"""Stateful DoFns reading streamed side inputs: Beam's slowly-updating pattern, stateful."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate

from beam_spark_runner.spark.compat import STREAMING_SPARK, pyspark_version
from tests import slowly_updating

if pyspark_version() < STREAMING_SPARK:
    pytest.skip(
        "streaming runs need PySpark 4.1+ (transformWithState on rows); this is older",
        allow_module_level=True,
    )


class _CountedRead(beam.DoFn):  # type: ignore[misc]
    """A stateful DoFn reading the side input: each element, the side value and its count."""

    SEEN = userstate.BagStateSpec("seen", VarIntCoder())

    def process(
        self, kv: tuple[str, float], side: float, seen: Any = beam.DoFn.StateParam(SEEN)
    ) -> Any:
        seen.add(1)
        yield kv[1], side


@pytest.mark.spark
@pytest.mark.slow
def test_a_stateful_dofn_reads_the_slowly_updating_side_input_as_it_streams(
    tmp_path: Path,
) -> None:
    start, end, records = slowly_updating.run(
        tmp_path,
        slowly_updating.windowed_side,
        lambda main, view: main | beam.Map(lambda at: ("k", at)) | beam.ParDo(_CountedRead(), view),
    )
    window_of = slowly_updating.WINDOW
    assert [(m, s) for m, s, _ in records] == [
        (float(t), float(t // window_of * window_of)) for t in range(int(start), int(end))
    ]
    first_window = [at for m, _, at in records if m < start + window_of]
    assert max(first_window) < end, "the first window was written only after the source ended"
