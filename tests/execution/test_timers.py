"""Pending timers' changes (``execution.timers``): what a streaming shard logs of a batch."""

from __future__ import annotations

import random
from typing import Any

import pytest
from apache_beam.utils.timestamp import Timestamp

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
        before = PendingTimers(families, pending.held.copy())
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
            pending.forget_expired(lambda _transform, _windows: 1000, draw.randrange(990, 1010))
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


_RANK = {EVENT: 0, PROCESSING: 1}


def _scanned_round(
    held: dict[Any, Any], families: dict[tuple[str, str], Any], watermark: Any, now: Any
) -> list[Any]:
    """The timers a round fires, found as the runner did before its index: a scan of all.

    Each key's due timers of the earliest (domain, firing time), in the order set.
    """

    def due(timer_id: Any) -> bool:
        event = families[timer_id[:2]].time_domain == EVENT
        bound = watermark if event else now
        return bound is None or held[timer_id].fire_timestamp <= bound

    def order(timer_id: Any) -> tuple[int, Any]:
        return (_RANK[families[timer_id[:2]].time_domain], held[timer_id].fire_timestamp)

    candidates = [t for t in held if due(t)]
    earliest: dict[bytes, tuple[int, Any]] = {}
    for timer_id in candidates:
        key = timer_id[2]
        earliest[key] = min(earliest.get(key, order(timer_id)), order(timer_id))
    return [t for t in candidates if order(t) == earliest[t[2]]]


def _fired_in_order(families: dict[tuple[str, str], Any], encoded: dict[Any, bytes]) -> list[Any]:
    return [
        (family_key, t.user_key, t.dynamic_timer_tag, t.fire_timestamp)
        for family_key, data in encoded.items()
        for t in families[family_key].timer_coder_impl.decode_all(data)
    ]


@pytest.mark.parametrize("seed", range(5))
def test_rounds_fire_what_a_scan_of_every_pending_timer_fires_in_its_order(seed: int) -> None:
    """Random settings, clearings, rounds at moving bounds and expiries, beside a scan."""
    families = _families()
    draw = random.Random(seed)
    keys = [f"k{i}" for i in range(12)]
    pending = PendingTimers(families)
    mirror: dict[Any, Any] = {}
    for step in range(400):
        family_key = draw.choice(list(families))
        written = [
            timer(draw.choice(keys), draw.randrange(60), draw.choice("xy"), draw.random() < 0.2)
            for _ in range(draw.randrange(1, 4))
        ]
        pending.add_written(family_key, encode(families[family_key], *written))
        mirror = dict(pending.held.items())
        for _ in range(draw.randrange(3)):
            watermark = None if draw.random() < 0.1 else Timestamp(draw.randrange(step // 8, 60))
            now = None if draw.random() < 0.1 else Timestamp(draw.randrange(60))
            expected = _scanned_round(mirror, families, watermark, now)
            order = {timer_id: n for n, timer_id in enumerate(mirror)}
            by_family = sorted(expected, key=lambda t: (t[:2], order[t]))
            fired = pending.next_round(watermark, now)
            assert _fired_in_order(families, fired) == [
                (t[:2], mirror[t].user_key, t[3], mirror[t].fire_timestamp) for t in by_family
            ]
            for timer_id in expected:
                del mirror[timer_id]
            assert list(pending.held) == list(mirror)
        holds = [t.hold_timestamp for t in mirror.values()]
        assert pending.earliest_hold() == min(holds, default=None)
        if draw.random() < 0.1:
            pending.forget_expired(lambda _transform, windows: 30 + len(windows), step // 10)
            if step // 10 > 31:
                assert not pending.held


def test_a_round_with_nothing_due_looks_at_no_pending_timer() -> None:
    """Nor do the hold and an expiry check with no timer set since the last: no scan."""
    families = _families()
    event = families[("ParDo", "event")]
    pending = PendingTimers(families)
    many = [timer(f"k{i}", 100 + i) for i in range(5000)]
    pending.add_written(event.family_key, encode(event, *many))
    pending.forget_expired(lambda _transform, _windows: 10_000, 0)
    held = pending.held

    class _NoScan(dict):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise AssertionError("the pending timers were scanned")

        values = items = keys = __iter__

    held._held = _NoScan(held._held)
    for _ in range(100):
        assert pending.next_round(Timestamp(50), Timestamp(50)) == {}
        assert pending.earliest_hold() == Timestamp(100)
        assert pending.forget_expired(lambda _transform, _windows: 10_000, 1000) == 0
    fired = pending.next_round(Timestamp(101), Timestamp(50))
    keys = sorted(t.user_key for t in event.timer_coder_impl.decode_all(fired[event.family_key]))
    assert keys == ["k0", "k1"]
