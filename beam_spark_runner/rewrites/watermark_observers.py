"""The transforms downstream of a TestStream that could tell a batch run from a streaming one.

A batch run reads every element of a TestStream, then moves the watermark to +inf; a
streaming run moves it as the script says, between elements. The runs can differ only where
something depends on *when* time passed or *which event* brought an element: an *observer*,
a GroupByKey (but not a default-triggered one in the global window, which fires once, at
+inf) or a stateful DoFn. A default-triggered GroupByKey over standard windows reached only
through *transparent* paths (WindowInto, Flatten, Reshuffle) cannot see time pass; a ParDo
on the way, or another trigger, can. Elements also reach observers through *emitters* (a
GroupByKey, a DoFn with timers). :func:`find_observers` records how each TestStream output
reaches each observer; :mod:`beam_spark_runner.rewrites.batch_test_stream` decides the rest.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.pvalue import PCollection
from apache_beam.transforms import trigger, window
from apache_beam.transforms.util import Reshuffle, ReshufflePerKey

from beam_spark_runner import beam_internals as bi

# Window functions whose windows all contain their element's timestamp, and (Sessions)
# merge only windows that overlap.
_STANDARD_WINDOW_FNS = (
    window.GlobalWindows,
    window.FixedWindows,
    window.SlidingWindows,
    window.Sessions,
)

Tag = str | None

# How elements of a TestStream output reach a transform, from least to most altered.
TRANSPARENT = 0  # only WindowInto, Flatten and Reshuffle: timestamps kept
THROUGH_PARDO = 1  # through a ParDo, which may change timestamps
EMITTED = 2  # through a GroupByKey or a DoFn with timers, which emit when time passes

# What kind of observer.
DEFAULT_GROUPING = "default-triggered GroupByKey"
TRIGGERED_GROUPING = "triggered GroupByKey"
STATEFUL = "stateful DoFn"


@dataclass(frozen=True, eq=False)  # hashed by identity: the script checks key on it
class WatermarkObserver:
    """A transform whose output could tell a batch run of a TestStream from a streaming one."""

    label: str
    why: str
    kind: str  # DEFAULT_GROUPING, TRIGGERED_GROUPING or STATEFUL
    # The kinds of time it fires on: "event" (the watermark) and/or "processing".
    domains: frozenset[str]
    # Each TestStream output reaching it, with the most altering path it takes.
    paths: Mapping[Tag, int]
    # A triggered GroupByKey's window function (to tell which events feed which pane).
    window_fn: Any = None

    @property
    def tags(self) -> frozenset[Tag]:
        """Every TestStream output that reaches this transform."""
        return frozenset(self.paths)

    @property
    def emitted(self) -> bool:
        """Whether elements reach it through a GroupByKey or a DoFn with timers."""
        return EMITTED in self.paths.values()

    @property
    def transparent(self) -> bool:
        """Whether every output reaches it through WindowInto, Flatten and Reshuffle only."""
        return all(path == TRANSPARENT for path in self.paths.values())


def _default_triggered(windowing: Any) -> bool:
    trigger_fn = windowing.triggerfn
    on_time_only = isinstance(trigger_fn, trigger.DefaultTrigger) or (
        isinstance(trigger_fn, trigger.AfterWatermark)
        and trigger_fn.early is None
        and trigger_fn.late is None
    )
    return on_time_only and isinstance(windowing.windowfn, _STANDARD_WINDOW_FNS)


def _in_reshuffle(applied: AppliedPTransform) -> bool:
    # Beam's Reshuffle groups with a per-element trigger and restores the timestamps and
    # windowing: it passes elements on as they come.
    parent: AppliedPTransform | None = applied
    while parent is not None:
        if isinstance(parent.transform, Reshuffle | ReshufflePerKey):
            return True
        parent = parent.parent
    return False


@dataclass(frozen=True)
class _Kind:
    path: int  # what passing through it does to a path (TRANSPARENT, THROUGH_PARDO, EMITTED)
    observer: str | None = None  # DEFAULT_GROUPING, TRIGGERED_GROUPING, STATEFUL or None
    why: str = ""
    domains: frozenset[str] = frozenset()
    window_fn: Any = None


def _grouping(applied: AppliedPTransform) -> _Kind:
    (pcoll,) = applied.main_inputs.values()
    if not isinstance(pcoll, PCollection):
        return _Kind(path=EMITTED)
    windowing = pcoll.windowing
    name = type(windowing.windowfn).__name__
    if _default_triggered(windowing) and isinstance(windowing.windowfn, window.GlobalWindows):
        # Fires once, at +inf, whatever the timestamps: nothing is ever late in the
        # global window. Its output timestamps follow the timestamp combiner.
        return _Kind(path=THROUGH_PARDO)
    if _default_triggered(windowing):
        return _Kind(
            path=EMITTED,
            observer=DEFAULT_GROUPING,
            why=f"a GroupByKey over {name} windows, which can drop or re-fire late data",
            domains=frozenset({"event"}),
        )
    domains = frozenset({"event"})
    if bi.trigger_uses_processing_time(windowing.triggerfn):
        domains |= {"processing"}
    return _Kind(
        path=EMITTED,
        observer=TRIGGERED_GROUPING,
        why=f"a GroupByKey triggered by {windowing.triggerfn} over {name} windows",
        domains=domains,
        window_fn=windowing.windowfn,
    )


def _classify(applied: AppliedPTransform) -> _Kind:
    transform = applied.transform
    if isinstance(transform, beam.WindowInto | beam.Flatten) or _in_reshuffle(applied):
        return _Kind(path=TRANSPARENT)
    if isinstance(transform, beam.GroupByKey):
        return _grouping(applied)
    if isinstance(transform, beam.ParDo):
        has_state, domains = bi.dofn_state_and_timer_domains(transform.fn)
        if domains:
            kinds = " and ".join(sorted(domains))
            return _Kind(
                path=EMITTED,
                observer=STATEFUL,
                why=f"a DoFn with {kinds}-time timers, which fire when time passes them",
                domains=domains | {"event"},
            )
        if has_state:
            return _Kind(
                path=THROUGH_PARDO,
                observer=STATEFUL,
                why="a stateful DoFn, whose state expires with its windows",
                domains=frozenset({"event"}),
            )
    return _Kind(path=THROUGH_PARDO)


class _Leaves(PipelineVisitor):  # type: ignore[misc]
    """Maps each PCollection to the primitive transforms that consume it."""

    def __init__(self) -> None:
        self.consumers: dict[PCollection, list[AppliedPTransform]] = defaultdict(list)

    def visit_transform(self, applied: AppliedPTransform) -> None:
        inputs = list(applied.main_inputs.values())
        inputs += [side.pvalue for side in applied.side_inputs]
        for pcoll in inputs:
            if isinstance(pcoll, PCollection):
                self.consumers[pcoll].append(applied)


def find_observers(pipeline: beam.Pipeline, outputs: Mapping[Any, Any]) -> list[WatermarkObserver]:
    """The observers downstream of a TestStream's ``outputs`` (tag -> PCollection)."""
    leaves = _Leaves()
    pipeline.visit(leaves)
    paths: dict[str, dict[Tag, int]] = defaultdict(dict)
    kinds: dict[str, _Kind] = {}
    for tag, start in outputs.items():
        if not isinstance(start, PCollection):
            continue
        queue: deque[tuple[PCollection, int]] = deque([(start, TRANSPARENT)])
        seen: set[tuple[int, int]] = set()
        while queue:
            pcoll, path = queue.popleft()
            if (id(pcoll), path) in seen:
                continue
            seen.add((id(pcoll), path))
            for consumer in leaves.consumers.get(pcoll, []):
                kind = _classify(consumer)
                if kind.observer is not None:
                    label = consumer.full_label
                    kinds[label] = kind
                    paths[label][tag] = max(paths[label].get(tag, TRANSPARENT), path)
                for output in consumer.outputs.values():
                    if isinstance(output, PCollection):
                        queue.append((output, max(path, kind.path)))
    return [
        WatermarkObserver(
            label=label,
            why=kinds[label].why,
            kind=str(kinds[label].observer),
            domains=kinds[label].domains,
            paths=dict(paths[label]),
            window_fn=kinds[label].window_fn,
        )
        for label in sorted(paths)
    ]
