"""The streaming graph: routers, levels, targets and watermark producers (no Spark)."""

from __future__ import annotations

from beam_spark_runner.streaming.topology import (
    GROUP,
    SINK,
    STAGE,
    NodeSpec,
    build_topology,
    canonical_order,
)


def _stage(name: str, inputs: list[tuple[str, str]], *outputs: list[tuple[str, str]]) -> NodeSpec:
    return NodeSpec(name, STAGE, False, tuple(inputs), tuple(tuple(o) for o in outputs))


def _group(name: str, inputs: list[tuple[str, str]], readers: list[tuple[str, str]]) -> NodeSpec:
    return NodeSpec(name, GROUP, True, tuple(inputs), (tuple(readers),))


def test_a_chain_of_two_groupings_has_two_levels_and_three_routers() -> None:
    specs = [
        _stage("read", [("root", "ts")], [(GROUP, "g1")]),
        _group("g1", [(STAGE, "read")], [(STAGE, "mid")]),
        _stage("mid", [(GROUP, "g1")], [(GROUP, "g2")]),
        _group("g2", [(STAGE, "mid")], [(STAGE, "out")]),
        _stage("out", [(GROUP, "g2")]),
    ]
    topology = build_topology(specs, shards=2)
    steps = {n.name: n.step for n in topology.nodes}
    assert steps == {"read": 0, "g1": 1, "mid": 1, "g2": 2, "out": 2}
    assert topology.levels == 2
    assert topology.roots == {"ts": (0,)}
    # The second grouping waits for both shards of the first; the source is behind them.
    assert topology.nodes[3].expected == {"1#0", "1#1"}
    assert topology.nodes[1].expected == {"ts"}
    # The last stage reads nothing onward: the second grouping's shards reach the sink.
    assert topology.sink_producers == {"3#0", "3#1"}
    assert topology.nodes[4].all_targets == ()


def test_a_stage_read_twice_sends_each_reader_its_copy_and_a_flatten_unions() -> None:
    specs = [
        _stage("a", [("root", "impulse")], [(STAGE, "left"), (STAGE, "right")]),
        _stage("left", [(STAGE, "a")], [(GROUP, "g")]),
        _stage("right", [(STAGE, "a")], [(STAGE, "join")]),
        _group("g", [(STAGE, "left")], [(STAGE, "join")]),
        # A Flatten of the grouping's output and an unkeyed branch: read after level 1.
        _stage("join", [(GROUP, "g"), (STAGE, "right")]),
    ]
    topology = build_topology(specs, shards=3)
    assert topology.nodes[0].targets == ((1, 2),)
    assert [n.name for n in topology.stateless_in(0)] == ["a", "left", "right"]
    assert [n.name for n in topology.stateless_in(1)] == ["join"]
    assert topology.sink_producers == {"impulse", "3#0", "3#1", "3#2"}


def test_a_branch_without_grouping_reaches_the_sink_with_its_sources_watermark() -> None:
    topology = build_topology([_stage("only", [("root", "ts")])], shards=2)
    assert topology.levels == 0
    assert topology.sink_producers == {"ts"}
    assert SINK not in topology.nodes[0].all_targets


def test_nodes_are_numbered_by_identity_whatever_order_beam_gave_the_stages() -> None:
    # Two independent branches: Beam's stage order between them follows object identity,
    # and a stage's name its fusion order; state is keyed by node index.
    def specs(names: dict[str, str]) -> list[NodeSpec]:
        return [
            NodeSpec(names["x"], STAGE, False, (("root", "impulse"),), (), identity="x-parts"),
            NodeSpec(
                names["y"],
                STAGE,
                False,
                (("root", "impulse"),),
                (((GROUP, "g"),),),
                identity="y-parts",
            ),
            _group("g", [(STAGE, names["y"])], []),
        ]

    one = specs({"x": "(a)+(b)", "y": "(c)+(d)"})
    other = specs({"x": "(b)+(a)", "y": "(d)+(c)"})
    other = [other[1], other[2], other[0]]  # y, g, x: also topological
    first = build_topology(canonical_order(one), shards=2)
    second = build_topology(canonical_order(other), shards=2)
    assert [(n.identity, n.index, n.step) for n in first.nodes] == [
        (n.identity, n.index, n.step) for n in second.nodes
    ]
    # Among ready nodes the smallest identity goes first; a reader after its feeders.
    assert [n.identity for n in first.nodes] == ["x-parts", "y-parts", "g"]
