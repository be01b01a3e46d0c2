"""Watermarks per transform, as data: the bookkeeping of one stateful shard.

Every source and every shard of a stateful node is a *producer*: each micro-batch it sends
its output watermark, as a marker row, to every shard of every stateful node downstream
(through stateless stages, which hold nothing). A shard's input watermark is the minimum
over the producers it expects (a producer not heard from yet counts as -inf); its output
watermark is the minimum of its input watermark and its holds (buffered elements, unfired
panes, pending timers' output timestamps). Watermarks never go back.

Times are integer microseconds, as Beam's ``Timestamp.micros``; Beam's minimum and maximum
timestamps stand for -inf and +inf (a bounded input ends at +inf).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

# Beam's ``MIN_TIMESTAMP.micros`` and ``MAX_TIMESTAMP.micros``, written out: this module is
# imported where Beam is not (the streaming source's driver process; a test checks them).
MIN_MICROS: int = -9_223_372_036_854_775_000
MAX_MICROS: int = 9_223_372_036_854_775_000


def producer_id(node: int, shard: int) -> str:
    """The producer id of one shard of a stateful node."""
    return f"{node}#{shard}"


@dataclasses.dataclass(frozen=True)
class Marker:
    """A producer's output watermark and the runner's processing time, for one micro-batch."""

    producer: str
    watermark: int
    processing_time: int


@dataclasses.dataclass
class WatermarkState:
    """One shard's view of time: what each producer said last, and what it said itself.

    ``expected`` are the producers whose minimum is the input watermark. The state is small
    and kept with the shard's other state between micro-batches.
    """

    expected: frozenset[str]
    producers: dict[str, int] = dataclasses.field(default_factory=dict)
    input_watermark: int = MIN_MICROS
    output_watermark: int = MIN_MICROS
    processing_time: int = MIN_MICROS

    def __getstate__(self) -> dict[str, Any]:
        """What is pickled: ``expected`` as a sorted tuple.

        A frozenset pickles in its iteration order, which hangs on the hash seed (and, for
        colliding strings, on the order they went in): the same state would be stored as
        different bytes by different worker processes.
        """
        stored = dict(self.__dict__)
        stored["expected"] = tuple(sorted(self.expected))
        return stored

    def __setstate__(self, stored: dict[str, Any]) -> None:
        """What ``__getstate__`` wrote, or a state pickled before it (a frozenset)."""
        self.__dict__.update(stored)
        self.expected = frozenset(self.expected)

    def advance(self, markers: Iterable[Marker]) -> int:
        """Takes a micro-batch's markers; returns the new input watermark.

        A marker from a producer this shard does not expect is an error in the plan, not
        something to average in silently.
        """
        for marker in markers:
            if marker.producer not in self.expected:
                raise ValueError(
                    f"Expected markers from {sorted(self.expected)}, got one from "
                    f"{marker.producer!r}. This is a bug in SparkStructuredRunner's streaming "
                    "topology; please report it with the pipeline."
                )
            previous = self.producers.get(marker.producer, MIN_MICROS)
            self.producers[marker.producer] = max(previous, marker.watermark)
            self.processing_time = max(self.processing_time, marker.processing_time)
        self.input_watermark = max(
            self.input_watermark, input_watermark(self.expected, self.producers)
        )
        return self.input_watermark

    def output(self, hold: int = MAX_MICROS, input_watermark: int | None = None) -> int:
        """The output watermark: min(input watermark, ``hold``), never going back.

        ``input_watermark`` replaces the minimum over every expected producer where only
        some of them count (a stage's main input, not its side inputs).
        """
        current = self.input_watermark if input_watermark is None else input_watermark
        self.output_watermark = max(self.output_watermark, min(current, hold))
        return self.output_watermark


def input_watermark(expected: Iterable[str], producers: Mapping[str, int]) -> int:
    """The minimum over ``expected`` of what each producer said; -inf for one not heard from."""
    return min((producers.get(p, MIN_MICROS) for p in expected), default=MAX_MICROS)
