"""Stages with side inputs in a streaming run: main elements wait for their side inputs.

A stage that reads side inputs is a node of a stateful level. Its side-input elements reach
every shard and stay in its state; its main elements, spread over the shards, come as a
framed run (``rows.FRAMED_RUN``), their values decoded only when they run. Each micro-batch
a shard (``SideInputShard``, on ``shard_run``'s skeleton) adds the new elements, advances
its watermarks, and runs in one bundle the main elements whose side-input windows are final
(each side input's watermark past the end of the window the element maps to, which then
holds every firing's elements; or, for the global window, a trigger firing); the others
wait, their timestamps holding its output watermark. In the global window a side input's
trigger firings (elements with a pane from a GroupByKey) replace each other, as Beam's
programming guide specifies: under a repeated trigger it serves its latest value. Waiting
elements live in a list in the state store (``WaitingStore``), not in the shard's state
value rewritten every batch, and are rewritten only in a batch where some are ready. A
bounded side input is final at once. A side input's window is forgotten once no main element
can read it any more (``_Coders.horizons``). A stateful DoFn reading streamed side inputs
waits the same way (``stateful_side_inputs``), as does an unbounded splittable DoFn
(``splittable``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import operator
import pickle
import struct
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

from apache_beam.transforms.window import GlobalWindow

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import pickled_runs
from beam_spark_runner.execution.side_inputs import side_input_state_entries
from beam_spark_runner.execution.stage_worker import (
    BundleOutputs,
    StageSpec,
    TaskSinks,
    stage_worker,
)
from beam_spark_runner.monitoring.metrics import task_metrics
from beam_spark_runner.streaming.chunk_lists import ListStateChunks
from beam_spark_runner.streaming.rows import (
    ELEMENT,
    FRAMED_LENGTH,
    FRAMED_RUN,
    PICKLED_RUN,
    PORT,
    Row,
    cell,
    framed_run_elements,
    marker_of,
)
from beam_spark_runner.streaming.shard_run import ShardRun, routed_outputs, run_user_code
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import (
    MAX_MICROS,
    MIN_MICROS,
    Marker,
    WatermarkState,
    input_watermark,
)


@dataclasses.dataclass(frozen=True)
class SideInputSpec:
    """One side input of the stage: who reads it, how, and its coders and window mapping."""

    transform_id: str
    tag: str
    access_pattern_urn: str
    value_coder_id: str
    window_mapping: bytes  # a serialized FunctionSpec


@dataclasses.dataclass(frozen=True)
class SideInputStageSpec:
    """What a shard of a stage with side inputs needs besides the stage itself."""

    stage: StageSpec
    components: bytes
    input_coder_id: str
    side_inputs: tuple[SideInputSpec, ...]


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


# The end of the global window: the one window a side input's firings replace each other in.
_GLOBAL_END = GlobalWindow().max_timestamp().micros

# A side input's window (and, for a multimap, key) -> [pane index, window end, elements]:
# the elements of the latest trigger firing seen, encoded.
Fired = dict[bytes, list[Any]]


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

    def add_side(self, number: int, elements: bytes, coders: _Coders) -> None:
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
                if end < _GLOBAL_END:
                    # A window that ends: its firings add up, read once it is done.
                    plain.append((end, impl.encode_nested(single)))
                    continue
                slot = window_impl.encode_nested(window) + key
                entry = fired.get(slot)
                if entry is None or entry[0] < pane.index:
                    fired[slot] = [pane.index, end, [impl.encode_nested(single)]]
                elif entry[0] == pane.index:
                    entry[2].append(impl.encode_nested(single))
        self._keep(number, plain)

    def _keep(self, number: int, plain: list[tuple[int, bytes]]) -> None:
        """Adds elements to side input ``number``'s chunks, a chunk per run of equal ends."""
        if len(self.ends) < len(self.sides):
            self.ends = [[MAX_MICROS] * len(chunks) for chunks in self.sides]
        chunks, ends = self.sides[number], self.ends[number]
        for end, run in itertools.groupby(plain, key=operator.itemgetter(0)):
            chunks.append(b"".join(element for _, element in run))
            ends.append(end)

    def forget(self, horizons: list[int]) -> None:
        """Drops each side input's windows that end before its horizon (microseconds).

        A chunk goes once every window of its elements does; so does a firing.
        """
        if len(self.ends) < len(self.sides):
            return
        for number, horizon in enumerate(horizons):
            ends = self.ends[number]
            if ends and min(ends) < horizon:
                kept = [
                    (e, c) for e, c in zip(ends, self.sides[number], strict=True) if e >= horizon
                ]
                self.ends[number] = [e for e, _ in kept]
                self.sides[number] = [c for _, c in kept]
            if number < len(self.fired):
                fired = self.fired[number]
                for slot in [s for s, entry in fired.items() if entry[1] < horizon]:
                    del fired[slot]

    def side_elements(self, number: int) -> list[bytes]:
        """What side input ``number`` serves: its elements, a firing's the latest."""
        fired = self.fired[number] if number < len(self.fired) else {}
        return [*self.sides[number], *(b"".join(entry[2]) for entry in fired.values())]

    def fired_ends(self) -> list[frozenset[int]]:
        """Per side input, the ends of the windows that had a trigger firing."""
        fired = self.fired if len(self.fired) == len(self.sides) else [{}] * len(self.sides)
        return [frozenset(entry[1] for entry in windows.values()) for windows in fired]

    def wait(self, elements: bytes, earliest: int, needs: Needs) -> None:
        """Main elements (encoded, concatenated) that wait for ``needs``."""
        bucket = self.buckets.get(needs)
        if bucket is None:
            self.buckets[needs] = [[elements], earliest, 0]
        else:
            bucket[0].append(elements)
            bucket[1] = min(bucket[1], earliest)

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
        store.append(chunks)


class _Coders:
    """The stage's input coder, side-input value coders and window mappings, per process."""

    def __init__(self, spec: SideInputStageSpec) -> None:
        context = bi.PipelineContext(bi.beam_runner_api_pb2.Components.FromString(spec.components))
        input_coder = context.coders[spec.input_coder_id]
        self.input_impl = input_coder.get_impl()
        self.headers = bi.WindowedHeaders.of(input_coder)
        self.run_reader = (
            pickled_runs.RunReader(input_coder)
            if pickled_runs.pickles_in_runs(input_coder)
            else None
        )
        self.value_coders = [context.coders[s.value_coder_id] for s in spec.side_inputs]
        # Per side input: its windowed-value, window and (multimap) key coders' impls.
        self.side_impls = [
            (
                coder.get_impl(),
                coder.window_coder.get_impl(),
                coder.wrapped_value_coder.key_coder().get_impl()
                if side.access_pattern_urn == bi.common_urns.side_inputs.MULTIMAP.urn
                else None,
            )
            for side, coder in zip(spec.side_inputs, self.value_coders, strict=True)
        ]
        self.mappings = [
            bi.window_mapping_fn(bi.beam_runner_api_pb2.FunctionSpec.FromString(s.window_mapping))
            for s in spec.side_inputs
        ]
        self.reaches = _reaches(spec, self.mappings)
        self._needs: dict[Hashable, tuple[int, ...]] = {}

    def horizons(self, main_watermark: int, earliest_waiting: int) -> list[int]:
        """Per side input, the window end (max timestamp) before which no main element reads.

        Beam's rule (Java's ``WindowMappingFn.maximumLookback``): a side window is
        unreachable once the main input's watermark passes its end plus the mapping's
        lookback plus the main input's allowed lateness, as every main window that could map
        to it has expired. The main elements still waiting read windows no earlier than
        their timestamps. A mapping of unknown lookback keeps every window.
        """
        return [
            MIN_MICROS if reach is None else min(main_watermark - reach, earliest_waiting)
            for reach in self.reaches
        ]

    def needs(self, windows: Iterable[Any], key: Hashable = None) -> tuple[int, ...]:
        """Per side input, the watermark it must reach for an element in ``windows``.

        That is the latest end (max timestamp, microseconds) of the side-input windows
        they map to.

        Elements share a few windows: the mapping runs once per window set, cached by
        ``key`` (the windows' bytes, from a header) or else by the windows (the cache is
        emptied when it holds more than ``_NEEDS_CACHED``).
        """
        windows = tuple(windows)
        if key is None:
            key = windows
        needs = self._needs.get(key)
        if needs is None:
            needs = tuple(
                max((mapping(w).max_timestamp().micros for w in windows), default=MIN_MICROS)
                for mapping in self.mappings
            )
            if len(self._needs) >= _NEEDS_CACHED:
                self._needs.clear()
            self._needs[key] = needs
        return needs

    def framed_runs(self, run: bytes) -> Iterator[tuple[bytes, int, tuple[int, ...]]]:
        """A framed run's main elements (``rows.FRAMED_RUN``) as runs of equal needs.

        Neighbours with the same needs make one run. Yields each run's elements (encoded,
        concatenated), its earliest timestamp (microseconds) and its needs. Where the
        windows' coder allows (``headers``), each element's timestamp and windows are read
        from its header, the needs looked up by its windows' bytes, and its value is not
        decoded (it is, once, when the element runs); otherwise each element is decoded.
        """
        headers = self.headers
        if headers is not None:
            yield from headers.framed_groups(run, FRAMED_LENGTH, self._needs_of)
            return
        decode = self.input_impl.decode_nested
        elements: list[bytes] = []
        run_needs: tuple[int, ...] | None = None
        earliest = MAX_MICROS
        for element in framed_run_elements(run):
            value = decode(element)
            timestamp, needs = value.timestamp.micros, self.needs(value.windows)
            if needs != run_needs:
                if run_needs is not None:
                    yield b"".join(elements), earliest, run_needs
                elements, run_needs, earliest = [], needs, MAX_MICROS
            elements.append(element)
            if timestamp < earliest:
                earliest = timestamp
        if run_needs is not None:
            yield b"".join(elements), earliest, run_needs

    def runs_of(self, cell: bytes) -> Iterator[tuple[bytes, int, tuple[int, ...]]]:
        """A ``rows.PICKLED_RUN`` cell's runs, each with its earliest timestamp and needs."""
        assert self.headers is not None, "runs come only for Beam's windowed-value coder"
        for run in pickled_runs.framed_runs(cell):
            windows, earliest = pickled_runs.run_header(run)
            yield run, earliest, self._needs_of(windows)

    def _needs_of(self, windows: bytes) -> tuple[int, ...]:
        """The needs of the windows whose bytes a header gave."""
        needs = self._needs.get(windows)
        if needs is None:
            assert self.headers is not None, "windows' bytes come from a header"
            needs = self.needs(self.headers.windows(windows), key=windows)
        return needs


_NEEDS_CACHED = 4096


def _reaches(spec: SideInputStageSpec, mappings: list[Any]) -> list[int | None]:
    """Per side input, how far (µs) behind the main watermark a main window may still read.

    That is the mapping's lookback (none for Beam's default) plus the allowed lateness of
    the main input of the ParDo reading it; None where the mapping is a user's, whose
    lookback is unknown.
    """
    descriptor = bi.beam_fn_api_pb2.ProcessBundleDescriptor.FromString(spec.stage.descriptor)
    payloads = {t: (transform, p) for t, transform, p in bi.par_do_payloads(descriptor.transforms)}
    reaches: list[int | None] = []
    for side, mapping in zip(spec.side_inputs, mappings, strict=True):
        transform, payload = payloads[side.transform_id]
        others = {*payload.side_inputs, *payload.timer_family_specs}
        mains = [pc for tag, pc in transform.inputs.items() if tag not in others]
        if not bi.maps_via_end(mapping) or len(mains) != 1:
            reaches.append(None)
            continue
        strategy_id = descriptor.pcollections[mains[0]].windowing_strategy_id
        reaches.append(descriptor.windowing_strategies[strategy_id].allowed_lateness * 1000)
    return reaches


@functools.lru_cache(maxsize=64)
def _coders(spec: SideInputStageSpec) -> _Coders:
    return _Coders(spec)


def coders_of(spec: SideInputStageSpec) -> _Coders:
    """The coders of ``spec``'s stage, made once per process."""
    return _coders(spec)


def _ready(
    needs: tuple[int, ...], side_watermarks: list[int], fired_ends: list[frozenset[int]]
) -> bool:
    """Whether every side input an element reads is ready for its windows.

    Ready: its watermark passed the end of the window the element maps to (the window is
    done: every firing's elements are read, as Beam's ValidatesRunner tests expect), or, for
    the global window, which is done only when the input ends, that window had a firing.
    """
    return all(
        watermark >= MAX_MICROS or need <= watermark or (need >= _GLOBAL_END and need in ends)
        for need, watermark, ends in zip(needs, side_watermarks, fired_ends, strict=True)
    )


def forget_unreachable(
    state: SideInputShardState, coders: _Coders, main_watermark: int, earliest: int = MAX_MICROS
) -> None:
    """Drops the side-input windows no main element can read any more (``_Coders.horizons``).

    ``earliest``: the earliest timestamp of other main elements the shard keeps to run again.
    """
    earliest = min([earliest, *(bucket[1] for bucket in state.buckets.values())])
    state.forget(coders.horizons(main_watermark, earliest))


def ready_needs(
    state: SideInputShardState, side_expected: tuple[frozenset[str], ...]
) -> list[Needs]:
    """The needs of the waiting buckets whose side inputs are ready now."""
    producers = state.watermarks.producers
    side_watermarks = [input_watermark(e, producers) for e in side_expected]
    fired_ends = state.fired_ends()
    return [n for n in state.buckets if _ready(n, side_watermarks, fired_ends)]


def read_rows(
    node: Node, state: SideInputShardState, rows: Iterable[Any], coders: _Coders
) -> list[Marker]:
    """Side-input elements into the state, main elements into their buckets; the markers."""
    markers: list[Marker] = []
    for row in rows:
        if row[ELEMENT] is None:
            markers.append(marker_of(row))
        elif row[PORT] == FRAMED_RUN:
            for elements, earliest, needs in coders.framed_runs(cell(row[ELEMENT])):
                state.wait(elements, earliest, needs)
        elif row[PORT] == PICKLED_RUN:
            for run, earliest, needs in coders.runs_of(cell(row[ELEMENT])):
                state.wait(run, earliest, needs)
        elif row[PORT] > 0:
            state.add_side(row[PORT] - 1, cell(row[ELEMENT]), coders)
        else:
            raise ValueError(
                f"{node.name}: expected its main elements as a framed run (port "
                f"{FRAMED_RUN}, rows.packed), found port {row[PORT]}"
            )
    for entry in state.waiting:  # from a checkpoint written before buckets
        if len(entry) == 2:
            entry = (*entry, coders.needs(coders.input_impl.decode_nested(entry[0]).windows))
        state.wait(*entry)
    state.waiting = []
    return markers


def load_side_inputs(worker: Any, spec: SideInputStageSpec, state: SideInputShardState) -> None:
    """Serves the side inputs the state holds to ``worker``'s bundles.

    Called before a shard's first bundle, so the invokers its bundles build read them anew.
    """
    entries = [
        entry
        for number, (side, coder) in enumerate(
            zip(spec.side_inputs, _coders(spec).value_coders, strict=True)
        )
        for entry in side_input_state_entries(
            side.transform_id,
            side.tag,
            side.access_pattern_urn,
            state.side_elements(number),
            coder,
        )
    ]
    digest = hashlib.sha1(
        b"".join(key + data for key, data in entries), usedforsecurity=False
    ).hexdigest()
    worker.load_side_inputs(entries, f"{spec.stage.cache_key}/{digest}")


class SideInputShard(ShardRun[SideInputShardState, BundleOutputs]):
    """One micro-batch of a shard of a stage with side inputs: the main elements now ready."""

    def __init__(self, spec: SideInputStageSpec, sinks: TaskSinks, store: WaitingStore) -> None:
        self.spec = spec
        self.sinks = sinks
        self.store = store
        self.worker: Any = None
        # Per side input, the producers whose minimum is its watermark (the node's).
        self.side_expected: tuple[frozenset[str], ...] = ()
        self.main_expected: frozenset[str] = frozenset()

    def new_state(self, watermarks: WatermarkState) -> SideInputShardState:
        return SideInputShardState(watermarks, [[] for _ in self.spec.side_inputs])

    def decode(self, data: bytes) -> SideInputShardState:
        return SideInputShardState.decode(data)

    def encode(self, state: SideInputShardState) -> bytes:
        return state.encode()

    def read(self, node: Node, state: SideInputShardState, rows: Iterable[Any]) -> list[Marker]:
        """Side-input elements into the state, main elements into their buckets."""
        self.spec.stage.environment.enter()
        markers = read_rows(node, state, rows, _coders(self.spec))
        self.side_expected = node.side_expected
        self.main_expected = node.main_expected
        return markers

    def after_watermark(self, state: SideInputShardState) -> Iterator[BundleOutputs]:
        """One bundle over the main elements whose side inputs are ready."""
        ready = state.take_ready(ready_needs(state, self.side_expected), self.store)
        if not ready:
            return
        spec = self.spec
        worker = self.worker = stage_worker(spec.stage)
        load_side_inputs(worker, spec, state)
        data = pickled_runs.bundle_input(ready, _coders(spec).run_reader)
        with task_metrics(self.sinks.metrics, spec.stage.name) as metrics:
            outputs = run_user_code(spec.stage, lambda: list(worker.process(data, metrics)))
        worker.finalize_bundles()
        yield from outputs

    def finish(self, state: SideInputShardState) -> None:
        main = input_watermark(self.main_expected, state.watermarks.producers)
        coders = _coders(self.spec)
        forget_unreachable(state, coders, main, self.earliest_kept(state))
        state.store_new(self.store, runs=coders.run_reader is not None)

    def earliest_kept(self, state: SideInputShardState) -> int:
        """The earliest timestamp of main elements kept to run again, besides the waiting."""
        return MAX_MICROS

    def hold(self, state: SideInputShardState) -> int:
        return min((bucket[1] for bucket in state.buckets.values()), default=MAX_MICROS)

    def main_input_watermark(self, node: Node, state: SideInputShardState) -> int:
        return input_watermark(node.main_expected, state.watermarks.producers)

    def rows(self, topology: Topology, node: Node, outputs: list[Any]) -> list[Row]:
        if self.worker is None:
            return []
        return routed_outputs(topology, node, self.spec.stage, self.worker, outputs)
