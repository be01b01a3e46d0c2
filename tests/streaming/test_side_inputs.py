"""Waiting main elements of a streaming stage with side inputs, without Spark."""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import (
    PANE_INFO_UNKNOWN,
    PaneInfo,
    PaneInfoTiming,
    WindowedValue,
)

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.beam_internals import WindowedHeaders
from beam_spark_runner.coders import pickled_runs
from beam_spark_runner.execution.stage_worker import NO_SINKS
from beam_spark_runner.planning import build_plan
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from tests.list_states import ListState
from tests.stage_specs import stage_spec

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip(
        "streaming runs need PySpark 3.5+; this is older",
        allow_module_level=True,
    )

from beam_spark_runner.streaming import side_input_state, side_inputs  # noqa: E402
from beam_spark_runner.streaming.check import is_unbounded_splittable  # noqa: E402
from beam_spark_runner.streaming.compression import pack  # noqa: E402
from beam_spark_runner.streaming.query import side_input_specs  # noqa: E402
from beam_spark_runner.streaming.rows import (  # noqa: E402
    ELEMENT,
    FRAMED_RUN,
    PICKLED_RUN,
    PORT,
    PRODUCER,
    PTIME,
    WATERMARK,
)
from beam_spark_runner.streaming.topology import STAGE, Node, Topology  # noqa: E402
from beam_spark_runner.streaming.watermarks import Marker, WatermarkState  # noqa: E402

SECOND = 1_000_000


def side_stage(
    read: Callable[[Any, Any], Any],
    windows: Any,
    stateful: bool = False,
    lateness: int = 0,
    splittable: bool = False,
) -> tuple[Any, ...]:
    """The stage ``read(main, view)`` makes, reading a side input as a singleton, in-process.

    Main and side input are ``PeriodicImpulse``s in ``windows`` (the main input with
    ``lateness`` s of allowed lateness). ``splittable``: the stage processing an unbounded
    splittable DoFn's restrictions (the one pairing them with its elements reads the side
    input too). Returns the stage's ``SideInputStageSpec``, its
    node (producers "main" and "side") and topology, the main input's and the side input's
    coder impls, and the main input's coder.
    """
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))

    def ticks(name: str, allowed: int) -> Any:
        return (
            pipeline
            | name >> PeriodicImpulse(0, 10, 1)
            | f"{name}Windows" >> beam.WindowInto(windows, allowed_lateness=allowed)
        )

    _ = read(ticks("Main", lateness), beam.pvalue.AsSingleton(ticks("Side", 0)))
    pipeline.visit(bi.group_by_key_input_visitor(True))
    plan = build_plan(
        pipeline.to_runner_api(default_environment=bi.default_environment()), streaming=True
    )
    (stage,) = [
        s for s in plan.stages if s.side_inputs and is_unbounded_splittable(s) == splittable
    ]
    assert stage.stateful == stateful
    spec = side_inputs.SideInputStageSpec(
        stage=stage_spec(plan, stage, f"side-inputs-{stateful}-{lateness}"),
        components=plan.components.SerializeToString(),
        input_coder_id=stage.input_coder_id,
        side_inputs=side_input_specs(stage, plan),
    )
    context = bi.PipelineContext(plan.components)
    main_coder = context.coders[stage.input_coder_id]
    side_coder = plan.data_channel_coders[stage.side_inputs[0].pcollection_id]
    node = Node(
        index=0,
        name=stage.name,
        kind=STAGE,
        stateful=True,
        step=1,
        targets=tuple(() for _ in stage.outputs),
        expected=frozenset({"main", "side"}),
        main_expected=frozenset({"main"}),
        side_expected=(frozenset({"side"}),),
    )
    topology = Topology(nodes=(node,), roots={}, levels=1, shards=1, sink_producers=frozenset())
    side_impl = context.coders[side_coder].get_impl()
    return spec, node, topology, main_coder.get_impl(), side_impl, main_coder


def side_rows(
    main: Any,
    side: Any,
    mains: list[int],
    sides: list[int],
    marks: dict[str, int],
    width: int = 5,
) -> list[dict[str, Any]]:
    """A batch's rows: main ("k", t) and side t elements at t s in fixed windows, markers (s)."""

    def at(t: int) -> Any:
        return [IntervalWindow(t // width * width, t // width * width + width)]

    framed = b"".join(
        struct.pack(">I", len(e)) + e
        for e in (
            main.encode_nested(WindowedValue(("k", float(t)), Timestamp(t), at(t))) for t in mains
        )
    )
    rows: list[dict[str, Any]] = [
        {ELEMENT: pack(side.encode_nested(WindowedValue(float(t), Timestamp(t), at(t)))), PORT: 1}
        for t in sides
    ]
    if mains:
        rows.append({ELEMENT: pack(framed), PORT: FRAMED_RUN})
    rows.extend(
        {ELEMENT: None, PRODUCER: p, WATERMARK: w * SECOND, PTIME: 0} for p, w in marks.items()
    )
    return rows


class MemoryWaitingStore:
    """A ``WaitingStore`` in memory ."""

    def __init__(self) -> None:
        self.chunks: list[tuple[side_inputs.Needs, bytes]] = []

    def append(self, chunks: list[tuple[side_inputs.Needs, bytes]]) -> None:
        self.chunks.extend(chunks)

    def take(self, needs: set[side_inputs.Needs]) -> dict[side_inputs.Needs, list[bytes]]:
        taken: dict[side_inputs.Needs, list[bytes]] = {}
        kept = []
        for entry in self.chunks:
            if entry[0] in needs:
                taken.setdefault(entry[0], []).append(entry[1])
            else:
                kept.append(entry)
        self.chunks = kept
        return taken


class _Undecodable:
    """A value whose decoding fails: a framed run's needs must not decode values."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_fail, ())


def _fail() -> None:
    raise AssertionError("a waiting main element's value was decoded")


_MAIN_CODER = coders.WindowedValueCoder(coders.PickleCoder(), coders.IntervalWindowCoder())


def _coders(headers: bool = True) -> side_inputs._Coders:
    """The stage's coders for elements in interval windows, one side input mapped 1:1.

    ``headers=False``: as for a windowed coder whose header cannot be read apart.
    """
    made = side_inputs._Coders.__new__(side_inputs._Coders)
    coder = _MAIN_CODER
    made.input_impl = coder.get_impl()
    made.headers = WindowedHeaders.of(coder) if headers else None
    made.run_reader = pickled_runs.RunReader(coder)
    made.mappings = [lambda w: w]
    made._needs = {}
    return made


def _framed(elements: list[bytes]) -> bytes:
    """A framed run of encoded elements, as ``rows.packed`` makes it for such a stage."""
    return b"".join(struct.pack(">I", len(e)) + e for e in elements)


def test_neighbours_with_the_same_needs_wait_as_one_run_without_their_values_decoded() -> None:
    made = _coders()
    a, b = IntervalWindow(0, 10), IntervalWindow(10, 20)
    elements = [(_Undecodable(), 3, a), (2, 1, a), (3, 12, b), (4, 5, a)]
    encoded = [
        made.input_impl.encode_nested(WindowedValue(v, Timestamp(t), [w])) for v, t, w in elements
    ]
    runs = list(made.framed_runs(_framed(encoded)))
    need_a, need_b = (a.max_timestamp().micros,), (b.max_timestamp().micros,)
    assert runs == [
        (encoded[0] + encoded[1], 1 * SECOND, need_a),
        (encoded[2], 12 * SECOND, need_b),
        (encoded[3], 5 * SECOND, need_a),
    ]
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    for run in runs:
        state.wait(*run)
    # One bucket per needs, its earliest timestamp the hold.
    assert state.buckets == {
        need_a: [[encoded[0] + encoded[1], encoded[3]], 1 * SECOND, 0],
        need_b: [[encoded[2]], 12 * SECOND, 0],
    }


def test_a_coder_without_a_readable_header_decodes_the_elements_for_their_needs() -> None:
    made = _coders(headers=False)
    a, b = IntervalWindow(0, 10), IntervalWindow(10, 20)
    encoded = [
        made.input_impl.encode_nested(WindowedValue(v, Timestamp(t), [w]))
        for v, t, w in [(1, 3, a), (2, 12, b)]
    ]
    assert list(made.framed_runs(_framed(encoded))) == [
        (encoded[0], 3 * SECOND, (a.max_timestamp().micros,)),
        (encoded[1], 12 * SECOND, (b.max_timestamp().micros,)),
    ]


def test_a_state_written_before_buckets_is_read() -> None:
    old = side_inputs.SideInputShardState(
        WatermarkState(expected=frozenset()), [[b"side"]], waiting=[(b"x", 5, (9,))]
    )
    del old.__dict__["buckets"]  # as an earlier runner version pickled it
    state = side_inputs.SideInputShardState.decode(pickle.dumps(old))
    assert state.buckets == {}
    assert state.waiting == [(b"x", 5, (9,))]
    assert state.sides == [[b"side"]]


@pytest.mark.parametrize("store_kind", ["memory", "list state"])
def test_waiting_elements_live_in_the_store_and_come_back_in_order(store_kind: str) -> None:
    list_state = ListState()
    store: side_input_state.WaitingStore = (
        MemoryWaitingStore()
        if store_kind == "memory"
        else side_input_state.ListStateWaitingStore(list_state)
    )
    a, b = (10,), (20,)
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    state.wait(b"a1", 3, a)
    state.wait(b"b1", 12, b)
    state.wait(b"a2", 1, a)
    state.store_new(store)
    # The state value keeps no element: a chunk per bucket went to the store.
    assert state.buckets == {a: [[], 1, 1], b: [[], 12, 1]}
    state = side_inputs.SideInputShardState.decode(state.encode())
    state.wait(b"a3", 5, a)
    state.wait(b"b2", 15, b)
    assert state.take_ready([a], store) == [b"a1a2", b"a3"]
    assert state.buckets == {b: [[b"b2"], 12, 1]}
    state.store_new(store)
    assert state.take_ready([b], store) == [b"b1", b"b2"]
    assert state.buckets == {}
    assert state.take_ready([], store) == []
    if store_kind == "list state":
        # Appends only: each chunk written once when it came, and "b1" once more when
        # "a" was taken from the list and the rest put back.
        assert list_state.writes == 4
        assert list_state.rows is None


def test_buckets_written_before_the_store_move_to_it() -> None:
    old = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    old.buckets = {(10,): [[b"x", b"y"], 4]}  # as the runner wrote them before the store
    state = side_inputs.SideInputShardState.decode(pickle.dumps(old))
    store = MemoryWaitingStore()
    state.store_new(store)
    assert state.buckets == {(10,): [[], 4, 1]}
    assert state.take_ready([(10,)], store) == [b"xy"]


def _runs_row(made: side_inputs._Coders, elements: list[WindowedValue]) -> dict[str, Any]:
    """A ``PICKLED_RUN`` row of ``elements``, as a router's stage sends them."""
    writer = pickled_runs.RunWriter(_MAIN_CODER, 1)
    assert writer.add(elements)
    return {
        ELEMENT: pack(b"".join(map(pickled_runs.frame, writer.finish()))),
        PORT: PICKLED_RUN,
    }


def _decoded(made: side_inputs._Coders, chunks: list[bytes]) -> list[Any]:
    """The windowed values a shard's bundle reads from ``chunks``, as (value, µs, windows)."""
    data = pickled_runs.bundle_input(chunks, made.run_reader)
    values = made.input_impl.decode_all(data) if isinstance(data, bytes) else data.windowed_values()
    return [(v.value, v.timestamp_micros, tuple(v.windows)) for v in values]


def test_waiting_elements_stored_before_runs_come_out_the_same_beside_runs() -> None:
    made = _coders()
    a, b = IntervalWindow(0, 10), IntervalWindow(10, 20)
    need_a, need_b = (a.max_timestamp().micros,), (b.max_timestamp().micros,)
    store = MemoryWaitingStore()
    old = [WindowedValue(("old", t), Timestamp(t), [a]) for t in (3, 4)]
    # As the runner stored them before runs: encoded elements, concatenated, per bucket.
    store.append([(need_a, b"".join(made.input_impl.encode_nested(v) for v in old))])
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    state.buckets = {need_a: [[], 3 * SECOND, 1]}
    new = [WindowedValue(("new", t), Timestamp(t), [w]) for t, w in ((1, a), (12, b), (2, a))]
    side_inputs.read_rows(None, state, [_runs_row(made, new)], made)
    # A run per group of windows, in its bucket, its earliest timestamp the bucket's hold.
    assert state.buckets[need_a][1] == 1 * SECOND
    assert state.buckets[need_b][1] == 12 * SECOND
    assert all(pickled_runs.is_run(piece) for piece in state.buckets[need_a][0])
    state.store_new(store, runs=True)
    state = side_inputs.SideInputShardState.decode(state.encode())
    later = [WindowedValue(("later", 5), Timestamp(5), [a])]
    rows = _framed([made.input_impl.encode_nested(v) for v in later])
    side_inputs.read_rows(None, state, [{ELEMENT: pack(rows), PORT: FRAMED_RUN}], made)
    ready = state.take_ready([need_a], store)
    assert _decoded(made, ready) == [
        (("old", 3), 3 * SECOND, (a,)),
        (("old", 4), 4 * SECOND, (a,)),
        (("new", 1), 1 * SECOND, (a,)),
        (("new", 2), 2 * SECOND, (a,)),
        (("later", 5), 5 * SECOND, (a,)),
    ]
    assert _decoded(made, state.take_ready([need_b], store)) == [(("new", 12), 12 * SECOND, (b,))]


def test_without_runs_waiting_elements_are_stored_and_read_as_before() -> None:
    made = _coders()
    store = MemoryWaitingStore()
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    encoded = [
        made.input_impl.encode_nested(WindowedValue(t, Timestamp(t), [IntervalWindow(0, 10)]))
        for t in (1, 2)
    ]
    for element in encoded:
        state.wait(element, 1, (9,))
    state.store_new(store, runs=True)
    assert store.chunks == [((9,), b"".join(encoded))]
    ready = state.take_ready([(9,)], store)
    assert pickled_runs.bundle_input(ready, made.run_reader) == b"".join(encoded)


def _side_coders(multimap: bool = False) -> side_inputs._Coders:
    """Coders of one side input in the global window (iterable, or multimap of str keys)."""
    made = side_inputs._Coders.__new__(side_inputs._Coders)
    value = (
        coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()])
        if multimap
        else coders.VarIntCoder()
    )
    coder = coders.WindowedValueCoder(value, coders.GlobalWindowCoder())
    made.value_coders = [coder]
    made.side_impls = [
        (
            coder.get_impl(),
            coder.window_coder.get_impl(),
            coders.StrUtf8Coder().get_impl() if multimap else None,
        )
    ]
    return made


def _panes(impl: Any, values: list[Any], index: int | None) -> bytes:
    """``values`` encoded in the global window, in the pane of firing ``index`` (None: none)."""
    pane = (
        PANE_INFO_UNKNOWN
        if index is None
        else PaneInfo(index == 0, False, PaneInfoTiming.EARLY, index, -1)
    )
    return b"".join(
        impl.encode_nested(WindowedValue(v, Timestamp(1), [GlobalWindow()], pane)) for v in values
    )


def _values(made: side_inputs._Coders, state: side_inputs.SideInputShardState) -> list[Any]:
    impl = made.side_impls[0][0]
    return sorted(v.value for chunk in state.side_elements(0) for v in impl.decode_all(chunk))


def test_a_side_input_serves_its_latest_firing_and_is_ready_from_the_first() -> None:
    made = _side_coders()
    impl = made.side_impls[0][0]
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset({"side"})), [[]])
    need = (GlobalWindow().max_timestamp().micros,)
    state.wait(b"main", 0, need)
    # Before any firing, the global window waits for the end of the side input.
    assert side_inputs.ready_needs(state, (frozenset({"side"}),)) == []
    state.add_side(0, _panes(impl, [1, 2], 0), made)
    assert _values(made, state) == [1, 2]
    assert side_inputs.ready_needs(state, (frozenset({"side"}),)) == [need]
    # A later firing (discarding: its own elements only) replaces the earlier one.
    state.add_side(0, _panes(impl, [3], 1), made)
    assert _values(made, state) == [3]
    # Elements of one firing that come in two batches add up; an older firing is ignored.
    state.add_side(0, _panes(impl, [4], 1) + _panes(impl, [0], 0), made)
    assert _values(made, state) == [3, 4]
    # The state keeps only the latest firing through a checkpoint.
    assert _values(made, side_inputs.SideInputShardState.decode(state.encode())) == [3, 4]


def test_elements_from_no_firing_add_up_and_a_multimap_keeps_each_keys_latest_firing() -> None:
    made = _side_coders()
    impl = made.side_impls[0][0]
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    state.add_side(0, _panes(impl, [1], None), made)
    state.add_side(0, _panes(impl, [2, 3], None), made)
    assert _values(made, state) == [1, 2, 3]
    # Not a firing: ready only at the side input's watermark.
    assert state.fired_ends() == [frozenset()]
    keyed = _side_coders(multimap=True)
    impl = keyed.side_impls[0][0]
    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[]])
    state.add_side(0, _panes(impl, [("a", 1), ("b", 1)], 0), keyed)
    state.add_side(0, _panes(impl, [("a", 2)], 1), keyed)
    assert _values(keyed, state) == [("a", 2), ("b", 1)]


def test_a_state_written_before_firings_were_kept_apart_is_read() -> None:
    old = side_inputs.SideInputShardState(WatermarkState(expected=frozenset()), [[b"x"], []])
    del old.__dict__["fired"]  # as an earlier runner version pickled it
    state = side_inputs.SideInputShardState.decode(pickle.dumps(old))
    assert state.side_elements(0) == [b"x"]
    assert state.fired_ends() == [frozenset(), frozenset()]


def test_a_window_that_ends_serves_every_firing_once_its_watermark_passes() -> None:
    """Beam's ValidatesRunner test_multi_triggered_gbk_side_input: an early and an on-time
    pane of a fixed window are both read, by main elements that waited for its end."""
    made = side_inputs._Coders.__new__(side_inputs._Coders)
    coder = coders.WindowedValueCoder(coders.VarIntCoder(), coders.IntervalWindowCoder())
    made.value_coders = [coder]
    made.side_impls = [(coder.get_impl(), coder.window_coder.get_impl(), None)]
    impl = coder.get_impl()
    window = IntervalWindow(0, 5)

    def pane(value: int, index: int, timing: Any) -> bytes:
        info = PaneInfo(index == 0, False, timing, index, -1)
        return impl.encode_nested(WindowedValue(value, Timestamp(2), [window], info))

    state = side_inputs.SideInputShardState(WatermarkState(expected=frozenset({"side"})), [[]])
    need = (window.max_timestamp().micros,)
    state.wait(b"main", 0, need)
    state.add_side(0, pane(100, 0, PaneInfoTiming.EARLY), made)
    # An early firing of a window that ends does not make it ready: it is not done.
    assert side_inputs.ready_needs(state, (frozenset({"side"}),)) == []
    state.add_side(0, pane(0, 1, PaneInfoTiming.ON_TIME), made)
    assert sorted(v.value for chunk in state.side_elements(0) for v in impl.decode_all(chunk)) == [
        0,
        100,
    ]
    state.watermarks.advance([Marker("side", Timestamp(5).micros, 0)])
    assert side_inputs.ready_needs(state, (frozenset({"side"}),)) == [need]


_READ: list[tuple[float, float]] = []


class _RecordSide(beam.DoFn):  # type: ignore[misc]
    """Records each main element's value with the side value it read."""

    def process(self, kv: tuple[str, float], side: float) -> Any:
        _READ.append((float(kv[1]), float(side)))
        yield kv


def _stateless_stage(lateness: int = 0) -> tuple[Any, ...]:
    return side_stage(
        lambda main, side: main | beam.Map(lambda at: ("k", at)) | beam.ParDo(_RecordSide(), side),
        window.FixedWindows(10),
        lateness=lateness,
    )


class _Batches:
    """A stateless side-input shard's micro-batches, each on the value the last one wrote."""

    def __init__(self, lateness: int = 0) -> None:
        self.spec, self.node, self.topology, self.main, self.side, _ = _stateless_stage(lateness)
        self.store = MemoryWaitingStore()
        self.value: bytes | None = None

    def batch(self, mains: list[int], sides: list[int], marks: dict[str, int]) -> int:
        rows = side_rows(self.main, self.side, mains, sides, marks, width=10)
        shard = side_inputs.SideInputShard(self.spec, NO_SINKS, self.store)
        self.value, _ = shard.run_encoded(self.topology, self.node, 0, self.value, rows)
        return len(self.value)

    def sides(self) -> list[float]:
        """The side values the state keeps."""
        assert self.value is not None
        state = side_inputs.SideInputShardState.decode(self.value)
        return sorted(
            v.value for chunk in state.side_elements(0) for v in self.side.decode_all(chunk)
        )


def test_side_windows_no_main_element_can_read_are_forgotten_and_the_size_stays_flat() -> None:
    _READ.clear()
    run = _Batches()
    sizes = []
    # A window of 10 s per batch: its side value, two main elements, the side input's
    # watermark past its end, the main input's at its start.
    for batch in range(40):
        at = batch * 10
        sizes.append(run.batch([at + 1, at + 2], [at], {"main": at, "side": at + 10}))
    assert _READ == [
        (float(t), float(t // 10 * 10)) for b in range(40) for t in (b * 10 + 1, b * 10 + 2)
    ]
    # Kept: the window the main input's watermark is in; the earlier ones no main element
    # can map to any more (Beam's default mapping, no allowed lateness).
    assert run.sides() == [390.0]
    assert max(sizes[2:]) - min(sizes[2:]) <= 8, sizes
    run.batch([], [], {"main": 10**12, "side": 10**12})
    assert run.sides() == []


def test_a_side_window_waiting_main_elements_map_to_is_kept_past_the_main_watermark() -> None:
    _READ.clear()
    run = _Batches()
    run.batch([1, 2], [], {"main": 50, "side": 0})
    # The side value of [0, 10) comes, its window not done yet: the main input's watermark
    # is far past it, but the waiting elements still map to it.
    run.batch([], [0], {"main": 60, "side": 5})
    assert _READ == []
    assert run.sides() == [0.0]
    run.batch([], [], {"main": 60, "side": 10})
    assert _READ == [(1.0, 0.0), (2.0, 0.0)]
    assert run.sides() == []


def test_a_side_window_is_kept_while_the_main_inputs_allowed_lateness_lets_it_be_read() -> None:
    _READ.clear()
    run = _Batches(lateness=20)
    run.batch([], [0], {"main": 25, "side": 10})
    # [0, 10) ends at 10; main elements of its windows may come until 10 + 20 s.
    assert run.sides() == [0.0]
    run.batch([3], [], {"main": 29, "side": 10})
    assert _READ == [(3.0, 0.0)]
    run.batch([], [], {"main": 31, "side": 10})
    assert run.sides() == []


class _RecordSideWithPane(beam.DoFn):  # type: ignore[misc]
    """``_RecordSide`` taking its pane too: it runs in Beam's bundle processor, not batched."""

    def process(
        self, kv: tuple[str, float], side: float, pane: Any = beam.DoFn.PaneInfoParam
    ) -> Any:
        _READ.append((float(kv[1]), float(side)))
        yield kv


def test_a_dofn_in_beams_bundle_processor_reads_each_firing_of_a_global_side_input() -> None:
    # Beam's invoker would resolve a globally windowed side input once, for its life.
    spec, node, topology, main, side, _ = side_stage(
        lambda main, side: (
            main | beam.Map(lambda at: ("k", at)) | beam.ParDo(_RecordSideWithPane(), side)
        ),
        window.GlobalWindows(),
    )
    store = MemoryWaitingStore()
    value: bytes | None = None
    _READ.clear()
    for at, firing in [(1, 0), (2, 1), (3, None)]:
        rows = [{ELEMENT: None, PRODUCER: p, WATERMARK: 0, PTIME: 0} for p in ("main", "side")]
        if firing is not None:
            pane = PaneInfo(firing == 0, False, PaneInfoTiming.EARLY, firing, -1)
            fired = WindowedValue(100.0 * (firing + 1), Timestamp(0), [GlobalWindow()], pane)
            rows.append({ELEMENT: pack(side.encode_nested(fired)), PORT: 1})
        element = main.encode_nested(
            WindowedValue(("k", float(at)), Timestamp(at), [GlobalWindow()])
        )
        rows.append({ELEMENT: pack(_framed([element])), PORT: FRAMED_RUN})
        shard = side_inputs.SideInputShard(spec, NO_SINKS, store)
        value, _ = shard.run_encoded(topology, node, 0, value, rows)
    assert _READ == [(1.0, 100.0), (2.0, 200.0), (3.0, 200.0)]
