"""Timers of a stateful stage in batch: collected from bundles, fired in timestamp order.

A bundle writes the timers its DoFn sets (or clears) to one output stream per timer family,
encoded with the family's timer coder. :class:`PendingTimers` keeps the latest setting per
(transform, family, user key, dynamic tag, windows), exactly as FnApiRunner does: a later
setting replaces an earlier one and a clear removes it.

Batch semantics: once a key's input is complete the input watermark moves from -inf to
+inf, so every event-time timer is due, and processing time may also advance to +inf. Each
*round* fires, for every key, its earliest pending timers -- event time before processing
time, lowest timestamp first -- in one bundle for all keys. Timers that callbacks set go
back into the pending set, and rounds go on until none remain. A key therefore sees its
timers in timestamp order, including timers set by other timers' callbacks.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from beam_spark_runner import beam_internals as bi

TimerFamilyId = tuple[str, str]
_EVENT_TIME = bi.beam_runner_api_pb2.TimeDomain.EVENT_TIME
_PROCESSING_TIME = bi.beam_runner_api_pb2.TimeDomain.PROCESSING_TIME
# Firing order between time domains within one key: event time first.
_DOMAIN_RANK: dict[Any, int] = {_EVENT_TIME: 0, _PROCESSING_TIME: 1}


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


# (transform id, family id, encoded user key, dynamic timer tag, windows)
_TimerId = tuple[str, str, bytes, str, tuple[Any, ...]]


class PendingTimers:
    """The timers set and not yet fired, for the keys of one key group."""

    def __init__(self, families: dict[TimerFamilyId, TimerFamily]) -> None:
        self._families = families
        self._pending: dict[_TimerId, Any] = {}
        self.fired = 0

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __len__(self) -> int:
        return len(self._pending)

    def add_written(self, family_key: TimerFamilyId, data: bytes) -> None:
        """Takes the timers a bundle wrote for one family: sets replace, clears remove."""
        family = self._families[family_key]
        for timer in family.timer_coder_impl.decode_all(data):
            timer_id: _TimerId = (
                family.transform_id,
                family.family_id,
                family.key_coder_impl.encode_nested(timer.user_key),
                timer.dynamic_timer_tag,
                tuple(timer.windows),
            )
            if timer.clear_bit:
                self._pending.pop(timer_id, None)
            else:
                self._pending[timer_id] = timer

    def _order(self, timer_id: _TimerId) -> tuple[int, Any]:
        family = self._families[(timer_id[0], timer_id[1])]
        return (_DOMAIN_RANK.get(family.time_domain, 2), self._pending[timer_id].fire_timestamp)

    def _due(self, timer_id: _TimerId, watermark: Any, processing_time: Any) -> bool:
        domain = self._families[(timer_id[0], timer_id[1])].time_domain
        bound = watermark if domain == _EVENT_TIME else processing_time
        return bound is None or self._pending[timer_id].fire_timestamp <= bound

    def next_round(
        self, watermark: Any = None, processing_time: Any = None
    ) -> dict[TimerFamilyId, bytes]:
        """Removes and encodes each key's earliest pending timers, grouped by family.

        With ``watermark`` (and ``processing_time``), only the timers due by then count:
        event-time timers at or before the watermark, processing-time ones at or before the
        processing time (a streaming run); without, every timer is due (batch).
        """
        by_key: dict[bytes, list[_TimerId]] = collections.defaultdict(list)
        for timer_id in self._pending:
            if self._due(timer_id, watermark, processing_time):
                by_key[timer_id[2]].append(timer_id)
        due: list[_TimerId] = []
        for timer_ids in by_key.values():
            earliest = min(self._order(t) for t in timer_ids)
            due.extend(t for t in timer_ids if self._order(t) == earliest)
        return self._encode(due)

    def _encode(self, due: Iterable[_TimerId]) -> dict[TimerFamilyId, bytes]:
        streams: dict[TimerFamilyId, Any] = {}
        for timer_id in due:
            family_key = (timer_id[0], timer_id[1])
            stream = streams.get(family_key)
            if stream is None:
                stream = streams[family_key] = bi.create_OutputStream()
            timer = self._pending.pop(timer_id)
            self._families[family_key].timer_coder_impl.encode_to_stream(timer, stream, True)
            self.fired += 1
        return {family_key: stream.get() for family_key, stream in streams.items()}

    def encoded(self) -> dict[TimerFamilyId, bytes]:
        """Every pending timer, encoded per family (``add_written`` restores them)."""
        streams: dict[TimerFamilyId, Any] = {}
        for timer_id, timer in self._pending.items():
            family_key = (timer_id[0], timer_id[1])
            stream = streams.get(family_key)
            if stream is None:
                stream = streams[family_key] = bi.create_OutputStream()
            self._families[family_key].timer_coder_impl.encode_to_stream(timer, stream, True)
        return {family_key: stream.get() for family_key, stream in streams.items()}

    def forget(self, done: Callable[[str, tuple[Any, ...]], bool]) -> int:
        """Drops the pending timers ``done`` says are (by transform id and windows); how many."""
        gone = [timer_id for timer_id in self._pending if done(timer_id[0], timer_id[4])]
        for timer_id in gone:
            del self._pending[timer_id]
        return len(gone)

    def earliest_hold(self) -> Any:
        """The earliest output timestamp of the pending timers (their watermark hold)."""
        holds = [t.hold_timestamp for t in self._pending.values() if t.hold_timestamp is not None]
        return min(holds, default=None)
