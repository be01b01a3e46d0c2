"""The plan of a streaming run as routed nodes, levels and watermark producers (pure Python).

Fused stages and GroupByKeys become *nodes*: stateless ones run in *routers*
(``mapInArrow``), stateful ones in *levels* (a ``groupBy(target, shard)`` and
``transformWithState`` each), in one chain: source, router 0, level 1, ..., router L, sink.
Every row carries its target node, so steps pass on rows for later steps unchanged, an
output read by several stages is copied per reader, and the Spark plan never forks (a forked
plan would run the shared part once per branch). Watermarks travel as marker rows from
*producers* (a source, each shard of a stateful node) to every shard of the stateful nodes
downstream, so every shard runs every micro-batch; markers leaving the graph go to the sink,
where the driver sees +inf reach every branch.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
from collections.abc import Mapping, Sequence

from beam_spark_runner.streaming.watermarks import producer_id

SINK = -1
STAGE = "stage"
GROUP = "group"


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of the streaming graph: a fused stage or a GroupByKey."""

    index: int
    name: str
    kind: str
    stateful: bool
    # The router (stateless) or level (stateful) that runs the node.
    step: int
    # Per output of the node (a GroupByKey has one), the nodes reading it as main input.
    targets: tuple[tuple[int, ...], ...]
    # Stateful nodes: every producer they hear from (main and side inputs).
    expected: frozenset[str] = frozenset()
    # The producers whose minimum is the node's (main) input watermark.
    main_expected: frozenset[str] = frozenset()
    # Per output, the (node, side input number from 1) reading it as a side input.
    side_targets: tuple[tuple[tuple[int, int], ...], ...] = ()
    # Per side input of the node, the producers whose minimum is its watermark.
    side_expected: tuple[frozenset[str], ...] = ()
    # What the node is, the same in every process (a fused stage's name is not: Beam fuses
    # in protobuf map order, which varies between processes); defaults to ``name``.
    identity: str = ""

    @property
    def all_targets(self) -> tuple[int, ...]:
        """Every node reading any output (as main or side input), once each, in order."""
        sides = (t for targets in self.side_targets for t, _ in targets)
        return tuple(dict.fromkeys([*(t for ts in self.targets for t in ts), *sides]))


@dataclasses.dataclass(frozen=True)
class Topology:
    """The nodes, the roots' readers, the number of levels and what reaches the sink."""

    nodes: tuple[Node, ...]
    # Root buffer (producer) id -> the nodes reading it.
    roots: Mapping[str, tuple[int, ...]]
    levels: int
    shards: int
    sink_producers: frozenset[str]

    def node_of(self, name: str, kind: str = STAGE) -> Node:
        """The node of a stage (or, with ``kind=GROUP``, of a group buffer) by name."""
        for node in self.nodes:
            if node.name == name and node.kind == kind:
                return node
        raise KeyError(name)

    def stateless_in(self, router: int) -> list[Node]:
        """The stateless nodes router ``router`` runs, in plan (topological) order."""
        return [n for n in self.nodes if not n.stateful and n.step == router]

    def stateful_in(self, level: int) -> list[Node]:
        """The stateful nodes of level ``level``."""
        return [n for n in self.nodes if n.stateful and n.step == level]


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """A node as ``build_topology`` sees it: its inputs and per-output readers, by name.

    An input or reader is ``("stage", name)``, ``("group", buffer name)`` or
    ``("root", producer id)``; a reader of an output as side input number ``n`` (from 1) is
    ``("stage", name, n)``. ``side_inputs`` lists, per side input, what feeds it. A stage
    with side inputs is stateful: its main elements wait in state for their side inputs.
    """

    name: str
    kind: str
    stateful: bool
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[tuple[str, ...], ...], ...]
    side_inputs: tuple[tuple[tuple[str, str], ...], ...] = ()
    # The same in every process (see ``Node.identity``); ``name`` if empty.
    identity: str = ""


def canonical_order(specs: Sequence[NodeSpec]) -> list[NodeSpec]:
    """``specs`` in a topological order that depends only on their identities.

    State is keyed by node index, so a restarted query must number its nodes as the one
    that wrote the checkpoint did; Beam's stage order breaks ties by object identity.
    Among the nodes whose inputs are all placed, the smallest identity goes first.
    """
    index = {(s.kind, s.name): i for i, s in enumerate(specs)}
    feeders = [
        {
            index[(r[0], r[1])]
            for r in (*s.inputs, *(r for side in s.side_inputs for r in side))
            if r[0] != "root"
        }
        for s in specs
    ]
    readers: dict[int, list[int]] = {i: [] for i in range(len(specs))}
    for i, needs in enumerate(feeders):
        for feeder in needs:
            readers[feeder].append(i)
    waiting = [len(needs) for needs in feeders]
    ready = [(specs[i].identity or specs[i].name, i) for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    ordered: list[NodeSpec] = []
    while ready:
        _, i = heapq.heappop(ready)
        ordered.append(specs[i])
        for reader in readers[i]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (specs[reader].identity or specs[reader].name, reader))
    if len(ordered) != len(specs):
        raise ValueError(
            "Expected an acyclic streaming graph; found a cycle among "
            f"{sorted(s.name for i, s in enumerate(specs) if waiting[i])}. This is a bug in "
            "SparkStructuredRunner's streaming planning; please report it with the pipeline."
        )
    return ordered


def build_topology(specs: Sequence[NodeSpec], shards: int) -> Topology:
    """Assigns routers and levels, targets and expected producers (see the module doc).

    ``specs`` must be in topological order (Beam's ``sort_stages`` gives stages in that
    order; a GroupByKey comes after its writers).
    """
    index = {(s.kind, s.name): i for i, s in enumerate(specs)}

    @functools.cache
    def available_at(ref: tuple[str, str]) -> int:
        """The router index at which ``ref``'s output can first be read."""
        if ref[0] == "root":
            return 0
        return step(index[ref])

    @functools.cache
    def step(i: int) -> int:
        spec = specs[i]
        feeders = [*spec.inputs, *(r for side in spec.side_inputs for r in side)]
        ready = max((available_at(r) for r in feeders), default=0)
        return ready + 1 if spec.stateful else ready

    @functools.cache
    def produced(ref: tuple[str, str]) -> frozenset[str]:
        """The producers whose markers leave ``ref`` (itself if stateful)."""
        if ref[0] == "root":
            return frozenset([ref[1]])
        i = index[ref]
        if specs[i].stateful:
            return frozenset(producer_id(i, s) for s in range(shards))
        return upstream(i)

    @functools.cache
    def upstream(i: int) -> frozenset[str]:
        return frozenset().union(*(produced(r) for r in specs[i].inputs))

    nodes = []
    sink: set[str] = set()
    for i, spec in enumerate(specs):
        targets = tuple(
            tuple(index[(r[0], r[1])] for r in output if len(r) == 2) for output in spec.outputs
        )
        side_targets = tuple(
            tuple((index[(r[0], r[1])], int(r[2])) for r in output if len(r) == 3)
            for output in spec.outputs
        )
        sides = tuple(frozenset().union(*(produced(r) for r in side)) for side in spec.side_inputs)
        main = upstream(i) if spec.stateful else frozenset()
        node = Node(
            index=i,
            name=spec.name,
            kind=spec.kind,
            stateful=spec.stateful,
            step=step(i),
            targets=targets,
            expected=main.union(*sides),
            main_expected=main,
            side_targets=side_targets if any(side_targets) else (),
            side_expected=sides,
            identity=spec.identity or spec.name,
        )
        nodes.append(node)
        if not node.all_targets:
            sink |= produced((spec.kind, spec.name))
    roots: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        for ref in spec.inputs:
            if ref[0] == "root":
                roots.setdefault(ref[1], []).append(i)
    levels = max((n.step for n in nodes if n.stateful), default=0)
    return Topology(
        nodes=tuple(nodes),
        roots={root: tuple(readers) for root, readers in roots.items()},
        levels=levels,
        shards=shards,
        sink_producers=frozenset(sink),
    )
