"""A shard's side-input view kept across batches serves what a rebuild would, without Spark.

The view follows its state's changes (a batch's, another worker's replayed, windows
forgotten); whatever it serves must equal Beam's grouping (``WindowGroupingBuffer``, via
``side_input_state_entries``) over the elements the state holds, and a view built afresh.
"""

from __future__ import annotations

import copy
import pickle
import random
import uuid
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger
from apache_beam.transforms import window as windows_
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
from beam_spark_runner.execution.side_inputs import side_input_state_entries
from beam_spark_runner.execution.stage_worker import NO_SINKS
from beam_spark_runner.planning import build_plan
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from tests.stage_specs import stage_spec

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip("streaming runs need PySpark 3.5+; this is older", allow_module_level=True)

from beam_spark_runner.streaming import side_input_view, side_inputs, state_cache  # noqa: E402
from beam_spark_runner.streaming.compression import pack  # noqa: E402
from beam_spark_runner.streaming.query import side_input_specs  # noqa: E402
from beam_spark_runner.streaming.rows import (  # noqa: E402
    ELEMENT,
    FRAMED_RUN,
    PORT,
    PRODUCER,
    PTIME,
    WATERMARK,
)
from beam_spark_runner.streaming.side_input_state import SideInputShardState  # noqa: E402
from beam_spark_runner.streaming.side_input_view import SideInputView  # noqa: E402
from beam_spark_runner.streaming.side_inputs import SideInputShard  # noqa: E402
from beam_spark_runner.streaming.topology import STAGE, Node, Topology  # noqa: E402
from beam_spark_runner.streaming.watermarks import WatermarkState  # noqa: E402
from tests.streaming import test_side_inputs as side_tests  # noqa: E402
from tests.streaming.memory_state import MemoryList as _List  # noqa: E402
from tests.streaming.memory_state import MemoryValue as _Value  # noqa: E402
from tests.streaming.test_side_inputs import MemoryWaitingStore  # noqa: E402

_ITERABLE = bi.common_urns.side_inputs.ITERABLE.urn
_MULTIMAP = bi.common_urns.side_inputs.MULTIMAP.urn
_GLOBAL_END = GlobalWindow().max_timestamp().micros
_KEYS = ["a", "b", "c", "d", "e"]
StateKey = bi.beam_fn_api_pb2.StateKey


class _Sides:
    """Two side inputs: a multimap of str keys and an iterable, in global or interval windows."""

    def __init__(self, global_window: bool) -> None:
        self.global_window = global_window
        window_coder = coders.GlobalWindowCoder() if global_window else coders.IntervalWindowCoder()
        kv = coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()])
        self.coders = [
            coders.WindowedValueCoder(kv, window_coder),
            coders.WindowedValueCoder(coders.VarIntCoder(), window_coder),
        ]
        self.specs = [
            ("t", "multi", _MULTIMAP, self.coders[0]),
            ("t", "iter", _ITERABLE, self.coders[1]),
        ]
        # What ``SideInputShardState.add_side`` reads: per side input its coders' impls.
        self.side_impls = [
            (c.get_impl(), c.window_coder.get_impl(), key)
            for c, key in zip(self.coders, [coders.StrUtf8Coder().get_impl(), None], strict=True)
        ]
        self.windows: set[bytes] = set()

    def elements(self, draw: random.Random, number: int) -> bytes:
        """A few random elements of side input ``number``: plain, or of a firing."""
        impl = self.side_impls[number][0]
        index = draw.choice([None, 0, 1, 2])
        pane = (
            PANE_INFO_UNKNOWN
            if index is None
            else PaneInfo(index == 0, False, PaneInfoTiming.EARLY, index, -1)
        )
        out = []
        for _ in range(draw.randrange(1, 4)):
            value: Any = draw.randrange(100)
            if number == 0:
                value = (draw.choice(_KEYS), value)
            if self.global_window:
                windows: list[Any] = [GlobalWindow()]
            else:
                # Sliding-like: an element in one or two overlapping windows.
                start = draw.randrange(8) * 5
                windows = [IntervalWindow(start, start + 10)]
                if draw.random() < 0.5:
                    windows.append(IntervalWindow(start + 5, start + 15))
            for w in windows:
                self.windows.add(self.coders[number].window_coder.encode(w))
            out.append(impl.encode_nested(WindowedValue(value, Timestamp(1), tuple(windows), pane)))
        return b"".join(out)

    def view(self, state: SideInputShardState) -> SideInputView:
        return SideInputView("stage", self.specs).built_from(state.sides, state.ends, state.fired)

    def state_keys(self) -> list[Any]:
        """Every state key a bundle could ask for, of windows and keys seen, and wrong ones."""
        keys = []
        for window in sorted(self.windows):
            for field, kind, side in (
                ("iterable_side_input", StateKey.IterableSideInput, "iter"),
                ("iterable_side_input", StateKey.IterableSideInput, "multi"),
                ("multimap_keys_side_input", StateKey.MultimapKeysSideInput, "multi"),
                (
                    "multimap_keys_values_side_input",
                    StateKey.MultimapKeysValuesSideInput,
                    "multi",
                ),
            ):
                request = kind(transform_id="t", side_input_id=side, window=window)
                keys.append(StateKey(**{field: request}))
            for key in [*_KEYS, "z"]:
                encoded = coders.StrUtf8Coder().get_impl().encode_nested(key)
                keys.append(
                    StateKey(
                        multimap_side_input=StateKey.MultimapSideInput(
                            transform_id="t", side_input_id="multi", window=window, key=encoded
                        )
                    )
                )
        return keys

    def beams(self, state: SideInputShardState) -> Any:
        """Beam's servicer over the elements ``state`` holds, grouped as FnApiRunner does."""
        servicer = bi.StateServicer()
        for number, (transform, tag, urn, coder) in enumerate(self.specs):
            for key, data in side_input_state_entries(
                transform, tag, urn, state.side_elements(number), coder
            ):
                servicer.append_raw(StateKey.FromString(key), data)
        return servicer

    def check(self, state: SideInputShardState) -> None:
        """The view ``state`` carries serves what Beam's grouping and a new view serve."""
        view = state.view
        assert view is not None
        assert view.follows(state.sides, state.fired)
        # The windows with a firing, kept with the state as the view is.
        assert state.fired_ends() == [frozenset(e[1] for e in f.values()) for f in state.fired]
        beams, fresh = self.beams(state), self.view(state)
        for key in self.state_keys():
            served = view.get_raw(key)[0]
            assert served == beams.get_raw(key)[0], key
            assert served == fresh.get_raw(key)[0], key


def _batch(sides: _Sides, state: SideInputShardState, draw: random.Random) -> tuple[Any, ...]:
    """Random side elements and forgotten windows; what the batch changed."""
    state.begin_batch()
    for _ in range(draw.randrange(4)):
        number = draw.randrange(2)
        state.add_side(number, sides.elements(draw, number), sides)
    if draw.random() < 0.3:
        horizon = draw.choice([0, 10, 25, 40]) * 1_000_000
        if sides.global_window and draw.random() < 0.3:
            horizon = _GLOBAL_END + 1
        state.forget([horizon, horizon])
    return state.changes()


def _new_state() -> SideInputShardState:
    return SideInputShardState(WatermarkState(expected=frozenset({"side"})), [[], []])


@pytest.mark.parametrize("global_window", [True, False])
def test_a_view_following_its_state_serves_what_a_rebuild_would(global_window: bool) -> None:
    """One worker's batches, then workers alternating a shard, then a restart."""
    sides = _Sides(global_window)
    draw = random.Random(63 + global_window)
    state = _new_state()
    state.follow(sides.view(state))
    for _ in range(60):
        _batch(sides, state, draw)
        sides.check(state)
    # Three workers take the shard's batches in turn, each catching up on the changes it
    # missed (``state_cache``'s replay) on the state and view it kept.
    workers = [copy.deepcopy(state) for _ in range(3)]
    for worker in workers:
        assert worker.view is None  # a copy (as a pickle) carries no view: one is built
        worker.follow(sides.view(worker))
    missed: list[list[Any]] = [[] for _ in workers]
    for turn in range(90):
        worker = workers[turn % 3]
        for change in missed[turn % 3]:
            worker.replay(pickle.loads(pickle.dumps(change)))
        missed[turn % 3] = []
        sides.check(worker)
        change = _batch(sides, worker, draw)
        sides.check(worker)
        for other in range(3):
            if other != turn % 3:
                missed[other].append(change)
    # A restart: the state read back from its encoding, its view built from it.
    restarted = SideInputShardState.decode(workers[89 % 3].encode())
    assert restarted.view is None
    restarted.follow(sides.view(restarted))
    sides.check(restarted)


def test_a_view_is_dropped_where_the_state_is_replaced_and_not_pickled() -> None:
    sides = _Sides(True)
    state = _new_state()
    state.follow(sides.view(state))
    state.add_side(0, sides.elements(random.Random(1), 0), sides)
    assert b"_view" not in pickle.dumps(state)
    assert "_view" not in SideInputShardState.decode(state.encode()).__dict__


def test_side_windows_expiring_leave_the_view_as_they_leave_the_state() -> None:
    sides = _Sides(False)
    state = _new_state()
    state.follow(sides.view(state))
    impl = sides.side_impls[1][0]
    for start in range(0, 50, 10):
        element = WindowedValue(start, Timestamp(start), (IntervalWindow(start, start + 10),))
        state.add_side(1, impl.encode_nested(element), sides)
    state.forget([0, Timestamp(30).micros])
    window = coders.IntervalWindowCoder().encode(IntervalWindow(10, 20))
    key = StateKey(
        iterable_side_input=StateKey.IterableSideInput(
            transform_id="t", side_input_id="iter", window=window
        )
    )
    assert state.view is not None
    assert state.view.get_raw(key)[0] == b""
    kept = coders.IntervalWindowCoder().encode(IntervalWindow(30, 40))
    key.iterable_side_input.window = kept
    assert state.view.get_raw(key)[0] == coders.VarIntCoder().get_impl().encode_nested(30)
    assert len(state.view.sides[1].chunks) == 2


def test_a_token_names_the_contents() -> None:
    """The SDK caches side inputs by token: a change makes a new one, a new view another."""
    sides = _Sides(True)
    state = _new_state()
    state.follow(sides.view(state))
    view = state.view
    assert view is not None
    before = view.token
    state.add_side(1, sides.elements(random.Random(2), 1), sides)
    assert view.token != before
    assert sides.view(state).token != view.token
    built = side_input_view.STATS.built
    sides.view(state)
    assert side_input_view.STATS.built == built + 1


_LOOKED_UP: list[tuple[str, list[int]]] = []


class _Lookup(beam.DoFn):  # type: ignore[misc]
    """Records each main key with the side values it finds (the pane: Beam's processor runs it)."""

    def process(self, kv: tuple[str, int], side: Any, pane: Any = beam.DoFn.PaneInfoParam) -> Any:
        _LOOKED_UP.append((kv[0], [v for values in side[kv[0]] for v in values]))
        return iter(())


def _multimap_stage() -> tuple[Any, ...]:
    """A stage looking main keys up in a multimap side input fed by a GroupByKey's firings."""
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    ticks = pipeline | PeriodicImpulse(0, 10, 1)
    side = (
        ticks
        | "Side" >> beam.Map(lambda _: ("a", 1))
        | "SideWindow"
        >> beam.WindowInto(
            windows_.GlobalWindows(),
            trigger=trigger.Repeatedly(trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        )
        | beam.GroupByKey()
    )
    _ = (
        ticks
        | "Main" >> beam.Map(lambda _: ("a", 1))
        | "MainWindow" >> beam.WindowInto(windows_.GlobalWindows())
        | beam.ParDo(_Lookup(), beam.pvalue.AsMultiMap(side))
    )
    pipeline.visit(bi.group_by_key_input_visitor(True))
    plan = build_plan(
        pipeline.to_runner_api(default_environment=bi.default_environment()), streaming=True
    )
    (stage,) = [s for s in plan.stages if s.side_inputs]
    spec = side_inputs.SideInputStageSpec(
        stage=stage_spec(plan, stage, "side-input-view"),
        components=plan.components.SerializeToString(),
        input_coder_id=stage.input_coder_id,
        side_inputs=side_input_specs(stage, plan),
    )
    context = bi.PipelineContext(plan.components)
    side_coder = plan.data_channel_coders[stage.side_inputs[0].pcollection_id]
    return (
        spec,
        context.coders[stage.input_coder_id].get_impl(),
        context.coders[side_coder].get_impl(),
    )


def test_a_multimap_read_in_beams_processor_follows_firings_across_workers(
    monkeypatch: Any,
) -> None:
    """Workers alternating a shard look keys up in the latest firing, key by key."""
    # Changes kept in the header, however small the state: a worker catches up on them.
    monkeypatch.setattr(state_cache, "COMPACT_FRACTION", 100.0)
    monkeypatch.setattr(state_cache, "RECENT_SHARE", 100.0)
    spec, main, side = _multimap_stage()
    node = Node(
        index=0,
        name=spec.stage.name,
        kind=STAGE,
        stateful=True,
        step=1,
        targets=tuple(() for _ in spec.stage.outputs),
        expected=frozenset({"main", "side"}),
        main_expected=frozenset({"main"}),
        side_expected=(frozenset({"side"}),),
    )
    topology = Topology(nodes=(node,), roots={}, levels=1, shards=1, sink_producers=frozenset())
    store = MemoryWaitingStore()
    value, log = _Value(), _List()
    key = (uuid.uuid4().hex, node.index, 0)
    caches: list[Any] = [None, None]

    def batch(turn: int, fired: dict[str, int], index: int, mains: list[str]) -> None:
        pane = PaneInfo(index == 0, False, PaneInfoTiming.EARLY, index, -1)
        at = (GlobalWindow(),)
        rows: list[dict[str, Any]] = [
            {ELEMENT: None, PRODUCER: p, WATERMARK: 0, PTIME: 0} for p in ("main", "side")
        ]
        if fired:
            encoded = b"".join(
                side.encode_nested(WindowedValue((k, [v]), Timestamp(1), at, pane))
                for k, v in fired.items()
            )
            rows.append({ELEMENT: pack(encoded), PORT: 1})
        elements = [main.encode_nested(WindowedValue((k, 1), Timestamp(1), at)) for k in mains]
        rows.append({ELEMENT: pack(side_tests._framed(elements)), PORT: FRAMED_RUN})
        state_cache._CACHE.pop(key, None)
        if caches[turn] is not None:
            state_cache._CACHE[key] = caches[turn]
        shard = SideInputShard(spec, NO_SINKS, store)
        state_cache.run_logged(shard, shard, value, log, key, topology, node, rows)
        caches[turn] = state_cache._CACHE[key]

    _LOOKED_UP.clear()
    listed, built = side_input_view.STATS.listed, side_input_view.STATS.built
    caught_up = state_cache.STATS.caught_up
    batch(0, {"a": 1, "b": 1}, 0, ["a", "b", "c"])
    batch(1, {"a": 2}, 1, ["a", "b"])
    batch(0, {"b": 3}, 2, ["a", "b"])  # caught up on worker 1's batch
    batch(1, {}, 3, ["a", "b", "c"])
    assert _LOOKED_UP == [
        ("a", [1]),
        ("b", [1]),
        ("c", []),
        ("a", [2]),
        ("b", [1]),
        ("a", [2]),
        ("b", [3]),
        ("a", [2]),
        ("b", [3]),
        ("c", []),
    ]
    # A view built once per worker, then caught up with the other's batches.
    assert state_cache.STATS.caught_up == caught_up + 2
    assert side_input_view.STATS.built == built + 2
    # Key by key: no window's every key and value listed (Beam's bulk read).
    assert side_input_view.STATS.listed == listed
