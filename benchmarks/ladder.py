"""The search for the highest event rate a runner keeps up with (``benchmarks.streaming``).

First up a ladder of rates (:func:`search_rates`: every other rate while a trial keeps up,
then the one skipped next to the boundary), which brackets the limit between a rate kept
up with and the next rate of the ladder; then bisection inside that bracket
(:func:`bisect_limit`: geometric midpoints) until the highest rate kept up with and the
lowest one failed are within ``WITHIN`` of each other, so that the limit is known to
within that fraction. A ladder of ×2 steps takes three more trials to get within 10 %.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

# How close the highest rate kept up with and the lowest failed end up (a fraction).
WITHIN = 0.10


def search_rates(rates: Sequence[int], keeps_up_at: Callable[[int], bool], start: int) -> None:
    """Finds the highest of ``rates`` (ascending) that a runner keeps up with, trying few:
    from ``rates[start]``, every other rate upwards while it keeps up (downwards until it
    does, if it does not at the start), then the rate skipped next to the boundary."""
    index = min(max(start, 0), len(rates) - 1)
    if keeps_up_at(rates[index]):
        while index < len(rates) - 1:
            upper = min(index + 2, len(rates) - 1)
            if not keeps_up_at(rates[upper]):
                if upper - index == 2:
                    keeps_up_at(rates[index + 1])
                return
            index = upper
        return
    while index > 0:
        lower = max(index - 2, 0)
        if keeps_up_at(rates[lower]):
            if index - lower == 2:
                keeps_up_at(rates[lower + 1])
            return
        index = lower


def bracket(results: dict[int, bool]) -> tuple[int | None, int | None]:
    """The highest rate kept up with among ``results`` (rate: kept up), and the lowest
    rate above it that was not (None where there is none)."""
    kept = max((rate for rate, ok in results.items() if ok), default=None)
    failed = min(
        (rate for rate, ok in results.items() if not ok and (kept is None or rate > kept)),
        default=None,
    )
    return kept, failed


def bisect_limit(
    kept: int, failed: int, keeps_up_at: Callable[[int], bool], within: float = WITHIN
) -> tuple[int, int]:
    """Narrows ``kept`` (a rate kept up with) and ``failed`` (a higher one not) by trials
    at their geometric midpoint until ``failed`` is at most ``1 + within`` times ``kept``
    (or no whole rate lies between them); returns the two."""
    if not 0 < kept < failed:
        raise ValueError(f"expected 0 < kept < failed, got kept={kept}, failed={failed}")
    while failed > kept * (1 + within):
        middle = round(math.sqrt(kept * failed))
        if not kept < middle < failed:
            break
        if keeps_up_at(middle):
            kept = middle
        else:
            failed = middle
    return kept, failed


def find_limit(
    rates: Sequence[int],
    keeps_up_at: Callable[[int], bool],
    start: int,
    within: float = WITHIN,
) -> tuple[int | None, int | None]:
    """The ladder search (:func:`search_rates`), then bisection (:func:`bisect_limit`):
    the highest rate kept up with and the lowest rate above it that was not, within
    ``within`` of each other where both exist (``within`` 0: the ladder's rates only).
    None for the first where even the ladder's lowest rate was not kept up with, for the
    second where its highest was."""
    results: dict[int, bool] = {}

    def attempt(rate: int) -> bool:
        results[rate] = keeps_up_at(rate)
        return results[rate]

    search_rates(rates, attempt, start)
    kept, failed = bracket(results)
    if kept is None or failed is None or within <= 0:
        return kept, failed
    return bisect_limit(kept, failed, attempt, within)
