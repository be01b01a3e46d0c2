"""Waiting main elements of a streaming stage with side inputs, without Spark."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import pytest
from apache_beam.coders import coders
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import (
    PANE_INFO_UNKNOWN,
    PaneInfo,
    PaneInfoTiming,
    WindowedValue,
)

from beam_spark_runner.beam_internals import WindowedHeaders
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from tests.list_states import ListState

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip(
        "streaming runs need PySpark 3.5+; this is older",
        allow_module_level=True,
    )

from beam_spark_runner.streaming import side_inputs  # noqa: E402
from beam_spark_runner.streaming.watermarks import Marker, WatermarkState  # noqa: E402

SECOND = 1_000_000


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


def _coders(headers: bool = True) -> side_inputs._Coders:
    """The stage's coders for elements in interval windows, one side input mapped 1:1.

    ``headers=False``: as for a windowed coder whose header cannot be read apart.
    """
    made = side_inputs._Coders.__new__(side_inputs._Coders)
    coder = coders.WindowedValueCoder(coders.PickleCoder(), coders.IntervalWindowCoder())
    made.input_impl = coder.get_impl()
    made.headers = WindowedHeaders.of(coder) if headers else None
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
    store: side_inputs.WaitingStore = (
        MemoryWaitingStore()
        if store_kind == "memory"
        else side_inputs.ListStateWaitingStore(list_state)
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
