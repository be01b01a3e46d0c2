"""Unbounded transforms for tests: a splittable DoFn reading a side input, a refused source."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker

# Offsets each element's restriction holds: one claimed per resumption.
OFFSETS = 3
# What ``UnboundedWithSide`` output in this process.
READ: list[tuple[Any, int, Any]] = []


class Offsets(beam.transforms.core.RestrictionProvider):  # type: ignore[misc]
    """Offsets [0, OFFSETS) per element."""

    def initial_restriction(self, element: object) -> OffsetRange:
        return OffsetRange(0, OFFSETS)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: object, restriction: OffsetRange) -> int:
        return int(restriction.size())


class UnboundedWithSide(beam.DoFn):  # type: ignore[misc]
    """Claims one offset per call, deferring the rest: (element, offset, side value) each.

    Each resumption reads the side input again, as a residual of the element's window. Its
    outputs are also kept in ``READ``.
    """

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element: Any,
        side: Any,
        tracker: OffsetRestrictionTracker = beam.DoFn.RestrictionParam(Offsets()),
    ) -> Iterator[Any]:
        offset = tracker.current_restriction().start
        if tracker.try_claim(offset):
            READ.append((element, offset, side))
            yield element, offset, side
            if offset + 1 < OFFSETS:
                tracker.defer_remainder()


class UnboundedPrimitive(beam.PTransform):  # type: ignore[misc]
    """A primitive with an unbounded output of its own that is no splittable DoFn: refused."""

    def expand(self, pcoll: Any) -> Any:
        return beam.pvalue.PCollection(pcoll.pipeline, is_bounded=False)
