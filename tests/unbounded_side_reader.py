"""An unbounded splittable DoFn reading a side input: what streaming refuses, for tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker


class Offsets(beam.transforms.core.RestrictionProvider):  # type: ignore[misc]
    """Offsets [0, 1) per element."""

    def initial_restriction(self, element: object) -> OffsetRange:
        return OffsetRange(0, 1)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: object, restriction: OffsetRange) -> int:
        return int(restriction.size())


class UnboundedWithSide(beam.DoFn):  # type: ignore[misc]
    """Reads its side input itself, so a streaming run refuses it (a DoFn after it may)."""

    @beam.DoFn.unbounded_per_element()
    def process(
        self,
        element: Any,
        side: Any,
        tracker: OffsetRestrictionTracker = beam.DoFn.RestrictionParam(Offsets()),
    ) -> Iterator[Any]:
        if tracker.try_claim(0):
            yield element, side
