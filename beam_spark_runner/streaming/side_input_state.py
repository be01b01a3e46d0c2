"""What a shard of a stage with streamed side inputs keeps, and what a micro-batch changed in it.

``SideInputShardState`` holds each side input's elements (chunks, each with its latest
window end; in the global window, the latest trigger firing per window and key) and, per
needs (what main elements wait for: ``side_inputs._Coders.needs``), a bucket: the count of
its chunks waiting in the ``WaitingStore`` (the level's list state) and their earliest
timestamp. Its methods note what they change in a journal (``SideInputChanges``): the side
chunks added and the horizons side windows were forgotten before, the firings and buckets
touched. ``changes`` gives them, ``replay`` applies them to the state as it was before the
batch: a shard on ``state_cache``'s change log writes what the batch changed, not every
side element it holds.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import operator
import pickle
import struct
from typing import Any, Protocol, TypeVar

from apache_beam.transforms.window import GlobalWindow

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import pickled_runs
from beam_spark_runner.streaming.chunk_lists import ListStateChunks
from beam_spark_runner.streaming.side_input_view import SideInputView
from beam_spark_runner.streaming.watermarks import MAX_MICROS, WatermarkState

Needs = tuple[int, ...]


class WaitingStore(Protocol):
    """Where a shard's waiting main elements are kept between micro-batches."""

    def append(self, chunks: list[tuple[Needs, bytes]]) -> None:
        """Adds chunks of encoded main elements, each with what it waits for."""

    def take(self, needs: set[Needs]) -> dict[Needs, list[bytes]]:
        """Removes the chunks waiting for any of ``needs``; returns them, in order."""


class ListStateWaitingStore:
    """A ``WaitingStore`` in a ``transformWithState`` list state: needs packed as the tag."""

    def __init__(self, list_state: Any) -> None:
        self._chunks = ListStateChunks(list_state)

    def append(self, chunks: list[tuple[Needs, bytes]]) -> None:
        self._chunks.append([(_packed_needs(n), chunk) for n, chunk in chunks])

    def take(self, needs: set[Needs]) -> dict[Needs, list[bytes]]:
        packed_needs = {_packed_needs(n): n for n in needs}
        taken = self._chunks.take(set(packed_needs))
        return {packed_needs[tag]: chunks for tag, chunks in taken.items()}


def _packed_needs(needs: Needs) -> bytes:
    return struct.pack(f"<{len(needs)}q", *needs)


class SideImpls(Protocol):
    """Per side input, its windowed-value, window and (multimap) key coders' impls."""

    side_impls: list[tuple[Any, Any, Any]]


# The end of the global window: the one window a side input's firings replace each other in.
GLOBAL_END = GlobalWindow().max_timestamp().micros

# A side input's window (and, for a multimap, key) -> [pane index, window end, elements]:
# the elements of the latest trigger firing seen, encoded.
Fired = dict[bytes, list[Any]]


@dataclasses.dataclass
class SideInputChanges:
    """What a micro-batch changed in a ``SideInputShardState`` (never stored with it)."""

    # In order: ("add", side input, [(window end, chunk)]) and ("forget", horizons).
    chunks: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    # (side input, slot) of the firings set or dropped, and the needs of the buckets made,
    # changed or released, in the order first touched: replayed in that order, new ones
    # take the places in their dictionaries they took in the batch.
    fired: dict[tuple[int, bytes], None] = dataclasses.field(default_factory=dict)
    buckets: dict[Needs, None] = dataclasses.field(default_factory=dict)


_State = TypeVar("_State", bound="SideInputShardState")


@dataclasses.dataclass
class SideInputShardState:
    """One shard's side-input elements and what its waiting main elements wait for.

    Waiting main elements are kept by their needs (``_Coders.needs``: elements of the same
    windows wait for the same thing). Per needs, a bucket holds the elements that came in
    this micro-batch (their encodings concatenated), their earliest timestamp
    (microseconds) and how many chunks of earlier batches wait in the ``WaitingStore``: a
    micro-batch checks a bucket, not an element, and the state value holds no element.
    """

    watermarks: WatermarkState
    # Per side input, chunks of its elements (encodings concatenated).
    sides: list[list[bytes]]
    # needs -> [new encoded elements, earliest timestamp, chunks in the waiting store]
    buckets: dict[Needs, list[Any]] = dataclasses.field(default_factory=dict)
    # A checkpoint written before buckets: (encoded element, timestamp[, needs]) each.
    waiting: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    # Per side input, its elements that came from trigger firings: the latest per window.
    fired: list[Fired] = dataclasses.field(default_factory=list)
    # Per side input, each chunk's latest window end (max timestamp, µs): when it may go.
    ends: list[list[int]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.ends) < len(self.sides):
            self.ends = [[MAX_MICROS] * len(chunks) for chunks in self.sides]
        if len(self.fired) < len(self.sides):
            self.fired = [{} for _ in self.sides]

    def __getstate__(self) -> dict[str, Any]:
        """What is pickled: the state without its journal."""
        stored = dict(self.__dict__)
        stored.pop("_journal", None)
        stored.pop("_view", None)
        stored.pop("_held_ends", None)
        return stored

    def encode(self) -> bytes:
        """One state-store value."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def decode(cls: type[_State], data: bytes) -> _State:
        """The state ``encode`` wrote (or an earlier runner version did), of this class.

        Buckets written before the waiting store hold their elements themselves (and no
        count): they move to the store at the end of the batch. Chunks written before their
        window ends were kept are kept for good.
        """
        state = pickle.loads(data)
        assert isinstance(state, cls), f"expected a {cls.__name__}, found {type(state).__name__}"
        state.__dict__.setdefault("buckets", {})
        if not state.__dict__.get("ends"):
            state.ends = [[MAX_MICROS] * len(chunks) for chunks in state.sides]
        if not state.__dict__.get("fired"):
            state.fired = [{} for _ in state.sides]
        for bucket in state.buckets.values():
            if len(bucket) == 2:
                bucket.append(0)
        return state

    @property
    def journal(self) -> SideInputChanges:
        """What changed since ``begin_batch``."""
        journal: SideInputChanges | None = self.__dict__.get("_journal")
        if journal is None:
            journal = self.__dict__["_journal"] = SideInputChanges()
        return journal

    @property
    def view(self) -> SideInputView | None:
        """The side inputs as served, following this state's changes (``follow``), if any."""
        return self.__dict__.get("_view")

    def follow(self, view: SideInputView | None) -> None:
        """From now on tells ``view`` (built from this state as it is) what changes."""
        self.__dict__["_view"] = view

    def sides_replaced(self) -> None:
        """Its side inputs and firings were replaced whole: what follows them is made anew."""
        self.__dict__.pop("_view", None)
        self.__dict__.pop("_held_ends", None)

    def _ends_held(self) -> list[collections.Counter[int]]:
        """Per side input, its firings per window end: made once, kept with the state.

        Not stored: a batch asks which windows had a firing (``fired_ends``) and whether
        some end before a horizon (``forget``), and a side input holds a firing per key.
        """
        held: list[collections.Counter[int]] | None = self.__dict__.get("_held_ends")
        if held is None or len(held) != len(self.fired):
            held = [collections.Counter(entry[1] for entry in f.values()) for f in self.fired]
            self.__dict__["_held_ends"] = held
        return held

    def _count_end(self, number: int, end: int, change: int) -> None:
        """A firing of a window ending at ``end`` came (1) or went (-1)."""
        held = self.__dict__.get("_held_ends")
        if held is None or len(held) != len(self.fired):
            return
        held[number][end] += change
        if not held[number][end]:
            del held[number][end]

    def begin_batch(self) -> None:
        """Starts noting a micro-batch's changes afresh."""
        self.__dict__["_journal"] = SideInputChanges()

    def add_side(self, number: int, elements: bytes, coders: SideImpls) -> None:
        """Side input ``number``'s new elements (encoded, concatenated).

        In the global window, elements of a trigger firing (a pane with a timing) replace
        those of an earlier firing (of their key); the others add to what the side input
        holds, as do every firing's elements in a window that ends.
        """
        if len(self.fired) < len(self.sides):
            self.fired = [{} for _ in self.sides]
        impl, window_impl, key_impl = coders.side_impls[number]
        stream = bi.create_InputStream(elements)
        size = len(elements)
        # (latest window end, encoded element) of each element that adds up, in order.
        plain: list[tuple[int, bytes]] = []
        fired = self.fired[number]
        touched = self.journal.fired
        # The firings this call set, for the view.
        slots: dict[bytes, None] = {}
        while stream.size() > 0:
            start = size - stream.size()
            value = impl.decode_from_stream(stream, True)
            pane = value.pane_info
            if pane.timing == bi.PaneInfoTiming.UNKNOWN:
                end = max(w.max_timestamp().micros for w in value.windows)
                plain.append((end, elements[start : size - stream.size()]))
                continue
            key = b"" if key_impl is None else key_impl.encode_nested(value.value[0])
            for window in value.windows:
                single = bi.WindowedValue(value.value, value.timestamp, (window,), pane)
                end = window.max_timestamp().micros
                if end < GLOBAL_END:
                    # A window that ends: its firings add up, read once it is done.
                    plain.append((end, impl.encode_nested(single)))
                    continue
                slot = window_impl.encode_nested(window) + key
                entry = fired.get(slot)
                if entry is None or entry[0] < pane.index:
                    if entry is None:
                        self._count_end(number, end, 1)
                    fired[slot] = [pane.index, end, [impl.encode_nested(single)]]
                    touched[(number, slot)] = slots[slot] = None
                elif entry[0] == pane.index:
                    entry[2].append(impl.encode_nested(single))
                    touched[(number, slot)] = slots[slot] = None
        view = self.view
        if view is not None:
            for slot in slots:
                view.set_fired(number, slot, fired[slot][2])
        self._keep(number, plain)

    def _keep(self, number: int, plain: list[tuple[int, bytes]]) -> None:
        """Adds elements to side input ``number``'s chunks, a chunk per run of equal ends."""
        added = [
            (end, b"".join(element for _, element in run))
            for end, run in itertools.groupby(plain, key=operator.itemgetter(0))
        ]
        if added:
            self.journal.chunks.append(("add", number, added))
            self._add_chunks(number, added)

    def _add_chunks(self, number: int, added: list[tuple[int, bytes]]) -> None:
        if len(self.ends) < len(self.sides):
            self.ends = [[MAX_MICROS] * len(chunks) for chunks in self.sides]
        chunks, ends = self.sides[number], self.ends[number]
        view = self.view
        for end, chunk in added:
            chunks.append(chunk)
            ends.append(end)
            if view is not None:
                view.add_chunk(number, end, chunk)

    def forget(self, horizons: list[int]) -> None:
        """Drops each side input's windows that end before its horizon (microseconds).

        A chunk goes once every window of its elements does; so does a firing.
        """
        if len(self.ends) < len(self.sides):
            return
        if self._forget_chunks(horizons):
            self.journal.chunks.append(("forget", list(horizons)))
        for number, horizon in enumerate(horizons):
            if (
                number < len(self.fired)
                and min(self._ends_held()[number], default=horizon) < horizon
            ):
                fired = self.fired[number]
                for slot in [s for s, entry in fired.items() if entry[1] < horizon]:
                    self._count_end(number, fired.pop(slot)[1], -1)
                    self.journal.fired[(number, slot)] = None
                    if self.view is not None:
                        self.view.set_fired(number, slot, None)

    def _forget_chunks(self, horizons: list[int]) -> bool:
        """Drops the chunks whose windows end before their side input's horizon; whether any."""
        dropped = False
        for number, horizon in enumerate(horizons):
            ends = self.ends[number]
            if ends and min(ends) < horizon:
                kept = [
                    (e, c) for e, c in zip(ends, self.sides[number], strict=True) if e >= horizon
                ]
                self.ends[number] = [e for e, _ in kept]
                self.sides[number] = [c for _, c in kept]
                dropped = True
                if self.view is not None:
                    self.view.forget(number, horizon)
        return dropped

    def side_elements(self, number: int) -> list[bytes]:
        """What side input ``number`` serves: its elements, a firing's the latest."""
        fired = self.fired[number] if number < len(self.fired) else {}
        return [*self.sides[number], *(b"".join(entry[2]) for entry in fired.values())]

    def fired_ends(self) -> list[frozenset[int]]:
        """Per side input, the ends of the windows that had a trigger firing."""
        if len(self.fired) != len(self.sides):
            return [frozenset()] * len(self.sides)
        return [frozenset(ends) for ends in self._ends_held()]

    def wait(self, elements: bytes, earliest: int, needs: Needs) -> None:
        """Main elements (encoded, concatenated) that wait for ``needs``."""
        bucket = self.buckets.get(needs)
        if bucket is None:
            self.buckets[needs] = [[elements], earliest, 0]
        else:
            bucket[0].append(elements)
            bucket[1] = min(bucket[1], earliest)
        self.journal.buckets[needs] = None

    def take_ready(self, ready: list[Needs], store: WaitingStore) -> list[bytes]:
        """The elements waiting for ``ready``, in the order they came; their buckets go.

        In chunks: encoded elements, concatenated, or (``store_new`` with ``runs``) pickled
        runs and chunks of them (``pickled_runs.bundle_input`` reads both).
        """
        stored = {needs for needs in ready if self.buckets[needs][2]}
        taken = store.take(stored) if stored else {}
        out: list[bytes] = []
        for needs in ready:
            out.extend(taken.get(needs, ()))
            out.extend(self.buckets.pop(needs)[0])
        self.journal.buckets.update(dict.fromkeys(ready))
        return out

    def store_new(self, store: WaitingStore, runs: bool = False) -> None:
        """Moves this batch's waiting elements to the store, a chunk per bucket.

        Encoded elements are stored concatenated; with ``runs`` (the main input's elements
        may come in pickled runs), as ``pickled_runs.stored`` stores them.
        """
        chunks = []
        for needs, bucket in self.buckets.items():
            if bucket[0]:
                pieces = bucket[0]
                chunks.append((needs, pickled_runs.stored(pieces) if runs else b"".join(pieces)))
                bucket[0] = []
                bucket[2] += 1
                self.journal.buckets[needs] = None
        store.append(chunks)

    def changes(self) -> tuple[Any, ...]:
        """What changed since ``begin_batch``, for ``replay`` (not encoded).

        Its watermarks; the side chunks added and forgotten, in order; each firing touched
        as it is now (None: dropped); each bucket touched as it is now (None: released). A
        bucket's new elements are in the store by now (``store_new``).
        """
        journal = self.journal
        fired = {
            (number, slot): _copied(self.fired[number].get(slot)) for number, slot in journal.fired
        }
        buckets = {}
        for needs in journal.buckets:
            bucket = self.buckets.get(needs)
            assert bucket is None or not bucket[0], "a bucket's new elements not yet stored"
            buckets[needs] = None if bucket is None else (bucket[1], bucket[2])
        return (self.watermarks, journal.chunks, fired, buckets)

    def replay(self, changes: tuple[Any, ...]) -> None:
        """Applies what ``changes`` returned to the state as it was before that batch."""
        self.watermarks, chunks, fired, buckets = changes
        for change in chunks:
            if change[0] == "add":
                self._add_chunks(change[1], change[2])
            else:
                self._forget_chunks(change[1])
        if fired and len(self.fired) < len(self.sides):
            self.fired = [{} for _ in self.sides]
        view = self.view
        for (number, slot), entry in fired.items():
            if entry is None:
                dropped = self.fired[number].pop(slot, None)
                if dropped is not None:
                    self._count_end(number, dropped[1], -1)
            else:
                if slot not in self.fired[number]:
                    self._count_end(number, entry[1], 1)
                self.fired[number][slot] = _copied(entry)
            if view is not None:
                view.set_fired(number, slot, None if entry is None else entry[2])
        for needs, bucket in buckets.items():
            if bucket is None:
                self.buckets.pop(needs, None)
            else:
                self.buckets[needs] = [[], bucket[0], bucket[1]]
        self.waiting = []


def _copied(entry: list[Any] | None) -> list[Any] | None:
    """A firing's entry, apart from the one the state goes on changing."""
    return None if entry is None else [entry[0], entry[1], list(entry[2])]
