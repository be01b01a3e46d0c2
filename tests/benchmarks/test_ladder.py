"""The search for the highest rate a runner keeps up with: the ladder, then bisection."""

from __future__ import annotations

import pytest

from benchmarks.ladder import bisect_limit, bracket, find_limit, search_rates

LADDER = [250 * 2**k for k in range(16)]  # the streaming benchmark's default rates


def test_the_rate_search_tries_every_other_rate_then_the_one_next_to_the_boundary() -> None:
    rates = [250, 500, 1000, 2000, 4000, 8000, 16000, 32000]

    def tried(highest: int, start: int = 4) -> list[int]:
        attempts: list[int] = []

        def attempt(rate: int) -> bool:
            attempts.append(rate)
            return rate <= highest

        search_rates(rates, attempt, start)
        return attempts

    assert tried(8000) == [4000, 16000, 8000]
    assert tried(16000) == [4000, 16000, 32000]
    assert tried(4000) == [4000, 16000, 8000]
    # Not at the start: downwards every other rate, then the one above.
    assert tried(2000) == [4000, 1000, 2000]
    assert tried(1000) == [4000, 1000, 2000]
    assert tried(300) == [4000, 1000, 250, 500]
    assert tried(100) == [4000, 1000, 250]
    # Kept up with every one tried: the top of the ladder is tried too.
    assert tried(10**6) == [4000, 16000, 32000]
    assert tried(10**6, start=0) == [250, 1000, 4000, 16000, 32000]


def _limit_of(limit: float) -> tuple[list[int], tuple[int | None, int | None]]:
    """The rates tried and the bracket found for a runner that keeps up below ``limit``."""
    tried: list[int] = []

    def keeps_up_at(rate: int) -> bool:
        tried.append(rate)
        return rate <= limit

    found = find_limit(LADDER, keeps_up_at, LADDER.index(4000))
    return tried, found


@pytest.mark.parametrize("limit", [300, 999, 1000, 5000, 11_000, 23_456, 700_000, 3_000_000])
def test_bisection_brackets_each_runners_limit_to_within_ten_percent(limit: int) -> None:
    tried, (kept, failed) = _limit_of(limit)
    assert kept is not None and failed is not None
    assert kept <= limit < failed
    assert failed <= 1.1 * kept
    # The ladder's search brackets it within a factor 2; bisection takes 3 more trials.
    assert len(tried) == len(set(tried))
    ladder_trials = [rate for rate in tried if rate in LADDER]
    assert len(tried) - len(ladder_trials) <= 3


def test_a_ratio_of_two_runners_limits_means_what_it_says() -> None:
    """1.9x apart: the ladder alone (x2 steps) can put both at the same rate."""
    _, (ours, _) = _limit_of(10_000)
    _, (theirs, _) = _limit_of(19_000)
    assert ours is not None and theirs is not None
    assert 1.9 / 1.1 <= theirs / ours <= 1.9 * 1.1


def test_no_bisection_past_the_ends_of_the_ladder() -> None:
    tried, found = _limit_of(100)  # not even the lowest rate
    assert found == (None, 250)
    assert all(rate in LADDER for rate in tried)
    tried, found = _limit_of(10**9)  # every rate
    assert found == (LADDER[-1], None)
    assert all(rate in LADDER for rate in tried)


def test_no_bisection_when_asked_for_the_ladder_only() -> None:
    tried: list[int] = []

    def keeps_up_at(rate: int) -> bool:
        tried.append(rate)
        return rate <= 5000

    assert find_limit(LADDER, keeps_up_at, LADDER.index(4000), within=0) == (4000, 8000)
    assert tried == [4000, 16000, 8000]


def test_bisection_takes_geometric_midpoints_and_stops_without_a_whole_rate_between() -> None:
    tried: list[int] = []

    def keeps_up_at(rate: int) -> bool:
        tried.append(rate)
        return rate <= 5000

    assert bisect_limit(4000, 8000, keeps_up_at) == (4757, 5188)
    assert tried == [5657, 4757, 5188]
    assert bisect_limit(10, 11, keeps_up_at, within=0.01) == (10, 11)
    with pytest.raises(ValueError, match="kept < failed"):
        bisect_limit(8000, 4000, keeps_up_at)


def test_the_bracket_is_the_highest_rate_kept_up_with_and_the_next_failed_above_it() -> None:
    assert bracket({1000: True, 2000: False, 4000: False}) == (1000, 2000)
    # A failure below a success (a loaded machine) does not bound the limit.
    assert bracket({1000: False, 2000: True, 8000: False}) == (2000, 8000)
    assert bracket({1000: False}) == (None, 1000)
    assert bracket({}) == (None, None)
