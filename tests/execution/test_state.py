"""The pieces of stateful execution, without Spark: key runs, pending timers, state backend."""

import pickle

import pyarrow as pa
from apache_beam.coders import coders
from apache_beam.transforms import userstate
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.key_runs import complete_key_groups, run_starts
from beam_spark_runner.execution.state import InMemoryStateBackend
from beam_spark_runner.execution.timers import PendingTimers, TimerFamily

EVENT = bi.beam_runner_api_pb2.TimeDomain.EVENT_TIME
PROCESSING = bi.beam_runner_api_pb2.TimeDomain.PROCESSING_TIME
PANE = PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0)


def batch(keys: list[str], elements: list[str]) -> tuple[pa.Array, pa.Array]:
    return (
        pa.array([k.encode() for k in keys], type=pa.binary()),
        pa.array([e.encode() for e in elements], type=pa.binary()),
    )


def test_run_starts() -> None:
    keys, _ = batch(["a", "a", "b", "c", "c"], ["1"] * 5)
    assert run_starts(keys) == [0, 2, 3, 5]
    assert run_starts(pa.array([], type=pa.binary())) == [0]


def test_complete_key_groups_never_split_a_key() -> None:
    batches = [
        batch(["a", "a", "b"], ["a1", "a2", "b1"]),  # b continues in the next batch
        batch(["b", "b"], ["b2", "b3"]),  # all b, still not known to be complete
        batch([], []),
        batch(["b", "c", "d"], ["b4", "c1", "d1"]),
        batch(["e"], ["e1"]),  # d was complete when e started
    ]
    assert list(complete_key_groups(batches)) == [b"a1a2", b"b1b2b3b4c1", b"d1", b"e1"]


def test_complete_key_groups_one_key_only() -> None:
    assert list(complete_key_groups([batch(["k"], ["1"]), batch(["k"], ["2"])])) == [b"12"]
    assert list(complete_key_groups([])) == []


def family(transform: str, name: str, domain: int) -> TimerFamily:
    window_coder = coders.IntervalWindowCoder()
    timer_coder = coders._TimerCoder(coders.StrUtf8Coder(), window_coder)
    return TimerFamily(
        transform, name, domain, timer_coder.get_impl(), coders.StrUtf8Coder().get_impl()
    )


def encode(fam: TimerFamily, *timers: userstate.Timer) -> bytes:
    out = bi.create_OutputStream()
    for timer in timers:
        fam.timer_coder_impl.encode_to_stream(timer, out, True)
    return out.get()


def timer(key: str, at: int, tag: str = "", clear: bool = False) -> userstate.Timer:
    return userstate.Timer(
        user_key=key,
        dynamic_timer_tag=tag,
        windows=(IntervalWindow(0, 1000),),
        clear_bit=clear,
        fire_timestamp=None if clear else Timestamp(at),
        hold_timestamp=None if clear else Timestamp(at),
        paneinfo=None if clear else PANE,
    )


def fired(fam: TimerFamily, encoded: dict[tuple[str, str], bytes]) -> list[tuple[str, int]]:
    data = encoded.get(fam.family_key, b"")
    return sorted(
        (t.user_key, int(t.fire_timestamp.micros // 1_000_000))
        for t in fam.timer_coder_impl.decode_all(data)
    )


def test_pending_timers_fire_each_keys_earliest_first() -> None:
    fam = family("ParDo", "t", EVENT)
    pending = PendingTimers({fam.family_key: fam})
    pending.add_written(
        fam.family_key,
        encode(fam, timer("a", 30, "x"), timer("a", 10, "y"), timer("b", 20, "x")),
    )
    assert len(pending) == 3
    assert fired(fam, pending.next_round()) == [("a", 10), ("b", 20)]
    assert fired(fam, pending.next_round()) == [("a", 30)]
    assert not pending
    assert pending.fired == 3


def test_later_setting_replaces_and_clear_removes() -> None:
    fam = family("ParDo", "t", EVENT)
    pending = PendingTimers({fam.family_key: fam})
    pending.add_written(
        fam.family_key,
        encode(fam, timer("a", 30), timer("a", 5), timer("b", 7), timer("b", 0, clear=True)),
    )
    assert fired(fam, pending.next_round()) == [("a", 5)]
    assert not pending


def test_event_time_timers_fire_before_processing_time_timers_of_a_key() -> None:
    event = family("ParDo", "event", EVENT)
    processing = family("ParDo", "processing", PROCESSING)
    pending = PendingTimers({event.family_key: event, processing.family_key: processing})
    pending.add_written(processing.family_key, encode(processing, timer("a", 1)))
    pending.add_written(event.family_key, encode(event, timer("a", 99)))
    first = pending.next_round()
    assert fired(event, first) == [("a", 99)] and processing.family_key not in first
    assert fired(processing, pending.next_round()) == [("a", 1)]


def test_state_backend_keeps_side_inputs_and_releases_user_state() -> None:
    key = bi.beam_fn_api_pb2.StateKey
    side = key(iterable_side_input=key.IterableSideInput(transform_id="t", side_input_id="s"))
    user = key(bag_user_state=key.BagUserState(transform_id="t", user_state_id="u", key=b"k"))
    backend = InMemoryStateBackend([(side.SerializeToString(), b"side")])
    backend.append_raw(user, b"v1")
    backend.append_raw(user, b"v2")
    assert backend.get_raw(user) == (b"v1v2", None)
    assert backend.user_state_size() == 1
    backend.release_user_state()
    assert backend.get_raw(user) == (b"", None)
    assert backend.get_raw(side) == (b"side", None)
    assert backend.user_state_size() == 0


def test_exported_user_state_survives_the_release_and_the_next_batch() -> None:
    """A streaming shard exports its cells, releases them, and imports them next batch.

    The export hands over the servicer's own value lists (no copy) and leaves the backend
    empty: what it returned must not change when the backend is reused for other keys or
    written to after the next import; cleared cells are left out.
    """
    key = bi.beam_fn_api_pb2.StateKey
    a = key(bag_user_state=key.BagUserState(transform_id="t", user_state_id="u", key=b"a"))
    b = key(bag_user_state=key.BagUserState(transform_id="t", user_state_id="u", key=b"b"))
    backend = InMemoryStateBackend()
    backend.append_raw(a, b"a1")
    backend.append_raw(b, b"b1")
    backend.clear(b)
    exported = backend.export_user_state()
    assert backend.get_raw(a) == (b"", None) and backend.user_state_size() == 0
    assert exported[0] == {a.SerializeToString(): [b"a1"]}
    backend.append_raw(a, b"other task's")  # the backend's servicer is not the exported one
    assert exported[0] == {a.SerializeToString(): [b"a1"]}
    backend.release_user_state()

    kept = pickle.loads(pickle.dumps(exported))  # as the shard's state value travels
    backend.import_user_state(kept)
    assert backend.get_raw(a) == (b"a1", None) and backend.user_state_size() == 1
    backend.append_raw(a, b"a2")
    backend.append_raw(b, b"b2")
    again = backend.export_user_state()
    backend.release_user_state()
    assert again[0] == {a.SerializeToString(): [b"a1", b"a2"], b.SerializeToString(): [b"b2"]}
    assert backend.get_raw(a) == (b"", None)
    backend.import_user_state(None)
    assert backend.get_raw(a) == (b"", None) and backend.user_state_size() == 0


def test_the_backend_tells_the_cells_used_since_the_import_and_keeps_their_dict() -> None:
    """What a streaming shard logs: the cells a batch read, wrote or cleared, not all.

    The export hands back the imported dict itself, without the cells left empty: what it
    costs follows the cells used.
    """
    key = bi.beam_fn_api_pb2.StateKey
    a, b, c, d = (
        key(bag_user_state=key.BagUserState(transform_id="t", user_state_id="u", key=k))
        for k in (b"a", b"b", b"c", b"d")
    )
    backend = InMemoryStateBackend()
    backend.import_user_state(
        pickle.loads(
            pickle.dumps(({a.SerializeToString(): [b"a1"], b.SerializeToString(): [b"b1"]}, {}))
        )
    )
    backend.get_raw(c)  # read, empty
    backend.clear(b)
    backend.append_raw(d, b"d1")
    assert backend.touched_user_state() == {k.SerializeToString() for k in (b, c, d)}
    cells = backend.export_user_state()[0]
    assert cells == {a.SerializeToString(): [b"a1"], d.SerializeToString(): [b"d1"]}
    backend.import_user_state((cells, {}))
    assert backend.touched_user_state() == set()
    backend.append_raw(a, b"a2")
    assert backend.export_user_state()[0] is cells
    assert cells[a.SerializeToString()] == [b"a1", b"a2"]
    ordered = key(
        ordered_list_user_state=key.OrderedListUserState(
            transform_id="t", user_state_id="o", key=b"a"
        )
    )
    backend.import_user_state((cells, {}))
    backend.get_raw(ordered)
    assert backend.touched_user_state() is None  # an ordered list's cells: any may change


def test_state_backed_iterables_live_for_one_bundle() -> None:
    backend = InMemoryStateBackend()
    impl = coders.VarIntCoder().get_impl()
    token = backend.write_iterable([1, 2, 3], impl)
    state_key = bi.beam_fn_api_pb2.StateKey(runner=bi.beam_fn_api_pb2.StateKey.Runner(key=token))
    data, _ = backend.get_raw(state_key)
    assert list(impl.decode_all(data)) == [1, 2, 3]
    assert backend.write_iterable([4], impl) != token
    backend.release_iterables()
    assert backend.get_raw(state_key) == (b"", None)


def test_pack_by_key_gives_one_cell_per_key_holding_its_elements() -> None:
    from beam_spark_runner.execution.key_runs import pack_by_key

    keys, elements = batch(["b", "a", "b", "c", "a"], ["b1", "a1", "b2", "c1", "a2"])
    packed_keys, packed = pack_by_key(keys, elements)
    assert packed_keys.to_pylist() == [b"a", b"b", b"c"]
    assert packed.to_pylist() == [b"a1a2", b"b1b2", b"c1"]  # stable: input order per key
    distinct_keys, distinct = pack_by_key(*batch(["x", "y"], ["1", "2"]))
    assert distinct.to_pylist() == [b"1", b"2"] and distinct_keys.to_pylist() == [b"x", b"y"]
    sliced_keys, sliced = pack_by_key(keys.slice(1), elements.slice(1))
    assert sliced.to_pylist() == [b"a1a2", b"b2", b"c1"]
