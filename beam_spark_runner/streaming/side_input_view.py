"""A shard's side inputs as its bundles read them, kept across micro-batches, changed in place.

A stage with streamed side inputs serves its bundles the side-input elements its shard's
state holds (``side_input_state``), grouped by window and (multimap) key under the state keys
the SDK asks for. Built whole that costs every element held, in every batch that runs a
bundle. ``SideInputView`` is built once per decoded state (a worker's first batch of the
shard, a read-back from the store) and kept with it in the worker's cache (``state_cache``);
the state then tells it each chunk it adds or forgets and each firing it sets or drops, in a
batch or in a replay of another worker's batches, so a batch costs what changed.

It serves what Beam's ``WindowGroupingBuffer`` (FnApiRunner's grouping, which the runner used
before) gives over ``SideInputShardState.side_elements``: per window and key, the values of
the chunks in order, then the latest firing's; a window's keys (and an iterable's values) in
the order they first appear in that sequence. Keys are grouped by their encoding (Beam's
buffer groups decoded keys: the same for a deterministic key coder, which a multimap's
lookups by encoded key need anyway).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

from beam_spark_runner import beam_internals as bi

# A group of values: (encoded window, encoded key; b"" for an iterable side input).
_Group = tuple[bytes, bytes]
# A chunk's value in a group: (chunk's number, position in the chunk, encoded value).
_Value = tuple[int, int, bytes]


@dataclasses.dataclass
class ViewStats:
    """How views were made (for tests and the benchmark's log)."""

    built: int = 0
    # Built again because the one kept no longer followed its state (a bookkeeping miss).
    diverged: int = 0
    # Window listings made (keys, keys with values): each costs the window's keys.
    listed: int = 0


STATS = ViewStats()


class _SideView:
    """One side input's elements grouped by window and key, as the SDK reads them."""

    def __init__(self, access_pattern_urn: str, coder: Any) -> None:
        self.multimap = access_pattern_urn == bi.common_urns.side_inputs.MULTIMAP.urn
        self.impl = coder.get_impl()
        self.window_impl = coder.window_coder.get_impl()
        wrapped = coder.wrapped_value_coder
        self.key_impl = wrapped.key_coder().get_impl() if self.multimap else None
        self.value_impl = (wrapped.value_coder() if self.multimap else wrapped).get_impl()
        # Mirrors the state's chunks: (latest window end, number, groups its values went to).
        self.chunks: list[tuple[int, int, tuple[_Group, ...]]] = []
        self._numbered = 0
        # window -> key -> the chunks' values, in order.
        self.plain: dict[bytes, dict[bytes, list[_Value]]] = {}
        # Mirrors the state's firings (slot -> its group), in their order.
        self.slots: dict[bytes, _Group] = {}
        # window -> key -> (count, encoded values) of its latest firing.
        self.fired: dict[bytes, dict[bytes, tuple[int, bytes]]] = {}
        # window -> (keys, keys with values) served: made at a request, until the window changes.
        self._listings: dict[bytes, tuple[bytes, bytes]] = {}

    def _decoded(self, data: bytes) -> Iterable[tuple[Any, bytes, bytes]]:
        """Each element's windows, encoded key and encoded value."""
        stream = bi.create_InputStream(data)
        while stream.size() > 0:
            element = self.impl.decode_from_stream(stream, True)
            if self.key_impl is None:
                key, value = b"", element.value
            else:
                key = self.key_impl.encode_nested(element.value[0])
                value = element.value[1]
            yield element.windows, key, self.value_impl.encode_nested(value)

    def add_chunk(self, end: int, chunk: bytes) -> None:
        number = self._numbered
        self._numbered += 1
        groups: dict[_Group, None] = {}
        position = 0
        for windows, key, value in self._decoded(chunk):
            for window in windows:
                encoded = self.window_impl.encode(window)
                self.plain.setdefault(encoded, {}).setdefault(key, []).append(
                    (number, position, value)
                )
                position += 1
                groups[(encoded, key)] = None
        self.chunks.append((end, number, tuple(groups)))
        for window, _ in groups:
            self._listings.pop(window, None)

    def forget(self, horizon: int) -> None:
        """Drops the chunks whose windows end before ``horizon``, as the state does."""
        if not self.chunks or min(chunk[0] for chunk in self.chunks) >= horizon:
            return
        kept = []
        for chunk in self.chunks:
            if chunk[0] >= horizon:
                kept.append(chunk)
                continue
            for window, key in chunk[2]:
                keys = self.plain[window]
                values = [value for value in keys[key] if value[0] != chunk[1]]
                if values:
                    keys[key] = values
                else:
                    del keys[key]
                    if not keys:
                        del self.plain[window]
                self._listings.pop(window, None)
        self.chunks = kept

    def set_fired(self, slot: bytes, elements: Sequence[bytes] | None) -> None:
        """The firing in ``slot`` is now ``elements`` (encoded; None: it was dropped)."""
        group = self.slots.get(slot)
        if elements is None:
            if group is None:
                return
            del self.slots[slot]
            window, key = group
            keys = self.fired[window]
            del keys[key]
            if not keys:
                del self.fired[window]
            self._listings.pop(window, None)
            return
        decoded = list(self._decoded(b"".join(elements)))
        if group is None:
            windows, key, _ = decoded[0]
            group = self.slots[slot] = (self.window_impl.encode(windows[0]), key)
        window, key = group
        values = b"".join(value for _, _, value in decoded)
        self.fired.setdefault(window, {})[key] = (len(decoded), values)
        self._listings.pop(window, None)

    def values(self, window: bytes, key: bytes) -> bytes:
        """A key's values in a window (an iterable's: the window's), encoded, concatenated."""
        plain = self.plain.get(window, {}).get(key, ())
        fired = self.fired.get(window, {}).get(key)
        return b"".join([*(value[2] for value in plain), fired[1] if fired else b""])

    def listing(self, window: bytes) -> tuple[bytes, bytes]:
        """A window's keys, and its keys each with its count and values, encoded."""
        listed = self._listings.get(window)
        if listed is None:
            STATS.listed += 1
            plain = self.plain.get(window, {})
            fired = self.fired.get(window, {})
            # Where a key first appears: in the chunks in order, then in the firings.
            keys = sorted(plain, key=lambda k: plain[k][0][:2])
            keys.extend(k for k in fired if k not in plain)
            with_values = []
            for key in keys:
                count = len(plain.get(key, ())) + fired.get(key, (0, b""))[0]
                count_bytes = count.to_bytes(4, "big", signed=True)
                with_values.append(key + count_bytes + self.values(window, key))
            listed = self._listings[window] = (b"".join(keys), b"".join(with_values))
        return listed


class SideInputView:
    """A shard's side inputs served to the SDK's state requests (a ``StateServicer``'s part).

    The state it follows (``SideInputShardState.follow``) tells it its changes; ``token``
    names its contents: a new one after each change, so the SDK's cache of side inputs
    decoded by token never serves a stale one.
    """

    def __init__(self, stage: str, sides: Sequence[tuple[str, str, str, Any]]) -> None:
        """``sides``: per side input, its consuming transform, tag, access pattern and coder."""
        self.stage = stage
        self.sides = [_SideView(urn, coder) for _, _, urn, coder in sides]
        self._numbers = {(t, tag): n for n, (t, tag, _, _) in enumerate(sides)}
        self._access = [urn for _, _, urn, _ in sides]
        self._id = os.urandom(8).hex()
        self._version = 0

    @property
    def token(self) -> str:
        return f"{self._id}/{self._version}"

    def built_from(
        self,
        sides: Sequence[Sequence[bytes]],
        ends: Sequence[Sequence[int]],
        fired: Sequence[dict[bytes, list[Any]]],
    ) -> SideInputView:
        """Takes what a state holds: per side input its chunks, their ends, its firings."""
        STATS.built += 1
        for number, side in enumerate(self.sides):
            for end, chunk in zip(ends[number], sides[number], strict=True):
                side.add_chunk(end, chunk)
            if number < len(fired):
                for slot, entry in fired[number].items():
                    side.set_fired(slot, entry[2])
        return self

    def follows(self, sides: Sequence[Sequence[bytes]], fired: Sequence[dict[bytes, Any]]) -> bool:
        """Whether it holds as many chunks and firings as the state (a cheap check)."""
        return all(
            len(view.chunks) == len(sides[n])
            and len(view.slots) == len(fired[n] if n < len(fired) else ())
            for n, view in enumerate(self.sides)
        )

    def add_chunk(self, number: int, end: int, chunk: bytes) -> None:
        self.sides[number].add_chunk(end, chunk)
        self._version += 1

    def forget(self, number: int, horizon: int) -> None:
        self.sides[number].forget(horizon)
        self._version += 1

    def set_fired(self, number: int, slot: bytes, elements: Sequence[bytes] | None) -> None:
        self.sides[number].set_fired(slot, elements)
        self._version += 1

    def get_raw(
        self, state_key: Any, continuation_token: bytes | None = None
    ) -> tuple[bytes, None]:
        """What Beam's ``StateServicer`` would hold under ``state_key`` (no continuation)."""
        kind = state_key.WhichOneof("type")
        if kind not in _SERVED:
            raise NotImplementedError(f"Unknown side-input state type: {kind}")
        key = getattr(state_key, kind)
        number = self._numbers.get((key.transform_id, key.side_input_id))
        if number is None or self._access[number] != _SERVED[kind]:
            return b"", None
        side = self.sides[number]
        if kind == "iterable_side_input":
            return side.values(key.window, b""), None
        if kind == "multimap_side_input":
            return side.values(key.window, key.key), None
        keys, with_values = side.listing(key.window)
        return (keys if kind == "multimap_keys_side_input" else with_values), None

    def append_raw(self, state_key: Any, data: bytes) -> Any:
        raise NotImplementedError("side inputs are read-only")

    def clear(self, state_key: Any) -> Any:
        raise NotImplementedError("side inputs are read-only")


# The state types a view serves, each with the access pattern it belongs to.
_SERVED = {
    "iterable_side_input": bi.common_urns.side_inputs.ITERABLE.urn,
    "multimap_side_input": bi.common_urns.side_inputs.MULTIMAP.urn,
    "multimap_keys_side_input": bi.common_urns.side_inputs.MULTIMAP.urn,
    "multimap_keys_values_side_input": bi.common_urns.side_inputs.MULTIMAP.urn,
}
