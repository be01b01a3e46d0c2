"""Pending timers kept with an index of when they fire, their holds and their windows' expiry.

A streaming shard keeps its pending timers between micro-batches (``HeldTimers``); each
timer round asks which are due, each batch asks the earliest hold and which timers' windows
expired. Scanning every pending timer for each would cost a shard with many timers and
nothing due a pass over all of them every round. So beside the timers (by id, in the order
they were set: the order each family's due timers fire in; each in a record with its
sequence number and its times in microseconds, so checking an entry hashes no timer id)
it keeps heaps, with lazy deletion (an entry holds the time it was pushed for, the timer's
sequence number and its record; it is stale once the timer is gone or set to another time,
and dropped when met):

* per time domain, the timers by firing time. A round moves the due ones (firing time at
  or before the domain's bound) into a backlog of heaps per user key; each key with
  something in its backlog fires its earliest (event time first, then by timestamp; every
  timer tied with it), as ``PendingTimers.next_round`` specifies. A round with nothing due
  looks at the tops of the heaps; firing ``k`` timers costs about ``k log n``;
* the timers' output timestamps (holds), whose earliest is the top;
* the timers' windows' expiry, computed at the first expiry check after a timer is set.

A timer set is pushed only when a bounded round or the hold next asks: a batch run's
rounds have no bounds (every timer is due), and pass over the timers once each, as
before the index, with no heap to keep. The heaps are rebuilt once the entries pushed
since they were last built pass twice the three each pending timer may have live (plus
``_SLACK``): then at least half were stale.
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
# Entries pushed beyond twice the live ones' most before the heaps are rebuilt.
_SLACK = 64
# The entries a pending timer may have live: firing time, hold, expiry.
_ENTRIES_PER_TIMER = 3


def _micros(at: Any) -> int | None:
    """A bound (a Timestamp, seconds, or None: no bound) in microseconds."""
    return None if at is None else Timestamp.of(at).micros


def _covers(bound: int | None, earlier: int | None) -> bool:
    """Whether everything due by ``earlier`` is due by ``bound`` (None: +inf)."""
    return bound is None or (earlier is not None and bound >= earlier)


class _Held:
    """One pending timer: its id, the timer, its sequence number, its times (µs)."""

    __slots__ = (
        "timer_id",
        "timer",
        "seq",
        "rank",
        "at",
        "hold",
        "live",
        "pushed_at",
        "pushed_hold",
    )

    def __init__(self, timer_id: TimerId, seq: int, rank: int) -> None:
        self.timer_id = timer_id
        self.seq = seq
        self.rank = rank
        self.timer: Any = None
        self.at = 0
        self.hold: int | None = None
        self.live = True
        # The times of its latest entries in the firing and hold heaps (None: none yet).
        self.pushed_at: int | None = None
        self.pushed_hold: int | None = None

    def __lt__(self, other: _Held) -> bool:
        # Heap entries tie on (time, seq) only as duplicates of one timer's.
        return False


class HeldTimers:
    """The pending timers of a shard by id, in the order set, indexed by when they are due."""

    def __init__(self, ranks: Mapping[TimerFamilyId, int]) -> None:
        # Per family, its domain's rank (``EVENT_RANK`` or later).
        self._ranks = ranks
        self._held: dict[TimerId, _Held] = {}
        self._next_seq = 0
        # Per rank, (firing µs, seq, record); per user key, (rank, firing µs, seq, record) of
        # those found due.
        self._firing: list[list[tuple[int, int, _Held]]] = [[] for _ in range(_RANKS)]
        self._backlog: dict[bytes, list[tuple[int, int, int, _Held]]] = {}
        # The bounds (watermark, processing time) the backlog was found due by.
        self._backlog_bounds: tuple[int | None, int | None] = (None, None)
        self._holds: list[tuple[int, int, _Held]] = []
        # Timers set (or set again) since the heaps were last brought up to date: a batch
        # run, whose rounds have no bounds, never needs them.
        self._unindexed: list[_Held] = []
        # Timers set since the last expiry check; then (expiry, seq, record).
        self._unchecked: list[_Held] = []
        self._expiries: list[tuple[float, int, _Held]] = []
        # Entries pushed since the heaps were last built.
        self._pushed = 0

    def copy(self) -> HeldTimers:
        """The same timers, in the same order, indexed anew."""
        copied = HeldTimers(self._ranks)
        for timer_id, held in self._held.items():
            copied.set(timer_id, held.timer)
        return copied

    def __len__(self) -> int:
        return len(self._held)

    def __bool__(self) -> bool:
        return bool(self._held)

    def __contains__(self, timer_id: object) -> bool:
        return timer_id in self._held

    def __getitem__(self, timer_id: TimerId) -> Any:
        return self._held[timer_id].timer

    def __iter__(self) -> Iterator[TimerId]:
        return iter(self._held)

    def items(self) -> Iterator[tuple[TimerId, Any]]:
        """(id, timer) of each pending timer, in the order they were set."""
        return ((timer_id, held.timer) for timer_id, held in self._held.items())

    def set(self, timer_id: TimerId, timer: Any) -> bool:
        """Sets a timer: a new one goes last in the order; a timer set again keeps its place.

        Returns whether it is new.
        """
        held = self._held.get(timer_id)
        new = held is None
        if held is None:
            rank = self._ranks[(timer_id[0], timer_id[1])]
            held = self._held[timer_id] = _Held(timer_id, self._next_seq, rank)
            self._next_seq += 1
            self._unchecked.append(held)
            self._pushed += 1
        held.timer = timer
        at = timer.fire_timestamp.micros
        hold = None if timer.hold_timestamp is None else timer.hold_timestamp.micros
        if new or held.at != at or held.hold != hold:
            held.at, held.hold = at, hold
            self._unindexed.append(held)
            self._pushed += 1
        if self._pushed > 2 * _ENTRIES_PER_TIMER * len(self._held) + _SLACK:
            self._rebuild()
        return new

    def pop(self, timer_id: TimerId) -> Any:
        """Removes a timer; returns it (None if it was not pending)."""
        held = self._held.pop(timer_id, None)
        if held is None:
            return None
        held.live = False
        return held.timer

    def due(self, watermark: Any = None, processing_time: Any = None) -> list[TimerId]:
        """Each user key's earliest due timers, in the order set; they stay pending.

        Due: event-time timers at or before ``watermark``, the others at or before
        ``processing_time`` (None: every timer of the domain). A key's earliest: its due
        timers of the first domain (event time first), at their earliest firing time.
        """
        bounds = (_micros(watermark), _micros(processing_time))
        if bounds == (None, None):
            return self._all_due()
        self._index()
        if self._backlog and not all(map(_covers, bounds, self._backlog_bounds)):
            self._flush_backlog()
        self._backlog_bounds = bounds
        backlogs = self._backlog
        for rank, heap in enumerate(self._firing):
            bound = bounds[0] if rank == EVENT_RANK else bounds[1]
            while heap and (bound is None or heap[0][0] <= bound):
                at, seq, held = heapq.heappop(heap)
                if held.live and held.at == at:
                    key = held.timer_id[2]
                    backlog = backlogs.get(key)
                    if backlog is None:
                        backlogs[key] = [(rank, at, seq, held)]
                    else:
                        heapq.heappush(backlog, (rank, at, seq, held))
        chosen: list[_Held] = []
        for key in list(backlogs):
            backlog = backlogs[key]
            first: tuple[int, int] | None = None
            while backlog and (first is None or backlog[0][:2] == first):
                rank, at, _, held = heapq.heappop(backlog)
                if held.live and held.at == at:
                    first = (rank, at)
                    chosen.append(held)
            if not backlog:
                del backlogs[key]
        # A timer set to a time, another, then the first again has two entries for it.
        unique = sorted({id(held): held for held in chosen}.values(), key=_seq_of)
        return [held.timer_id for held in unique]

    def _all_due(self) -> list[TimerId]:
        """``due`` without bounds (a batch run's rounds): a pass over every timer."""
        earliest: dict[bytes, tuple[int, int]] = {}
        for held in self._held.values():
            key, order = held.timer_id[2], (held.rank, held.at)
            best = earliest.get(key)
            if best is None or order < best:
                earliest[key] = order
        return [
            timer_id
            for timer_id, held in self._held.items()
            if earliest[timer_id[2]] == (held.rank, held.at)
        ]

    def _index(self) -> None:
        """Pushes the entries of the timers set since the heaps were last brought up to date."""
        for held in self._unindexed:
            if not held.live:
                continue
            if held.pushed_at != held.at:
                heapq.heappush(self._firing[held.rank], (held.at, held.seq, held))
                held.pushed_at = held.at
            if held.hold is not None and held.pushed_hold != held.hold:
                heapq.heappush(self._holds, (held.hold, held.seq, held))
                held.pushed_hold = held.hold
        self._unindexed = []

    def _flush_backlog(self) -> None:
        """Puts the timers found due back among the others (the bounds went back)."""
        for backlog in self._backlog.values():
            for rank, at, seq, held in backlog:
                heapq.heappush(self._firing[rank], (at, seq, held))
        self._backlog.clear()

    def earliest_hold(self) -> Any:
        """The earliest output timestamp of the pending timers (None without one)."""
        self._index()
        holds = self._holds
        while holds:
            at, _, held = holds[0]
            if held.live and held.hold == at:
                return held.timer.hold_timestamp
            heapq.heappop(holds)
        return None

    def expired(
        self, expiry: Callable[[str, tuple[Any, ...]], float], watermark: int
    ) -> list[TimerId]:
        """The timers whose expiry is before ``watermark``; they stay pending.

        ``expiry(transform id, windows)``: the watermark past which a timer is expired
        (``math.inf``: never); it must answer a timer the same every time.
        """
        for held in self._unchecked:
            if held.live:
                at = expiry(held.timer_id[0], held.timer_id[4])
                if at < math.inf:
                    heapq.heappush(self._expiries, (at, held.seq, held))
        self._unchecked = []
        found: list[TimerId] = []
        expiries = self._expiries
        while expiries and expiries[0][0] < watermark:
            held = heapq.heappop(expiries)[2]
            if held.live:
                found.append(held.timer_id)
        return found

    def _rebuild(self) -> None:
        """Indexes the pending timers anew, without stale entries (expiry at the next check)."""
        self._backlog.clear()
        self._firing = [[] for _ in range(_RANKS)]
        self._holds = []
        self._expiries = []
        self._unindexed = []
        self._unchecked = list(self._held.values())
        for held in self._unchecked:
            self._firing[held.rank].append((held.at, held.seq, held))
            held.pushed_at, held.pushed_hold = held.at, held.hold
            if held.hold is not None:
                self._holds.append((held.hold, held.seq, held))
        for heap in (*self._firing, self._holds):
            heapq.heapify(heap)
        self._pushed = _ENTRIES_PER_TIMER * len(self._held)


def _seq_of(held: _Held) -> int:
    return held.seq
