"""The events the floor's tests run on: Nexmark's first events, in Arrow-batch-sized slices."""

from __future__ import annotations

from benchmarks import nexmark

TOTAL = 25_000
BATCH = 10_000  # rows per Arrow batch, as Spark's


def event_batches() -> list[tuple[range, list[int]]]:
    """The events' numbers and times (us) in Arrow-batch-sized slices."""
    micros = [nexmark.millis(nexmark.event(n)) * 1000 for n in range(TOTAL)]
    return [
        (range(first, min(first + BATCH, TOTAL)), micros[first : first + BATCH])
        for first in range(0, TOTAL, BATCH)
    ]
