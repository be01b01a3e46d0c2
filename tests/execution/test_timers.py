"""Pending timers' changes (``execution.timers``): what a streaming shard logs of a batch."""

from __future__ import annotations

import random
from typing import Any

from beam_spark_runner.execution.timers import PendingTimers
from tests.execution.test_state import EVENT, PROCESSING, encode, family, timer


def _families() -> dict[tuple[str, str], Any]:
    event, processing = family("ParDo", "event", EVENT), family("ParDo", "processing", PROCESSING)
    return {event.family_key: event, processing.family_key: processing}


def _held(pending: PendingTimers) -> list[tuple[Any, ...]]:
    """The pending timers, each family's in its order."""
    ordered = sorted(pending.held.items(), key=lambda item: item[0][:2])
    return [(timer_id, t.fire_timestamp, t.hold_timestamp) for timer_id, t in ordered]


def test_changes_replayed_on_the_timers_before_give_the_timers_after() -> None:
    """Random settings, clearings, rounds fired and timers forgotten; their changes, applied
    to a copy of the timers as they were, give the same timers, in the same order."""
    families = _families()
    draw = random.Random(63)
    keys = [f"k{i}" for i in range(30)]
    pending = PendingTimers(families)
    for batch in range(40):
        before = PendingTimers(families, dict(pending.held))
        pending = PendingTimers(families, pending.held)
        for _ in range(draw.randrange(6)):
            family_key = draw.choice(list(families))
            written = [
                timer(
                    draw.choice(keys), draw.randrange(100), draw.choice("xy"), draw.random() < 0.2
                )
                for _ in range(draw.randrange(1, 5))
            ]
            pending.add_written(family_key, encode(families[family_key], *written))
            if draw.random() < 0.3:
                pending.next_round(watermark=None if draw.random() < 0.2 else batch * 3)
        if draw.random() < 0.2:
            pending.forget(lambda _transform, _windows: draw.random() < 0.5)
        for family_key, data in pending.changes().items():
            before.add_written(family_key, data)
        assert _held(before) == _held(pending)


def test_a_batch_that_touches_a_few_timers_writes_those_only() -> None:
    families = _families()
    event = families[("ParDo", "event")]
    pending = PendingTimers(families)
    pending.add_written(event.family_key, encode(event, *(timer(f"k{i}", i) for i in range(1000))))
    everything = sum(map(len, pending.encoded().values()))
    pending = PendingTimers(families, pending.held)
    assert pending.changes() == {}
    pending.add_written(event.family_key, encode(event, timer("k5", 500), timer("new", 7)))
    pending.next_round(watermark=0)  # fires k0's
    changed = event.timer_coder_impl.decode_all(pending.changes()[event.family_key])
    assert sorted((t.user_key, t.clear_bit) for t in changed) == [
        ("k0", True),
        ("k5", False),
        ("new", False),
    ]
    assert sum(map(len, pending.changes().values())) * 100 < everything
