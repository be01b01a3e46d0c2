"""The user code alone: each workload's own Python per element in a plain loop, no runner.

The batch benchmark's ``user-code`` line. Each workload's generator (the function its Beam
pipeline's ``FlatMap`` expands the seeds with, or the lines of its text file), its DoFns'
and CombineFns' functions and the fingerprint of its output elements are called in a plain
Python loop in one process: no Spark, no Beam windowed values, bundles or counters, no
coder but the one the workload's own code calls (Nexmark q0's round trip). What a runner
does between the user's functions (grouping by key, joining) is a ``dict`` here. The
loop ends in the same summary (``results``, ``checksum``) as the other lines, so the
report's same-output rule checks that it did the whole work.

Its CPU time is the floor for any runner that runs Python per element: the report sets
ours' CPU against it (``report.cpu_table``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from benchmarks import nexmark
from benchmarks.workloads import (
    WORKLOADS,
    Inputs,
    NexmarkWorkload,
    Summary,
    _identity,
    _second,
    _sum_of_values,
    _weight,
    _weighted,
    key_values,
)


def tally(outputs: Iterable[Any], fingerprint: Callable[[Any], int]) -> Summary:
    """The output elements counted and their fingerprints summed, as ``workloads.Tally`` does."""
    results = checksum = 0
    for output in outputs:
        results += 1
        checksum += fingerprint(output)
    return Summary(results, checksum)


def _key_values(inputs: Inputs) -> Iterator[tuple[int, int]]:
    """The (key, value) elements, seed by seed, from the Beam pipeline's generator."""
    sizes = inputs.sizes
    for seed in range(sizes.seeds):
        yield from key_values(seed, sizes.elements, sizes.seeds, sizes.keys)


def _events(inputs: Inputs) -> Iterator[nexmark.Event]:
    """The Nexmark events, seed by seed, from the Beam pipeline's generator."""
    sizes = inputs.sizes
    for seed in range(sizes.seeds):
        for stamped in nexmark.timestamped_events(seed, sizes.events, sizes.seeds):
            yield stamped.value


def wordcount(inputs: Inputs) -> Summary:
    """The file's lines, ``str.split``, each word counted (``Count.PerElement``)."""
    if inputs.text_path is None:
        raise ValueError("the word count needs its text file: prepare its inputs first")
    counts: collections.Counter[str] = collections.Counter()
    with open(inputs.text_path, encoding="utf-8") as lines:
        for line in lines:
            for word in str.split(line):
                counts[word] += 1
    return tally(counts.items(), _second)


def groupbykey(inputs: Inputs) -> Summary:
    """The values grouped per key, each group summed (``Tally(_sum_of_values)``)."""
    groups: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
    for key, value in _key_values(inputs):
        groups[key].append(value)
    return tally(groups.items(), _sum_of_values)


def combineperkey(inputs: Inputs) -> Summary:
    """The values grouped per key, the CombineFn (``sum``) over each key's values."""
    groups: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
    for key, value in _key_values(inputs):
        groups[key].append(value)
    return tally(((key, sum(values)) for key, values in groups.items()), _second)


def sideinput(inputs: Inputs) -> Summary:
    """The side input's ``Map`` into a dict, then ``_weighted`` per element."""
    weights = dict((k, _weight(k)) for k in range(inputs.sizes.keys))
    return tally((_weighted(kv, weights) for kv in _key_values(inputs)), _identity)


def _q0(items: Iterable[nexmark.Event]) -> Iterator[Any]:
    return map(nexmark._round_trip, items)


def _q1(items: Iterable[nexmark.Event]) -> Iterator[Any]:
    return map(nexmark._to_euro, filter(nexmark._is_bid, items))


def _q2(items: Iterable[nexmark.Event]) -> Iterator[Any]:
    return map(nexmark._q2_project, filter(nexmark._q2_keep, items))


def _q3(items: Iterable[nexmark.Event]) -> Iterator[Any]:
    """Auctions of category 10 joined to their sellers in OR, ID or CA, projected."""
    persons: dict[int, Any] = {}
    auctions: list[Any] = []
    for item in items:
        if nexmark._q3_person(item):
            persons[item.id] = item
        elif nexmark._q3_auction(item):
            auctions.append(item)
    return (
        nexmark._q3_project((a.seller, (a, persons[a.seller])))
        for a in auctions
        if a.seller in persons
    )


_STATELESS_QUERIES: dict[int, Callable[[Iterable[nexmark.Event]], Iterator[Any]]] = {
    0: _q0,
    1: _q1,
    2: _q2,
    3: _q3,
}


def nexmark_query(query: int, inputs: Inputs) -> Summary:
    """Nexmark ``query``'s functions over the events: q0-q3 streamed, the windowed queries
    over the events in a list (``nexmark.python_query``)."""
    items = _events(inputs)
    if query in _STATELESS_QUERIES:
        outputs: Iterable[Any] = _STATELESS_QUERIES[query](items)
    else:
        outputs = nexmark.python_query(query, items)
    return tally(outputs, nexmark.FINGERPRINTS[query])


_BY_NAME: dict[str, Callable[[Inputs], Summary]] = {
    "wordcount": wordcount,
    "groupbykey": groupbykey,
    "combineperkey": combineperkey,
    "sideinput": sideinput,
}


def run(workload: str, inputs: Inputs) -> Summary:
    """The user code of ``workload`` alone over ``inputs``; its output summary."""
    if workload in _BY_NAME:
        return _BY_NAME[workload](inputs)
    definition = WORKLOADS.get(workload)
    if isinstance(definition, NexmarkWorkload):
        return nexmark_query(definition.query, inputs)
    raise ValueError(
        f"no user-code version of workload {workload!r}; known: "
        f"{', '.join(list(_BY_NAME) + [w for w in WORKLOADS if w.startswith('nexmark-')])}"
    )
