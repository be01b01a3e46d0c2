"""Routed rows: elements bound for the same place travel packed, and unpack to the same run.

A routed row costs far more than its bytes (PySpark's ``transformWithState`` converts each
row's columns one value at a time), so routers, levels and sources pack the elements of a
target, shard and port into one row; every reader reads a cell as a run of elements, a
GroupByKey's shard a keyed run as (key, element) pairs.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from beam_spark_runner.coders import pickled_runs
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.topology import GROUP, STAGE, Node, Topology
from beam_spark_runner.streaming.watermarks import Marker

SHARDS = 3


def _topology() -> Topology:
    stateless = Node(0, "stateless", STAGE, False, 0, ((1, 2, 3),))
    stateful = Node(1, "stateful", STAGE, True, 1, ((),))
    last = Node(2, "last", STAGE, False, 1, ((),))
    group = Node(3, "group", GROUP, True, 1, ((),))
    waiting = Node(4, "with side inputs", STAGE, True, 1, ((),), side_expected=(frozenset("p"),))
    return Topology(
        (stateless, stateful, last, group, waiting), {"root": (0,)}, 2, SHARDS, frozenset()
    )


def _runs(rows: list[routed.Row]) -> dict[tuple[object, ...], list[tuple[bytes | None, bytes]]]:
    """Each target, shard and port's (key, element) pairs in order (elements are 2 bytes
    long; a keyed or framed run's pairs are under port 0; only a GroupByKey's keys are
    kept)."""
    runs: dict[tuple[object, ...], list[tuple[bytes | None, bytes]]] = {}
    for target, shard, key, packed, *_, port in rows:
        if packed is None:
            continue
        element = routed.cell(packed)
        if port == routed.KEYED_RUN:
            pairs = list(routed.keyed_run_elements(element))
            port = 0
        elif port == routed.FRAMED_RUN:
            pairs = [(None, e) for e in routed.framed_run_elements(element)]
            port = 0
        else:
            if target != 3:
                key = None
            pairs = [(key, element[i : i + 2]) for i in range(0, len(element), 2)]
        runs.setdefault((target, shard, port), []).extend(pairs)
    return runs


def _element(i: int) -> bytes:
    return i.to_bytes(2, "big")


def test_packed_rows_hold_each_addresses_elements_in_order_and_keep_the_markers() -> None:
    topology = _topology()
    rows: list[routed.Row] = []
    for i in range(30):
        key = b"k%d" % (i % 5)
        rows.append(routed.element_row(topology, 1, key, _element(i)))
        rows.append(routed.element_row(topology, 2, None, _element(i)))
        rows.append(routed.element_row(topology, 3, key, _element(i)))
        rows.append(routed.element_row(topology, 4, None, _element(i)))
        if i % 10 == 0:
            rows.extend(routed.side_element_rows(topology, 1, 1, _element(100 + i)))
            rows.extend(routed.side_element_rows(topology, 4, 1, _element(100 + i)))
    markers = list(routed.marker_rows(topology, 1, Marker("p", 5, 7)))
    packed = routed.packed([*rows[:7], *markers, *rows[7:]], topology)

    assert _runs(packed) == _runs(rows)
    # One row per target, shard and port: whatever the keys.
    elements = [r for r in packed if r[3] is not None]
    assert len(elements) == len(_runs(rows))
    assert len({(r[0], r[1], r[7]) for r in elements}) == len(elements)
    assert all(r[2] is None for r in elements)
    # A GroupByKey's elements travel with their keys, the others' without; a stage with
    # side inputs gets its main elements framed (it reads their headers), not its side
    # inputs' elements.
    assert {r[7] for r in elements if r[0] == 3} == {routed.KEYED_RUN}
    assert {r[7] for r in elements if r[0] == 4} == {routed.FRAMED_RUN, 1}
    assert {r[7] for r in elements if r[0] not in (3, 4)} == {0, 1}
    assert packed[len(elements) :] == markers


def test_a_run_is_cut_once_it_reaches_the_cell_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routed, "PACKED_CELL_BYTES", 7)
    topology = _topology()
    rows = [routed.element_row(topology, 2, None, _element(i)) for i in range(10)]
    packed = routed.packed(rows, topology)
    # Cut after the element that reaches 7 bytes: 4 elements (8 bytes) a row.
    assert [len(r[3] or b"") for r in packed] == [8, 8, 4]
    assert _runs(packed) == _runs(rows)


@pytest.mark.parametrize("target", [1, 2, 3, 4])
@pytest.mark.parametrize("cell_bytes", [routed.PACKED_CELL_BYTES, 9])
def test_addressed_rows_are_the_rows_packed_makes_of_a_row_per_element(
    monkeypatch: pytest.MonkeyPatch, target: int, cell_bytes: int
) -> None:
    """A router addresses a stage's outputs to a reader in runs: packed, the same rows,
    byte for byte, as a row per element packed, each address's rows in the same order (a
    stateful DoFn, a stateless stage, a GroupByKey, a stage with side inputs; runs cut or
    not)."""
    monkeypatch.setattr(routed, "PACKED_CELL_BYTES", cell_bytes)
    topology = _topology()
    keyed = target in (1, 3)
    elements = [_element(i) * (1 + i % 3) for i in range(40)]
    keys = [b"k%d" % (i % 7) if keyed else None for i in range(40)]
    expected = routed.packed(
        [routed.element_row(topology, target, k, e) for k, e in zip(keys, elements, strict=True)],
        topology,
    )
    rows = routed.packed(routed.addressed_rows(topology, target, keys, elements), topology)

    def by_address(row: routed.Row) -> tuple[int, int, int]:
        return row[0], row[1], row[7]

    assert sorted(rows, key=by_address) == sorted(expected, key=by_address)  # a stable sort
    addresses = [(r[0], r[1], r[7]) for r in expected]
    # Cut into several rows an address or not: each address's run whole.
    assert (len(set(addresses)) < len(addresses)) == (cell_bytes == 9)


def test_a_cell_of_many_elements_travels_compressed_and_reads_back_whole() -> None:
    topology = _topology()
    elements = [b"bid %d of auction 1000 at price 12233, date_time" % i for i in range(2_000)]
    rows = routed.packed([routed.element_row(topology, 4, None, e) for e in elements], topology)
    runs = [r for r in rows if r[3] is not None]
    assert len(runs) == SHARDS
    assert sum(len(r[3] or b"") for r in runs) * 5 < sum(map(len, elements))
    assert sorted(e for r in runs for e in routed.framed_run_elements(routed.cell(r[3]))) == sorted(
        elements
    )


@pytest.mark.parametrize("offset", [0, 3])
def test_an_element_batch_for_a_stateless_target_packs_runs_of_whole_elements(
    monkeypatch: pytest.MonkeyPatch, offset: int
) -> None:
    monkeypatch.setattr(routed, "PACKED_CELL_BYTES", 5)
    elements = [b"a" * (i % 4 + 1) for i in range(20)]
    column = pa.array(elements, pa.binary()).slice(offset)
    batch = routed.element_batch(_topology(), 2, column)
    cells = batch.column(routed.ELEMENT).to_pylist()
    assert b"".join(cells) == b"".join(elements[offset:])
    assert len(cells) < len(elements) - offset
    # Each cell ends at an element boundary, at the first one at or past 5 bytes.
    boundaries = {0}
    total = 0
    for element in elements[offset:]:
        total += len(element)
        boundaries.add(total)
    total = 0
    for cell in cells:
        total += len(cell)
        assert total in boundaries
        assert len(cell) >= 5 or total == len(b"".join(elements[offset:]))
    assert set(batch.column(routed.TARGET).to_pylist()) == {2}
    assert set(batch.column(routed.SHARD).to_pylist()) == {0}


def test_an_element_batch_for_a_stateful_target_packs_per_shard() -> None:
    elements = [_element(i) for i in range(40)]
    batch = routed.element_batch(_topology(), 1, pa.array(elements, pa.binary()))
    rows = [tuple(r.values()) for r in batch.to_pylist()]
    assert len(rows) == SHARDS
    expected: dict[tuple[object, ...], list[tuple[bytes | None, bytes]]] = {}
    for element in elements:
        shard = routed.shard_of(element, SHARDS)
        expected.setdefault((1, shard, 0), []).append((None, element))
    assert _runs(rows) == expected  # type: ignore[arg-type]


def test_a_sources_elements_travel_packed_a_stage_with_side_inputs_getting_a_framed_run() -> None:
    from beam_spark_runner.streaming.source_plan import SourcePlan, SourceStep

    topology = _topology()
    topology = Topology(topology.nodes, {"ts": (0, 4)}, 2, SHARDS, frozenset())
    step = SourceStep(
        elements=(("ts", tuple(_element(i) for i in range(6))),),
        watermarks=(("ts", 9),),
        advance=0,
    )
    rows = list(SourcePlan(topology, None, ((step,),)).rows(0, 0))
    elements = [r for r in rows if r[3] is not None]
    # The stateless reader gets one row; the stage with side inputs framed runs, per shard.
    assert {(r[0], r[7]) for r in elements} == {(0, 0), (4, routed.FRAMED_RUN)}
    assert _runs(elements) == _runs(
        [routed.element_row(topology, t, None, _element(i)) for t in (0, 4) for i in range(6)]
    )
    # Then one marker per root reader and shard.
    assert [r[5] for r in rows[len(elements) :]] == [9] * (1 + SHARDS)


def test_the_outputs_a_stage_with_side_inputs_reads_are_the_framed_ones() -> None:
    topology = _topology()
    feeding = Node(5, "feeding", STAGE, True, 1, ((1, 3), (2, 4), (4,), ()))
    assert routed.framed_outputs(topology, feeding) == frozenset({1, 2})
    assert routed.framed_outputs(topology, topology.nodes[0]) == frozenset()


def test_only_outputs_read_by_run_readers_alone_go_in_runs_one_per_shard() -> None:
    topology = _topology()
    # Outputs: one to the run reader 4 alone, one also to a GroupByKey, one to nobody, one
    # to 4 that is also a side input of 1.
    feeding = Node(
        5,
        "feeding",
        STAGE,
        True,
        1,
        ((4,), (3, 4), (), (4,)),
        side_targets=((), (), (), ((1, 1),)),
    )
    assert routed.run_outputs(topology, feeding, {4}, ()) == {0: SHARDS}
    assert routed.run_outputs(topology, feeding, {4}, {4}) == {}
    assert routed.run_outputs(topology, feeding, (), ()) == {}


def test_a_stage_outputs_runs_go_round_the_shards_as_they_are() -> None:
    topology = _topology()
    feeding = Node(5, "feeding", STAGE, False, 0, ((4,),))
    runs = [b"\xff\x01run" + bytes([i]) for i in range(4)]
    output = pa.RecordBatch.from_arrays(
        [pa.array([0] * 4, pa.int32()), pa.nulls(4, pa.binary()), pa.array(runs, pa.binary())],
        ["tag", "key", "element"],
    )
    # Only an output asked for in runs is read as runs.
    rows = routed.stage_output_rows(topology, feeding, output)
    assert {r[7] for r in rows} == {routed.FRAMED_RUN}
    rows = routed.stage_output_rows(topology, feeding, output, runs={0})
    assert [(r[0], r[1], r[7]) for r in rows] == [
        (4, i % SHARDS, routed.PICKLED_RUN) for i in range(4)
    ]
    assert [list(pickled_runs.framed_runs(r[3])) for r in rows] == [[run] for run in runs]


@pytest.mark.parametrize("cell_bytes", [routed.PACKED_CELL_BYTES, 9, 1])
@pytest.mark.parametrize("offset", [0, 5])
def test_a_column_for_a_stateless_stage_is_addressed_as_element_by_element(
    monkeypatch: pytest.MonkeyPatch, cell_bytes: int, offset: int
) -> None:
    """The same rows, byte for byte and in order, as ``addressed_rows``: runs cut or not,
    empty elements, a sliced column."""
    monkeypatch.setattr(routed, "PACKED_CELL_BYTES", cell_bytes)
    topology = _topology()
    elements = [_element(i) * (i % 4) for i in range(60)][offset:]
    column = pa.array([b"x"] * offset + elements, pa.binary()).slice(offset)
    expected = routed.addressed_rows(topology, 2, [None] * len(elements), elements)
    assert routed.addressed_column(topology, 2, column) == expected
    assert routed.addressed_column(topology, 2, column.slice(0, 0)) == []


@pytest.mark.parametrize("target", [1, 4])
@pytest.mark.parametrize("cell_bytes", [routed.PACKED_CELL_BYTES, 9, 1])
@pytest.mark.parametrize(("count", "offset"), [(61, 0), (61, 5), (2, 0), (0, 0)])
def test_a_column_for_a_stateful_stage_goes_to_its_shards_in_equal_contiguous_parts(
    monkeypatch: pytest.MonkeyPatch, target: int, cell_bytes: int, count: int, offset: int
) -> None:
    """A splittable DoFn's (1) or a stage with side inputs' (4) unkeyed elements: each
    shard a contiguous part (sizes differing by one at most, the larger first), in order,
    framed for the stage with side inputs, cut into runs as ``_runs`` cuts; packed, they
    read back as the elements."""
    monkeypatch.setattr(routed, "PACKED_CELL_BYTES", cell_bytes)
    topology = _topology()
    elements = [_element(i) * (i % 4) for i in range(count + offset)][offset:]
    column = pa.array([b"x"] * offset + elements, pa.binary()).slice(offset)
    rows = routed.addressed_column(topology, target, column)
    framed = target == 4
    assert {r[7] for r in rows} <= {routed.FRAMED_RUN if framed else 0}
    assert all(r[0] == target and r[2] is None for r in rows)
    parts: dict[int, list[bytes]] = {}
    for row in rows:
        parts.setdefault(row[1], []).append(row[3] or b"")
    shards = sorted(parts)
    assert shards == list(range(len(shards)))  # the first parts, in shard order
    read_back: list[bytes] = []
    sizes = []
    for shard in shards:
        data = b"".join(parts[shard])
        part = list(routed.framed_run_elements(data)) if framed else None
        if part is None:  # plain runs: the elements of the part, concatenated
            size = count // SHARDS + (shard < count % SHARDS)
            start = sum(sizes)
            part = elements[start : start + size]
            assert data == b"".join(part)
        sizes.append(len(part))
        read_back.extend(part)
    assert read_back == elements
    assert sizes == [count // SHARDS + (s < count % SHARDS) for s in range(len(sizes))]
    assert len(sizes) == min(count, SHARDS)
    if cell_bytes == 1 and framed:  # every framed element a run of its own
        assert len(rows) == count
    # Packed as a level reads them: the same elements per address.
    packed = routed.packed(rows, topology)
    assert _runs(packed) == _runs(rows)


def test_a_groupbykeys_elements_are_not_addressed_from_a_column_without_keys() -> None:
    with pytest.raises(ValueError, match="GroupByKey node 3"):
        routed.addressed_column(_topology(), 3, pa.array([b"a"], pa.binary()))
