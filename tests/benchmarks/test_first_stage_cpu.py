"""The first-stage CPU helper: the rate source's batches, ours' first router run in-process."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from benchmarks import first_stage_cpu


def test_a_rate_batch_counts_on_with_a_hundred_rows_a_millisecond() -> None:
    batch = first_stage_cpu.rate_batch(250, 300)
    assert batch.column("value").to_pylist() == list(range(250, 550))
    micros = batch.column("timestamp").cast(pa.int64())
    assert pc.count_distinct(micros).as_py() == 4  # 250-299, 300-399, 400-499, 500-549
    assert pc.min(micros).as_py() == first_stage_cpu._START_MICROS + 2_000


def test_ours_first_router_routes_q7s_bids_and_both_sides_are_timed() -> None:
    from beam_spark_runner.streaming import rows as routed

    out = pa.Table.from_batches(
        first_stage_cpu.ours_first_stage(7)(first_stage_cpu.rate_batch(0, 2_000))
    )
    # The bids go to both shards of the stage with the side input, in pickled runs.
    framed = out.filter(pc.equal(out.column(routed.PORT), routed.PICKLED_RUN))
    assert sorted(set(framed.column(routed.SHARD).to_pylist())) == [0, 1]
    figures = first_stage_cpu.measure(0, rows=500, repeats=1)
    assert figures["ours_us_per_event"] > 0 and figures["floor_us_per_event"] > 0
