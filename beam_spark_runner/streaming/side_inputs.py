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
elements live in a list in the state store (``WaitingStore``), rewritten only in a batch
where some are ready; the shard's state (``side_input_state``) is cached in the worker, a
batch logging what it changed (``state_cache``). A bounded side input is final at once. A
side input's window is forgotten once no main element can read it any more
(``_Coders.horizons``). A stateful DoFn reading streamed side inputs
waits the same way (``stateful_side_inputs``), as does an unbounded splittable DoFn
(``splittable``).
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import pickled_runs
from beam_spark_runner.execution.stage_worker import (
    BundleOutputs,
    StageSpec,
    TaskSinks,
    stage_worker,
)
from beam_spark_runner.monitoring.metrics import task_metrics
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
from beam_spark_runner.streaming.side_input_state import (
    GLOBAL_END,
    Needs,
    SideInputShardState,
    WaitingStore,
)
from beam_spark_runner.streaming.side_input_view import STATS as view_stats
from beam_spark_runner.streaming.side_input_view import SideInputView
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

# What a batch changed (``SideInputShard.changes``), tagged.
_CHANGES = "beam-spark-side-input-changes-v1"


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
        watermark >= MAX_MICROS or need <= watermark or (need >= GLOBAL_END and need in ends)
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
    """Side-input elements into the state, main elements into their buckets; the markers.

    The first step of a batch on the state: it starts noting the batch's changes.
    """
    state.begin_batch()
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

    Called before a shard's first bundle of a batch, so the invokers its bundles build read
    them anew. The view served (``side_input_view``) stays with the state in the worker's
    cache and follows its changes: built from every side element held only where the state
    has none (read back from the store, or new to this worker).
    """
    view = state.view
    if view is not None and view.stage != spec.stage.cache_key:
        view = None
    if view is not None and not view.follows(state.sides, state.fired):
        view_stats.diverged += 1
        view = None
    if view is None:
        sides = [
            (side.transform_id, side.tag, side.access_pattern_urn, coder)
            for side, coder in zip(spec.side_inputs, _coders(spec).value_coders, strict=True)
        ]
        view = SideInputView(spec.stage.cache_key, sides).built_from(
            state.sides, state.ends, state.fired
        )
        state.follow(view)
    worker.serve_side_inputs(view, f"{spec.stage.cache_key}/{view.token}")


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

    def changes(self, state: SideInputShardState) -> bytes:
        """What the batch changed (``SideInputShardState.changes``)."""
        return pickle.dumps((_CHANGES, state.changes()), protocol=pickle.HIGHEST_PROTOCOL)

    def replay(self, state: SideInputShardState, changes: bytes) -> None:
        """Applies what ``changes`` wrote to the state as it was before that batch."""
        layout, side = pickle.loads(changes)
        assert layout == _CHANGES, f"expected a side-input shard's changes, found {layout!r}"
        state.replay(side)

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
