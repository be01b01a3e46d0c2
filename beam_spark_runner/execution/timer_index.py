"""Pending timers kept with an index of when they fire, their holds and their windows' expiry.

A streaming shard keeps its pending timers between micro-batches (``HeldTimers``); each
timer round asks which are due, each batch asks the earliest hold and which timers' windows
expired. Scanning every pending timer for each would cost a shard with many timers and
nothing due a pass over all of them every round. So beside the timers (by id, in the order
they were set: the order each family's due timers fire in) it keeps heaps, with lazy
deletion (an entry names a timer's id, its sequence number and the time it was pushed for;
it is stale once the timer is gone or set to another time, and dropped when met):

* per time domain, the timers by firing time. A round moves the due ones (firing time at
  or before the domain's bound) into a backlog of heaps per user key; each key with
  something in its backlog fires its earliest (event time first, then by timestamp; every
  timer tied with it), as ``PendingTimers.next_round`` specifies. A round with nothing due
  looks at the tops of the heaps; firing ``k`` timers costs about ``k log n``;
* the timers' output timestamps (holds), whose earliest is the top;
* the timers' windows' expiry, computed at the first expiry check after a timer is set.

A heap holding over twice the entries of the timers it indexes (plus ``_SLACK``) is rebuilt.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from apache_beam.utils.timestamp import Timestamp

# (transform id, family id, encoded user key, dynamic timer tag, windows)
TimerId = tuple[str, str, bytes, str, tuple[Any, ...]]
TimerFamilyId = tuple[str, str]
# Domain ranks: event time (its bound the watermark), processing time and any other (their
# bound the processing time), fired in this order within a key.
EVENT_RANK = 0
_RANKS = 3
# Stale entries a heap may hold beyond its live ones before it is rebuilt.
_SLACK = 64


def _micros(at: Any) -> int | None:
    """A bound (a Timestamp, seconds, or None: no bound) in microseconds."""
    return None if at is None else Timestamp.of(at).micros


def _covers(bound: int | None, earlier: int | None) -> bool:
    """Whether everything due by ``earlier`` is due by ``bound`` (None: +inf)."""
    return bound is None or (earlier is not None and bound >= earlier)


class HeldTimers:
    """The pending timers of a shard by id, in the order set, indexed by when they are due."""

    def __init__(self, ranks: Mapping[TimerFamilyId, int]) -> None:
        # Per family, its domain's rank (``EVENT_RANK`` or later).
        self._ranks = ranks
        self._timers: dict[TimerId, Any] = {}
        # Each timer's sequence number: the order it entered the pending timers.
        self._seq: dict[TimerId, int] = {}
        self._next_seq = 0
        # Per rank, (firing µs, seq, id); per user key, (rank, firing µs, seq, id) found due.
        self._firing: list[list[tuple[int, int, TimerId]]] = [[] for _ in range(_RANKS)]
        self._backlog: dict[bytes, list[tuple[int, int, int, TimerId]]] = {}
        # The bounds (watermark, processing time) the backlog was found due by.
        self._backlog_bounds: tuple[int | None, int | None] = (None, None)
        self._holds: list[tuple[int, int, TimerId]] = []
        # Timers set since the last expiry check (seq, id); then (expiry, seq, id).
        self._unchecked: list[tuple[int, TimerId]] = []
        self._expiries: list[tuple[float, int, TimerId]] = []

    def copy(self) -> HeldTimers:
        """The same timers, in the same order, indexed anew."""
        copied = HeldTimers(self._ranks)
        for timer_id, timer in self._timers.items():
            copied.set(timer_id, timer)
        return copied

    def __len__(self) -> int:
        return len(self._timers)

    def __bool__(self) -> bool:
        return bool(self._timers)

    def __contains__(self, timer_id: object) -> bool:
        return timer_id in self._timers

    def __getitem__(self, timer_id: TimerId) -> Any:
        return self._timers[timer_id]

    def __iter__(self) -> Iterator[TimerId]:
        return iter(self._timers)

    def items(self) -> Iterator[tuple[TimerId, Any]]:
        """(id, timer) of each pending timer, in the order they were set."""
        return iter(self._timers.items())

    def set(self, timer_id: TimerId, timer: Any) -> None:
        """Sets a timer: a new one goes last in the order; a timer set again keeps its place."""
        old = self._timers.get(timer_id)
        self._timers[timer_id] = timer
        if old is None:
            seq = self._seq[timer_id] = self._next_seq
            self._next_seq += 1
            self._unchecked.append((seq, timer_id))
        else:
            seq = self._seq[timer_id]
        at = timer.fire_timestamp.micros
        if old is None or old.fire_timestamp.micros != at:
            rank = self._ranks[(timer_id[0], timer_id[1])]
            heapq.heappush(self._firing[rank], (at, seq, timer_id))
        hold = timer.hold_timestamp
        if hold is not None and (
            old is None or old.hold_timestamp is None or old.hold_timestamp.micros != hold.micros
        ):
            heapq.heappush(self._holds, (hold.micros, seq, timer_id))
        if self._stale_entries() > 2 * len(self._timers) + _SLACK:
            self._rebuild()

    def pop(self, timer_id: TimerId) -> Any:
        """Removes a timer; returns it (None if it was not pending)."""
        timer = self._timers.pop(timer_id, None)
        if timer is not None:
            del self._seq[timer_id]
        return timer

    def _fires_at(self, timer_id: TimerId, seq: int, at: int) -> bool:
        timer = self._timers.get(timer_id)
        return (
            timer is not None and self._seq[timer_id] == seq and timer.fire_timestamp.micros == at
        )

    def due(self, watermark: Any = None, processing_time: Any = None) -> list[TimerId]:
        """Each user key's earliest due timers, in the order set; they stay pending.

        Due: event-time timers at or before ``watermark``, the others at or before
        ``processing_time`` (None: every timer of the domain). A key's earliest: its due
        timers of the first domain (event time first), at their earliest firing time.
        """
        bounds = (_micros(watermark), _micros(processing_time))
        if self._backlog and not all(map(_covers, bounds, self._backlog_bounds)):
            self._flush_backlog()
        self._backlog_bounds = bounds
        for rank, heap in enumerate(self._firing):
            bound = bounds[0] if rank == EVENT_RANK else bounds[1]
            while heap and (bound is None or heap[0][0] <= bound):
                at, seq, timer_id = heapq.heappop(heap)
                if self._fires_at(timer_id, seq, at):
                    backlog = self._backlog.setdefault(timer_id[2], [])
                    heapq.heappush(backlog, (rank, at, seq, timer_id))
        chosen: dict[TimerId, int] = {}
        for key in list(self._backlog):
            backlog = self._backlog[key]
            first: tuple[int, int] | None = None
            while backlog and (first is None or backlog[0][:2] == first):
                rank, at, seq, timer_id = heapq.heappop(backlog)
                if self._fires_at(timer_id, seq, at):
                    first = (rank, at)
                    chosen[timer_id] = seq
            if not backlog:
                del self._backlog[key]
        return sorted(chosen, key=chosen.__getitem__)

    def _flush_backlog(self) -> None:
        """Puts the timers found due back among the others (the bounds went back)."""
        for backlog in self._backlog.values():
            for rank, at, seq, timer_id in backlog:
                heapq.heappush(self._firing[rank], (at, seq, timer_id))
        self._backlog.clear()

    def earliest_hold(self) -> Any:
        """The earliest output timestamp of the pending timers (None without one)."""
        holds = self._holds
        while holds:
            at, seq, timer_id = holds[0]
            timer = self._timers.get(timer_id)
            if (
                timer is not None
                and self._seq[timer_id] == seq
                and timer.hold_timestamp is not None
                and timer.hold_timestamp.micros == at
            ):
                return timer.hold_timestamp
            heapq.heappop(holds)
        return None

    def expired(
        self, expiry: Callable[[str, tuple[Any, ...]], float], watermark: int
    ) -> list[TimerId]:
        """The timers whose expiry is before ``watermark``; they stay pending.

        ``expiry(transform id, windows)``: the watermark past which a timer is expired
        (``math.inf``: never); it must answer a timer the same every time.
        """
        for seq, timer_id in self._unchecked:
            if self._seq.get(timer_id) == seq:
                at = expiry(timer_id[0], timer_id[4])
                if at < math.inf:
                    heapq.heappush(self._expiries, (at, seq, timer_id))
        self._unchecked = []
        found: list[TimerId] = []
        expiries = self._expiries
        while expiries and expiries[0][0] < watermark:
            _, seq, timer_id = heapq.heappop(expiries)
            if self._seq.get(timer_id) == seq:
                found.append(timer_id)
        return found

    def _stale_entries(self) -> int:
        """The most entries of one heap (stale ones among them)."""
        return max(
            len(self._holds),
            len(self._expiries) + len(self._unchecked),
            *(len(heap) for heap in self._firing),
        )

    def _rebuild(self) -> None:
        """Indexes the pending timers anew, without stale entries (expiry at the next check)."""
        self._backlog.clear()
        self._firing = [[] for _ in range(_RANKS)]
        self._holds = []
        self._expiries = []
        self._unchecked = []
        for timer_id, timer in self._timers.items():
            seq = self._seq[timer_id]
            rank = self._ranks[(timer_id[0], timer_id[1])]
            self._firing[rank].append((timer.fire_timestamp.micros, seq, timer_id))
            if timer.hold_timestamp is not None:
                self._holds.append((timer.hold_timestamp.micros, seq, timer_id))
            self._unchecked.append((seq, timer_id))
        for heap in (*self._firing, self._holds):
            heapq.heapify(heap)
