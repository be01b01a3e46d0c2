"""A router's stage sending a stage with side inputs its main elements, in process.

Nexmark q7's first router (as ``benchmarks.first_stage_cpu`` builds it) over a ``rate``
batch: its bids go to the stage selecting the highest bid, which reads a side input.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import coders

from beam_spark_runner.coders import pickled_runs
from beam_spark_runner.streaming import rows as routed
from benchmarks import first_stage_cpu

# The bids' coder: untyped, so Beam's ``FastPrimitivesCoder``, length-prefixed on the wire.
_BIDS = coders.WindowedValueCoder(
    coders.LengthPrefixCoder(coders.FastPrimitivesCoder()), coders.IntervalWindowCoder()
)


def _routed(runs: bool) -> pa.Table:
    batch = first_stage_cpu.rate_batch(0, 5_000)
    return pa.Table.from_batches(first_stage_cpu.ours_first_stage(7, runs)(batch))


def _described(value: Any) -> str:
    return repr((value.timestamp_micros, tuple(value.windows), vars(value.value)))


def _cells(table: pa.Table, port: int) -> list[tuple[int, bytes]]:
    part = table.filter(pc.equal(table.column(routed.PORT), port))
    shards = part.column(routed.SHARD).to_pylist()
    cells = part.column(routed.ELEMENT).to_pylist()
    return [(s, routed.cell(e)) for s, e in zip(shards, cells, strict=True)]


def test_the_bids_go_in_pickled_runs_that_decode_as_each_encoded_bid_does() -> None:
    reader = pickled_runs.RunReader(_BIDS)
    in_runs: dict[int, list[str]] = {0: [], 1: []}
    for shard, cell in _cells(_routed(runs=True), routed.PICKLED_RUN):
        for run in pickled_runs.framed_runs(cell):
            in_runs[shard].extend(map(_described, reader.values(run)))
    one_by_one = _routed(runs=False)
    assert not _cells(one_by_one, routed.PICKLED_RUN)
    impl = _BIDS.get_impl()
    each = [
        _described(impl.decode(element))
        for _, cell in _cells(one_by_one, routed.FRAMED_RUN)
        for element in routed.framed_run_elements(cell)
    ]
    assert sorted(in_runs[0] + in_runs[1]) == sorted(each)
    assert len(each) > 4_000  # most events are bids
    # Both shards get half of them.
    assert abs(len(in_runs[0]) - len(in_runs[1])) <= 1
