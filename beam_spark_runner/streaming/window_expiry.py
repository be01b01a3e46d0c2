"""A stateful DoFn's windows expiring: their user state and pending timers dropped.

Beam's runners garbage-collect a window's state once the input watermark passes the end of
the window plus the allowed lateness (Java's ``StatefulDoFnRunner`` arms a cleanup timer
there); the user's timers due by then fire first. A stateful shard (``stateful``) drops
expired timers (:meth:`WindowExpiry.forget_expired_timers`) and cells
(:meth:`WindowExpiry.scan`) after its timer rounds, so every timer the watermark made due
has fired. Expiry is Beam's test for late data (``window.end + allowed_lateness`` before the
input watermark), the one the GroupByKey shards use; at +inf every window has expired.
An element arriving in a window already expired is dropped (:meth:`WindowExpiry.on_time`),
as Beam's ``StatefulDoFnRunner`` drops it: its window's state is gone.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Iterable
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.state import USER_STATE_TYPES
from beam_spark_runner.execution.timers import PendingTimers
from beam_spark_runner.streaming.watermarks import MAX_MICROS

_LOGGER = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Windowing:
    """How one stateful ParDo's windows are encoded in its state keys, and how late they may be."""

    window_coder: Any
    lateness_micros: int


class WindowExpiry:
    """When the windows of each stateful ParDo of a stage expire."""

    def __init__(self, descriptor: Any, input_transform_id: str) -> None:
        context = bi.PipelineContext(descriptor)
        (stage_input,) = descriptor.transforms[input_transform_id].outputs.values()
        self._windowing: dict[str, _Windowing] = {}
        # The stateful ParDo reading the stage's input, and the input's coder, where its
        # windows can expire before +inf.
        self._input: tuple[str, Any] | None = None
        for transform_id, transform, payload in bi.par_do_payloads(descriptor.transforms):
            if not (payload.state_specs or payload.timer_family_specs):
                continue
            others = {*payload.side_inputs, *payload.timer_family_specs}
            (main,) = [pc for tag, pc in transform.inputs.items() if tag not in others]
            strategy_id = descriptor.pcollections[main].windowing_strategy_id
            strategy = descriptor.windowing_strategies[strategy_id]
            self._windowing[transform_id] = _Windowing(
                context.coders[strategy.window_coder_id].get_impl(),
                strategy.allowed_lateness * 1000,
            )
            global_windows = (
                descriptor.coders[strategy.window_coder_id].spec.urn == bi.GLOBAL_WINDOW_CODER_URN
            )
            if main == stage_input and not global_windows:
                port = bi.remote_grpc_port(descriptor.transforms[input_transform_id].spec.payload)
                self._input = (transform_id, context.coders[port.coder_id].get_impl())

    def on_time(self, data: bytes, watermark: int) -> bytes:
        """The stage's input ``data`` without its elements' windows expired at ``watermark``."""
        if self._input is None or not data:
            return data
        transform_id, coder = self._input
        stream = bi.create_InputStream(data)
        kept: list[bytes] = []
        changed = False
        while stream.size():
            start = len(data) - stream.size()
            value = coder.decode_from_stream(stream, True)
            windows = [
                w
                for w in value.windows
                if not hasattr(w, "end") or self.expires(transform_id, w) >= watermark
            ]
            if len(windows) == len(value.windows):
                kept.append(data[start : len(data) - stream.size()])
                continue
            changed = True
            if windows:
                out = bi.create_OutputStream()
                late = bi.WindowedValue(
                    value.value, value.timestamp, tuple(windows), value.pane_info
                )
                coder.encode_to_stream(late, out, True)
                kept.append(out.get())
        if changed:
            _LOGGER.debug("Dropped the expired windows of late elements of %s", transform_id)
        return b"".join(kept) if changed else data

    def expires(self, transform_id: str, window: Any) -> int:
        """The watermark (microseconds) past which ``window`` of ``transform_id`` is expired.

        Capped below +inf, so the end of the input expires every window.
        """
        lateness = self._windowing[transform_id].lateness_micros
        return int(min(window.end.micros + lateness, MAX_MICROS - 1))

    def scan(self, keys: Iterable[bytes], watermark: int) -> tuple[set[bytes], int]:
        """The keys among ``keys`` expired at ``watermark``; when the next of the others will.

        The second is the earliest watermark past which one of the others expires
        (``MAX_MICROS`` for none).
        """
        expires: dict[tuple[str, bytes], int] = {}
        expired: set[bytes] = set()
        earliest = MAX_MICROS
        for key in keys:
            state_key = bi.beam_fn_api_pb2.StateKey.FromString(key)
            kind = state_key.WhichOneof("type")
            if kind not in USER_STATE_TYPES:
                continue
            cell = getattr(state_key, kind)
            windowing = self._windowing.get(cell.transform_id)
            if windowing is None:
                continue
            at = expires.get((cell.transform_id, cell.window))
            if at is None:
                window = windowing.window_coder.decode(cell.window)
                at = expires[(cell.transform_id, cell.window)] = self.expires(
                    cell.transform_id, window
                )
            if at < watermark:
                expired.add(key)
            elif at < earliest:
                earliest = at
        return expired, earliest

    def forget_expired_timers(self, pending: PendingTimers, watermark: int) -> int:
        """Drops the pending timers whose windows are all expired; how many were."""
        return pending.forget_expired(self._timer_expiry, watermark)

    def _timer_expiry(self, transform_id: str, windows: tuple[Any, ...]) -> float:
        """The watermark past which a timer's windows are all expired (inf: never)."""
        if transform_id not in self._windowing:
            return math.inf
        return max((self.expires(transform_id, w) for w in windows), default=-math.inf)


@functools.lru_cache(maxsize=64)
def window_expiry(descriptor: bytes, input_transform_id: str) -> WindowExpiry:
    """The ``WindowExpiry`` of a serialized process bundle descriptor (made once per process)."""
    proto = bi.beam_fn_api_pb2.ProcessBundleDescriptor.FromString(descriptor)
    return WindowExpiry(proto, input_transform_id)
