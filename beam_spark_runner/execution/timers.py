"""Timers of a stateful stage in batch: collected from bundles, fired in timestamp order.

A bundle writes the timers its DoFn sets (or clears) to one output stream per timer family,
encoded with the family's timer coder. :class:`PendingTimers` keeps the latest setting per
(transform, family, user key, dynamic tag, windows), exactly as FnApiRunner does: a later
setting replaces an earlier one and a clear removes it. It also notes which timers were set,
cleared or fired since it was made (``changes``): a streaming shard keeps its pending timers
between micro-batches (``timer_index.HeldTimers``, indexed by when they are due, so a round
with nothing due does not pass over every pending timer) and logs only those.

Batch semantics: once a key's input is complete the input watermark moves from -inf to
+inf, so every event-time timer is due, and processing time may also advance to +inf. Each
*round* fires, for every key, its earliest pending timers -- event time before processing
time, lowest timestamp first -- in one bundle for all keys. Timers that callbacks set go
back into the pending set, and rounds go on until none remain. A key therefore sees its
timers in timestamp order, including timers set by other timers' callbacks.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.timer_index import EVENT_RANK, HeldTimers, TimerFamilyId, TimerId

_EVENT_TIME = bi.beam_runner_api_pb2.TimeDomain.EVENT_TIME
_PROCESSING_TIME = bi.beam_runner_api_pb2.TimeDomain.PROCESSING_TIME
# Firing order between time domains within one key: event time first (the only domain due
# at the watermark), then processing time, then any other.
_DOMAIN_RANK: dict[Any, int] = {_EVENT_TIME: EVENT_RANK, _PROCESSING_TIME: 1}
_OTHER_RANK = 2


@dataclasses.dataclass(frozen=True)
class TimerFamily:
    """One timer family of a stateful ParDo and the coders its timers use."""

    transform_id: str
    family_id: str
    time_domain: int
    timer_coder_impl: Any
    key_coder_impl: Any

    @property
    def family_key(self) -> TimerFamilyId:
        """(transform id, timer family id), as the data plane names the family."""
        return (self.transform_id, self.family_id)


def timer_families(descriptor: Any) -> dict[TimerFamilyId, TimerFamily]:
    """Every timer family of the ParDos in a process bundle descriptor."""
    context = bi.PipelineContext(descriptor)
    families: dict[TimerFamilyId, TimerFamily] = {}
    for transform_id, _, payload in bi.par_do_payloads(descriptor.transforms):
        for family_id, spec in payload.timer_family_specs.items():
            coder_proto = descriptor.coders[spec.timer_family_coder_id]
            key_coder = context.coders[coder_proto.component_coder_ids[0]]
            families[(transform_id, family_id)] = TimerFamily(
                transform_id=transform_id,
                family_id=family_id,
                time_domain=spec.time_domain,
                timer_coder_impl=context.coders[spec.timer_family_coder_id].get_impl(),
                key_coder_impl=key_coder.get_impl(),
            )
    return families


class PendingTimers:
    """The timers set and not yet fired, for the keys of one key group.

    ``pending``, where given, is the timers it holds (not a copy: a streaming shard keeps
    them in its state between micro-batches).
    """

    def __init__(
        self, families: dict[TimerFamilyId, TimerFamily], pending: HeldTimers | None = None
    ) -> None:
        self._families = families
        if pending is None:
            ranks = {
                key: _DOMAIN_RANK.get(family.time_domain, _OTHER_RANK)
                for key, family in families.items()
            }
            pending = HeldTimers(ranks)
        self._pending = pending
        # Since it was made: the timers set, in the order of their last entry into
        # ``_pending``; and those removed (cleared, fired, forgotten), as they were.
        self._set: dict[TimerId, None] = {}
        self._removed: dict[TimerId, Any] = {}
        self.fired = 0

    @property
    def held(self) -> HeldTimers:
        """The pending timers by id (themselves, not a copy)."""
        return self._pending

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __len__(self) -> int:
        return len(self._pending)

    def add_written(self, family_key: TimerFamilyId, data: bytes) -> None:
        """Takes the timers a bundle wrote for one family: sets replace, clears remove."""
        family = self._families[family_key]
        for timer in family.timer_coder_impl.decode_all(data):
            timer_id: TimerId = (
                family.transform_id,
                family.family_id,
                family.key_coder_impl.encode_nested(timer.user_key),
                timer.dynamic_timer_tag,
                tuple(timer.windows),
            )
            if timer.clear_bit:
                gone = self._pending.pop(timer_id)
                if gone is not None:
                    self._removed[timer_id] = gone
            else:
                if self._pending.set(timer_id, timer):
                    # New among the pending: last in the order ``changes`` writes too.
                    self._set.pop(timer_id, None)
                self._set[timer_id] = None

    def next_round(
        self, watermark: Any = None, processing_time: Any = None
    ) -> dict[TimerFamilyId, bytes]:
        """Removes and encodes each key's earliest pending timers, grouped by family.

        With ``watermark`` (and ``processing_time``), only the timers due by then count:
        event-time timers at or before the watermark, processing-time ones at or before the
        processing time (a streaming run); without, every timer is due (batch). A key's
        earliest: event time before processing time, then the lowest firing timestamp
        (every timer tied with it). Each family's in the order they were set.
        """
        return self._encode(self._pending.due(watermark, processing_time))

    def _encode(self, due: Iterable[TimerId]) -> dict[TimerFamilyId, bytes]:
        """Removes the ``due`` timers; encodes them per family, the families in order."""
        streams: dict[TimerFamilyId, Any] = {}
        for timer_id in due:
            family_key = (timer_id[0], timer_id[1])
            stream = streams.get(family_key)
            if stream is None:
                stream = streams[family_key] = bi.create_OutputStream()
            timer = self._removed[timer_id] = self._pending.pop(timer_id)
            self._families[family_key].timer_coder_impl.encode_to_stream(timer, stream, True)
            self.fired += 1
        return {family_key: streams[family_key].get() for family_key in sorted(streams)}

    def encoded(self) -> dict[TimerFamilyId, bytes]:
        """Every pending timer, encoded per family (``add_written`` restores them)."""
        return self._streams(self._pending.items())

    def changes(self) -> dict[TimerFamilyId, bytes]:
        """The timers set, cleared or fired since it was made, encoded per family.

        Those removed written cleared, then those set and still pending, in their order:
        ``add_written`` of them on the pending timers as they were then gives the pending
        timers now, each family's in the same order.
        """
        pending = self._pending
        cleared = ((timer_id, _cleared(timer)) for timer_id, timer in self._removed.items())
        kept = ((timer_id, pending[timer_id]) for timer_id in self._set if timer_id in pending)
        return self._streams(itertools.chain(cleared, kept))

    def _streams(self, timers: Iterable[tuple[TimerId, Any]]) -> dict[TimerFamilyId, bytes]:
        streams: dict[TimerFamilyId, Any] = {}
        for timer_id, timer in timers:
            family_key = (timer_id[0], timer_id[1])
            stream = streams.get(family_key)
            if stream is None:
                stream = streams[family_key] = bi.create_OutputStream()
            self._families[family_key].timer_coder_impl.encode_to_stream(timer, stream, True)
        return {family_key: stream.get() for family_key, stream in streams.items()}

    def forget_expired(
        self, expiry: Callable[[str, tuple[Any, ...]], float], watermark: int
    ) -> int:
        """Drops the pending timers expired at ``watermark``; how many.

        ``expiry(transform id, windows)``: the watermark past which a timer is expired
        (``math.inf``: never); it must answer a timer the same every time.
        """
        gone = self._pending.expired(expiry, watermark)
        for timer_id in gone:
            self._removed[timer_id] = self._pending.pop(timer_id)
        return len(gone)

    def earliest_hold(self) -> Any:
        """The earliest output timestamp of the pending timers (their watermark hold)."""
        return self._pending.earliest_hold()


def _cleared(timer: Any) -> Any:
    """The clearing of ``timer`` (its key, tag and windows; the timer coder writes no more)."""
    return timer._replace(clear_bit=True, fire_timestamp=None, hold_timestamp=None, paneinfo=None)
