"""Routers: the stateless fused stages between two stateful levels, in one ``mapInArrow``.

A router takes the rows addressed to its stages, runs each stage once over all of its
elements in the task (Beam's bundle processor, as in batch: ``execution.stage_worker``),
in plan order, and addresses each output to the nodes that read it: a stage of the same
router gets it at once, a later one as a row. A stage that a Spark stream sends its rows
as columns (``rows.COLUMNS``) gets them as a bundle of their own. A marker addressed to
one of its stages is passed to every reader of that stage (a stateless stage holds
nothing: its output watermark is its input watermark), or to the sink if nobody reads it.
Rows addressed to later steps pass through untouched. Its rows out are packed
(``rows.packed``).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from beam_spark_runner.execution.stage_worker import (
    StageSpec,
    TaskSinks,
    run_stage_bundles,
)
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.spark_sources import ColumnsInput, StreamColumns, cell_batches
from beam_spark_runner.streaming.topology import SINK, Topology
from beam_spark_runner.streaming.watermarks import Marker


@dataclasses.dataclass(frozen=True)
class RouterSpec:
    """What one router's tasks need.

    The topology, the specs of its stages, the Spark stream reads that may send it their
    rows as columns (by producer id), and per stage the outputs it sends in pickled runs,
    with their parts (``query.pickled_outputs``).
    """

    router: int
    topology: Topology
    stages: dict[int, StageSpec]
    reads: Mapping[str, StreamColumns] = dataclasses.field(default_factory=dict)
    runs: Mapping[int, Mapping[int, int]] = dataclasses.field(default_factory=dict)


def _bundles(
    spec: RouterSpec, cells: list[bytes], columns: list[tuple[str, bytes]]
) -> list[bytes | ColumnsInput]:
    """A stage's bundles: its encoded elements, and per read the rows it sent as columns."""
    bundles: list[bytes | ColumnsInput] = []
    if cells:
        bundles.append(b"".join(cells))
    by_read: dict[str, list[pa.RecordBatch]] = {}
    for producer, cell in columns:
        by_read.setdefault(producer, []).extend(cell_batches(cell))
    bundles.extend(ColumnsInput(spec.reads[p], batches) for p, batches in by_read.items())
    return bundles


def run_router(
    spec: RouterSpec, batches: Iterable[pa.RecordBatch], sinks: TaskSinks
) -> Iterator[pa.RecordBatch]:
    """The body of a router's ``mapInArrow`` (see the module doc)."""
    topology = spec.topology
    mine = pa.array(sorted(spec.stages), pa.int32())
    data: dict[int, list[bytes]] = collections.defaultdict(list)
    columns: dict[int, list[tuple[str, bytes]]] = collections.defaultdict(list)
    markers: dict[int, list[Marker]] = collections.defaultdict(list)
    for batch in batches:
        is_mine = pc.is_in(batch.column(routed.TARGET), value_set=mine)
        passing = batch.filter(pc.invert(is_mine))
        if passing.num_rows:
            yield passing
        for row in batch.filter(is_mine).to_pylist():
            if row[routed.PORT] == routed.COLUMNS:
                columns[row[routed.TARGET]].append((row[routed.PRODUCER], row[routed.ELEMENT]))
            elif row[routed.ELEMENT] is not None:
                data[row[routed.TARGET]].append(routed.cell(row[routed.ELEMENT]))
            else:
                markers[row[routed.TARGET]].append(routed.marker_of(row))
    out: list[routed.Row] = []
    for index, stage in spec.stages.items():  # plan (topological) order
        node = topology.nodes[index]
        bundles = _bundles(spec, data.pop(index, []), columns.pop(index, []))
        if bundles:
            unpacked = routed.framed_outputs(topology, node)
            runs = spec.runs.get(index, {})
            for output in run_stage_bundles(stage, bundles, sinks, unpacked, runs):
                out.extend(
                    routed.stage_output_rows(topology, node, output, spec.stages, data, runs)
                )
        for marker in markers.pop(index, []):
            for target in node.all_targets or (SINK,):
                if target in spec.stages:
                    markers[target].append(marker)
                else:
                    out.extend(routed.marker_rows(topology, target, marker))
    if out:
        yield routed.to_batch(routed.packed(out, topology))


def router_stage_order(topology: Topology, router: int) -> list[int]:
    """The indices of the stages router ``router`` runs, in plan order."""
    return [node.index for node in topology.stateless_in(router)]
