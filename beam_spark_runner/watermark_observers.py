"""The transforms downstream of a TestStream that can tell when its watermark advanced.

A batch run reads every element of a TestStream, then moves the watermark to +inf. A
streaming run moves it as the script says, between elements. Where a transform's result
cannot depend on *when* the watermark moved, only on the elements and their timestamps,
the two runs agree. That holds for element-wise transforms, Flatten, WindowInto, side
inputs (a batch run shows each main-input window its side input's final panes, which a
streaming runner may wait for) and a GroupByKey with the default trigger over a standard
window function: its on-time pane of a window fires once the watermark reaches the
window's end, and an element that is not late lies in a window that has not ended yet.

The transforms whose results *can* depend on it are the *observers*:

* a DoFn with timers: a timer fires when the watermark (or processing time) passes it,
  before any element that arrives later, and its output can read state those elements
  would have changed;
* a GroupByKey with any other trigger or window function: early and late firings, and
  panes of windows this runner does not know, can fire between elements.

An observer sees time pass not only between elements of the TestStream that reach it
directly, but also between the outputs of an *emitter* upstream of it (a GroupByKey, or
a DoFn with timers), which emits when the watermark moves. :func:`find_observers` walks
the pipeline graph from a TestStream's outputs and reports, for each observer, which
outputs reach it directly and which reach it through an emitter;
:mod:`beam_spark_runner.batch_test_stream` decides from the script whether time passes
where an observer would see it.
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
# merge only windows that overlap: an element that is not late never lands in, or merges
# with, a window whose on-time pane has fired.
_STANDARD_WINDOW_FNS = (
    window.GlobalWindows,
    window.FixedWindows,
    window.SlidingWindows,
    window.Sessions,
)

Tag = str | None


@dataclass(frozen=True)
class WatermarkObserver:
    """A transform whose output can depend on when a TestStream's watermark advanced."""

    label: str
    why: str
    # The kinds of time it fires on: "event" (the watermark) and/or "processing".
    domains: frozenset[str]
    # TestStream outputs whose elements reach it without passing an emitter.
    direct_tags: frozenset[Tag]
    # TestStream outputs whose elements reach it through a GroupByKey or a DoFn with
    # timers, which emit when the watermark moves.
    emitted_tags: frozenset[Tag]

    @property
    def tags(self) -> frozenset[Tag]:
        """Every TestStream output that reaches this transform."""
        return self.direct_tags | self.emitted_tags


def _default_triggered(pcoll: PCollection) -> bool:
    windowing = pcoll.windowing
    trigger_fn = windowing.triggerfn
    on_time_only = isinstance(trigger_fn, trigger.DefaultTrigger) or (
        isinstance(trigger_fn, trigger.AfterWatermark)
        and trigger_fn.early is None
        and trigger_fn.late is None
    )
    return on_time_only and isinstance(windowing.windowfn, _STANDARD_WINDOW_FNS)


def _in_reshuffle(applied: AppliedPTransform) -> bool:
    # Beam's Reshuffle groups with a per-element trigger and restores the windowing: it
    # passes elements on as they come and neither emits on nor observes the watermark.
    parent = applied.parent
    while parent is not None:
        if isinstance(parent.transform, Reshuffle | ReshufflePerKey):
            return True
        parent = parent.parent
    return False


@dataclass(frozen=True)
class _Kind:
    emits: bool  # emits output when time passes (a GroupByKey, a DoFn with timers)
    why: str | None = None  # why it observes when time passed; None if it does not
    domains: frozenset[str] = frozenset()


def _classify(applied: AppliedPTransform) -> _Kind:
    transform = applied.transform
    if isinstance(transform, beam.GroupByKey):
        if _in_reshuffle(applied):
            return _Kind(emits=False)
        (pcoll,) = applied.main_inputs.values()
        if not isinstance(pcoll, PCollection) or _default_triggered(pcoll):
            return _Kind(emits=True)
        windowing = pcoll.windowing
        domains = frozenset({"event"})
        if bi.trigger_uses_processing_time(windowing.triggerfn):
            domains |= {"processing"}
        return _Kind(
            emits=True,
            why=(
                f"a GroupByKey triggered by {windowing.triggerfn} over "
                f"{type(windowing.windowfn).__name__}, whose panes can fire between elements"
            ),
            domains=domains,
        )
    if isinstance(transform, beam.ParDo):
        timer_domains = bi.dofn_timer_domains(transform.fn)
        if timer_domains:
            kinds = " and ".join(sorted(timer_domains))
            return _Kind(
                emits=True,
                why=f"a DoFn with {kinds}-time timers, which fire when time passes them",
                domains=timer_domains,
            )
    return _Kind(emits=False)


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
    reached: dict[str, dict[str, set[Tag]]] = {}
    kind_of: dict[str, _Kind] = {}
    for tag, start in outputs.items():
        if not isinstance(start, PCollection):
            continue
        # (PCollection, reached through an emitter?) pairs, walked breadth first.
        queue: deque[tuple[PCollection, bool]] = deque([(start, False)])
        seen: set[tuple[int, bool]] = set()
        while queue:
            pcoll, emitted = queue.popleft()
            if (id(pcoll), emitted) in seen:
                continue
            seen.add((id(pcoll), emitted))
            for consumer in leaves.consumers.get(pcoll, []):
                kind = _classify(consumer)
                if kind.why is not None:
                    label = consumer.full_label
                    kind_of[label] = kind
                    entry = reached.setdefault(label, {"direct": set(), "emitted": set()})
                    entry["emitted" if emitted else "direct"].add(tag)
                for output in consumer.outputs.values():
                    if isinstance(output, PCollection):
                        queue.append((output, emitted or kind.emits))
    return [
        WatermarkObserver(
            label=label,
            why=str(kind_of[label].why),
            domains=kind_of[label].domains,
            direct_tags=frozenset(entry["direct"]),
            emitted_tags=frozenset(entry["emitted"]),
        )
        for label, entry in sorted(reached.items())
    ]
