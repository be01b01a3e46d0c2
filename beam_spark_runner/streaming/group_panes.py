"""GroupByKey in a streaming run: Beam's trigger driver over one shard's keys, per micro-batch.

Each micro-batch a GroupByKey shard (``GroupShard``, on ``shard_run``'s skeleton) runs each
key's new elements through Beam's streaming ``GeneralTriggerDriver`` (under the default
trigger, the runner's equivalent: ``execution.default_trigger``, ``execution.session_trigger``)
against its *previous* input watermark, so late data is dropped where Beam drops it; advances
the watermark from the markers and processing time; fires the timers due, key by key in
timestamp order (processing-time ones too once the input is at +inf); forgets expired
windows and empty keys; and emits the panes and its output watermark, the minimum of the
input watermark and its keys' earliest hold. How the keys are kept between batches:
``grouping``. Under the default trigger a window waits for its on-time pane in the shard's
chunk store, and values of keys the shard does not hold go there without a key state
(``StreamingGrouper.take_fresh``).
"""

from __future__ import annotations

import collections
import pickle
from collections.abc import Generator, Iterable, Iterator
from typing import Any

from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import gc_pause
from beam_spark_runner.execution.count_trigger import CountDriver
from beam_spark_runner.execution.count_trigger import applies as count_applies
from beam_spark_runner.execution.default_trigger import (
    DefaultTriggerDriver,
    DefaultTriggerState,
    WindowPanes,
    add_hold,
    end_of,
    window_of,
    window_token,
)
from beam_spark_runner.execution.default_trigger import applies as default_trigger_applies
from beam_spark_runner.execution.grouping import GroupSpec
from beam_spark_runner.execution.session_trigger import SessionsDriver
from beam_spark_runner.execution.session_trigger import applies as sessions_applies
from beam_spark_runner.streaming.chunk_lists import ChunkStore
from beam_spark_runner.streaming.grouping import (
    ALWAYS,
    KeyState,
    ShardState,
    decode_shard_state,
    dumps,
    encode_shard_state,
    release_shard_state,
    replay_changes,
    shard_changes,
)
from beam_spark_runner.streaming.rows import (
    ELEMENT,
    KEY,
    KEYED_RUN,
    PORT,
    Row,
    cell,
    keyed_run_elements,
    marker_of,
    output_rows,
)
from beam_spark_runner.streaming.shard_run import ShardRun
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, Marker, WatermarkState

# A pane fired: the key's bytes, the key, the pane.
Fired = tuple[bytes, Any, Any]
# A key's values of one window waiting for its on-time pane, as a chunk holds them: the
# key's bytes, the key, the values, their holds (micros).
Entry = tuple[bytes, Any, list[Any], list[int]]


class FreshWindows:
    """A batch's new values of windows before their end, of keys the shard does not hold.

    ``StreamingGrouper.take_fresh`` fills it; ``unbuffer`` fires the windows the new
    watermark reached, ``buffer`` writes the others to the chunk store.
    """

    def __init__(self) -> None:
        # Per window's tag (``_window_tag``), its keys' entries in the order they came.
        self.windows: dict[bytes, list[Entry]] = {}
        # Per window's tag, its end and the earliest hold of its entries (micros).
        self.ends: dict[bytes, tuple[int, int]] = {}
        self._tags: dict[Any, tuple[bytes, int]] = {}

    def __bool__(self) -> bool:
        return bool(self.windows)

    def add(
        self, tag: bytes, end: int, hold: int | None, entry: tuple[bytes, Any, list[Any]]
    ) -> None:
        """A key's (key bytes, key, values) of the window of ``tag``, with their hold."""
        holds = [] if hold is None else [hold]
        entries = self.windows.get(tag)
        if entries is None:
            self.windows[tag] = [(*entry, holds)]
            self.ends[tag] = (end, MAX_MICROS if hold is None else hold)
        else:
            entries.append((*entry, holds))
            if hold is not None and hold < self.ends[tag][1]:
                self.ends[tag] = (end, hold)

    def window(self, token: Any, window: Any) -> tuple[bytes, int]:
        """The tag (``_window_tag``) and end (micros) of ``window``, of token ``token``."""
        known = self._tags.get(token)
        if known is None:
            known = self._tags[token] = (_window_tag(window), end_of(window))
        return known


class _Clock:
    """The runner's processing time for Beam's trigger contexts (seconds, as ``time()``)."""

    def __init__(self, micros: int) -> None:
        self.micros = micros

    def time(self) -> float:
        return self.micros / 1e6


class StreamingGrouper:
    """One GroupByKey's coders and trigger driver, built once per worker process.

    Under the default trigger the driver is the runner's (the same panes, a fraction of the
    Python): ``DefaultTriggerDriver`` over non-merging windows, ``SessionsDriver`` over
    Beam's ``Sessions``, and under ``Repeatedly(AfterCount(n))`` over non-merging windows
    ``CountDriver``; otherwise it is Beam's ``GeneralTriggerDriver``. ``beam_driver``
    forces Beam's (tests compare them).
    """

    def __init__(self, spec: GroupSpec, beam_driver: bool = False) -> None:
        spec.environment.enter()
        context = bi.PipelineContext(bi.beam_runner_api_pb2.Components.FromString(spec.components))
        self.name = spec.name
        self.pre_impl = context.coders[spec.pre_grouping_coder_id].get_impl()
        self.post_impl = context.coders[spec.post_grouping_coder_id].get_impl()
        self.windowing = context.windowing_strategies[spec.windowing_strategy_id]
        self.clock = _Clock(0)
        self.driver = bi.create_trigger_driver(self.windowing, clock=self.clock)
        # The runner's own driver (``SessionsDriver`` and ``CountDriver`` are
        # ``DefaultTriggerDriver``s, their states ``DefaultTriggerState``s), where it takes
        # the windowing.
        self.default: DefaultTriggerDriver | None = None
        if not beam_driver and default_trigger_applies(self.windowing):
            self.default = DefaultTriggerDriver(self.windowing)
        elif not beam_driver and sessions_applies(self.windowing):
            self.default = SessionsDriver(self.windowing)
        elif not beam_driver and count_applies(self.windowing):
            self.default = CountDriver(self.windowing)
        self.allowed_lateness = self.windowing.allowed_lateness
        # Whether values wait in the shard's chunk store (``process``): under the
        # default-trigger driver over windows that do not merge (sessions merge: theirs
        # stay in the keys' states).
        self.buffers = type(self.default) is DefaultTriggerDriver

    def process(
        self,
        shard: ShardState,
        elements: dict[bytes, list[bytes]],
        markers: list[Marker],
        chunks: ChunkStore | None = None,
    ) -> Iterator[Fired]:
        """Runs one micro-batch of a shard; yields (key bytes, key, pane) per pane fired.

        With ``chunks``, under the runner's default-trigger driver, a window that has not
        had its on-time pane waits there, not in its keys' states: at the end of each
        batch its keys' values and holds of that batch go into one chunk (``buffer``),
        and the batch whose input watermark reaches its end reads them back before it
        fires (``unbuffer``). Until then the shard's value holds only the window's end
        and earliest hold; a key with nothing else is not in it at all, and its values
        reach the chunk without a key state (``take_fresh``).
        """
        run = GroupShard(self, chunks)
        run.elements = elements
        yield from run.step(shard, markers)

    def unbuffer(
        self, shard: ShardState, chunks: ChunkStore, fresh: FreshWindows | None = None
    ) -> list[Fired]:
        """Puts every buffered window the input watermark reached back into its keys.

        Such a window's on-time pane fires in this batch. A key's values from the chunks
        go before those it got in this batch (``fresh``'s, or its state's), which came
        later (a pane's values stay in arrival order), and its holds join them; a key the
        shard no longer holds comes back, after the keys it holds. Except where the key
        is not in the shard and the window expires at this watermark (Beam's driver would
        fire it, then forget it and the key in this batch): its on-time pane is returned
        at once, the key left out of the shard. Windows go in the order of their ends, so
        a key's panes do too.
        """
        watermark = shard.watermarks.input_watermark
        ends = dict(shard.buffered)
        if fresh is not None:
            ends.update(fresh.ends)
        due = [tag for tag, (end, _) in ends.items() if end <= watermark]
        due.sort(key=lambda tag: ends[tag][0])
        if not due:
            return []
        stored = {tag for tag in due if tag in shard.buffered}
        taken = chunks.take(stored) if stored else {}
        # (window token, key bytes) -> [key, values, holds], in the order they came.
        earlier: dict[tuple[Any, bytes], list[Any]] = {}
        for tag in due:
            token = pickle.loads(tag)
            entries = [entry for chunk in taken.get(tag, ()) for entry in pickle.loads(chunk)]
            if fresh is not None:
                entries.extend(fresh.windows.pop(tag, ()))
                fresh.ends.pop(tag, None)
            for key_bytes, key, values, holds in entries:
                entry = earlier.get((token, key_bytes))
                if entry is None:
                    earlier[(token, key_bytes)] = [key, values, holds]
                else:
                    entry[1].extend(values)
                    entry[2].extend(holds)
        fired: list[Fired] = []
        default = self.default
        assert default is not None, f"GroupByKey '{self.name}' buffers without its driver"
        lateness = self.allowed_lateness.micros
        for (token, key_bytes), (key, values, holds) in earlier.items():
            window = window_of(token)
            if key_bytes not in shard.blobs and end_of(window) + lateness < watermark:
                fired.append((key_bytes, key, default.first_pane(window, values, holds)))
                continue
            key_state = shard.key_state(key_bytes)
            if key_state is None:
                key_state = KeyState(key, DefaultTriggerState())
                shard.add(key_bytes, key_state)
            panes = key_state.state.get(window)
            if panes is None:
                # Never fired (it would not wait in the store): no pane counted yet.
                panes = key_state.state[window] = WindowPanes(timer=True)
            panes.values[:0] = values
            for hold in holds:
                add_hold(panes.holds, hold)
        for tag in stored:
            del shard.buffered[tag]
        return fired

    def take_fresh(
        self,
        fresh: FreshWindows,
        key_bytes: bytes,
        values: list[WindowedValue],
        input_micros: int,
        floor: int,
    ) -> bool:
        """Buffers a key's new elements without its state, if every window is before its end.

        For a key the shard does not hold, whose elements' windows the input watermark has
        not reached (no pane yet, none late), the driver would only add them and their
        holds to a new state that ``buffer`` then moves to the chunk store whole: they go
        to ``fresh`` instead, as ``buffer`` would write them. False (nothing taken) if a
        window is at or behind the watermark.
        """
        default = self.default
        assert default is not None, f"GroupByKey '{self.name}' buffers without its driver"
        if len(values) == 1 and len(values[0].windows) == 1:  # most keys of a batch
            (window,) = values[0].windows
            tag, end = fresh.window(window_token(window), window)
            if end <= input_micros:
                return False
            hold = default.window_hold(window, values, floor)
            fresh.add(tag, end, hold, (key_bytes, values[0].value[0], [values[0].value[1]]))
            return True
        by_window: dict[Any, list[WindowedValue]] = {}
        windows: dict[Any, Any] = {}
        for wv in values:
            for window in wv.windows:
                # By its token: hashing an IntervalWindow reads two Timestamp properties.
                token = window_token(window)
                elements = by_window.get(token)
                if elements is None:
                    by_window[token] = [wv]
                    windows[token] = window
                else:
                    elements.append(wv)
        known = [fresh.window(token, windows[token]) for token in by_window]
        if any(end <= input_micros for _, end in known):
            return False
        key = values[0].value[0]
        for (tag, end), (token, elements) in zip(known, by_window.items(), strict=True):
            hold = default.window_hold(windows[token], elements, floor)
            fresh.add(tag, end, hold, (key_bytes, key, [wv.value[1] for wv in elements]))
        return True

    def buffer(
        self, shard: ShardState, chunks: ChunkStore, fresh: FreshWindows | None = None
    ) -> None:
        """Moves the windows still before their end out of this batch's keys, to ``chunks``.

        One chunk per window: (key bytes, key, values, holds) of each key it has in this
        batch, in the order of the shard's keys. Those windows' end-of-window timers are
        set (the watermark has not reached them), none has fired (a window that has keeps
        its values in its key's state, for late panes of the accumulating mode), so a
        key's window is its values and holds alone. A key left with no window leaves the
        shard's value. The ``fresh`` windows' entries (``take_fresh``) go first.
        """
        new: dict[bytes, list[Entry]] = {}
        ends: dict[bytes, tuple[int, int]] = {}
        tags: dict[Any, bytes] = {}
        if fresh is not None:
            new.update(fresh.windows)
            for fresh_tag, (end, hold) in fresh.ends.items():
                before = shard.buffered.get(fresh_tag)
                ends[fresh_tag] = (end, hold if before is None else min(hold, before[1]))
        emptied = []
        for key_bytes, key_state in shard.keys.items():
            state = key_state.state
            if type(state) is not DefaultTriggerState:
                continue
            pending = [window for window, panes in state.items() if panes.timer]
            for window in pending:
                panes = state.pop(window)
                tag = tags.get(window)
                if tag is None:
                    tag = tags[window] = _window_tag(window)
                entry = (key_bytes, key_state.key, panes.values, panes.holds)
                new.setdefault(tag, []).append(entry)
                end, hold = ends.get(tag) or shard.buffered.get(tag) or (end_of(window), MAX_MICROS)
                ends[tag] = (end, min([hold, *panes.holds]))
            if pending and not state:
                emptied.append(key_bytes)
        for key_bytes in emptied:
            shard.remove(key_bytes)
        if new:
            chunks.append([(tag, dumps(entries)) for tag, entries in new.items()])
            shard.buffered.update(ends)

    def driver_of(self, key_state: KeyState) -> Any:
        """The driver of a key's state.

        A key whose state Beam's driver wrote (a checkpoint of an earlier runner version)
        stays with Beam's driver; new keys get the default one.
        """
        if isinstance(key_state.state, DefaultTriggerState):
            assert self.default is not None, "default-trigger state under another trigger"
            return self.default
        return self.driver

    def collect_garbage(self, shard: ShardState) -> None:
        """Drops windows whose input can only be dropped as late, and keys left empty."""
        watermark = Timestamp(micros=shard.watermarks.input_watermark)
        lateness = self.allowed_lateness

        def expired(window: Any) -> bool:
            return bool(window.end + lateness < watermark)

        at, micros = shard.watermarks.input_watermark, lateness.micros
        for key_bytes, key_state in list(shard.keys.items()):
            state = key_state.state
            if isinstance(state, DefaultTriggerState):
                self.driver_of(key_state).forget_expired(state, at, micros)
                if not state:
                    shard.remove(key_bytes)
                continue
            bi.forget_expired_windows(state, expired)
            if bi.trigger_state_is_empty(state):
                shard.remove(key_bytes)

    def settle(self, shard: ShardState) -> None:
        """Records each decoded key's next visit and earliest hold."""
        lateness = self.allowed_lateness.micros
        for key_bytes, key_state in shard.keys.items():
            state = key_state.state
            if isinstance(state, DefaultTriggerState):
                driver = self.driver_of(key_state)
                shard.set_visit(key_bytes, driver.next_visit(state, lateness))
                hold = driver.earliest_hold(state)
            else:
                due = bi.trigger_state_next_work(state, lateness)
                shard.set_visit(key_bytes, ALWAYS if due is None else min(due, MAX_MICROS))
                hold = state.get_earliest_hold().micros
            shard.set_hold(key_bytes, hold if hold < MAX_MICROS else None)  # Beam's MAX_TIMESTAMP

    def hold(self, shard: ShardState) -> int:
        """The earliest watermark hold of the shard's keys (microseconds).

        A buffered window's holds as its keys' would be (Beam's earliest hold is a
        microsecond before the earliest element hold).
        """
        held = shard.earliest_hold(MAX_MICROS)
        if shard.buffered:
            earliest = min(hold for _, hold in shard.buffered.values())
            if earliest < MAX_MICROS:
                held = min(held, earliest - 1)
        return held

    def encode(self, key: Any, pane: Any) -> bytes:
        """A pane as the GroupByKey's output element: ``KV<K, Iterable<V>>``."""
        return self.post_impl.encode_nested(pane.with_value((key, pane.value)))  # type: ignore[no-any-return]


class GroupShard(ShardRun[ShardState, Fired]):
    """One micro-batch of one GroupByKey shard.

    ``chunks``: the shard's chunk store, where values wait for their window's on-time
    pane (without one they stay in the shard's state value).
    """

    def __init__(self, grouper: StreamingGrouper, chunks: ChunkStore | None = None) -> None:
        self.grouper = grouper
        self.chunks = chunks
        self.elements: dict[bytes, list[bytes]] = {}
        # New values of keys the shard does not hold, for windows before their end: they
        # skip the keys' states (``StreamingGrouper.take_fresh``). Where values buffer.
        self.fresh = FreshWindows() if chunks is not None and grouper.buffers else None
        # The keys under Beam's driver, whose timers fire round by round.
        self.beams: list[tuple[bytes, KeyState]] = []

    def new_state(self, watermarks: WatermarkState) -> ShardState:
        return ShardState(watermarks)

    def decode(self, data: bytes) -> ShardState:
        return decode_shard_state(data)

    def encode(self, state: ShardState) -> bytes:
        return encode_shard_state(state)

    def release(self, state: ShardState) -> None:
        release_shard_state(state)

    def changes(self, state: ShardState) -> bytes:
        """The batch's changes, for ``state_cache``'s log."""
        return shard_changes(state)

    def replay(self, state: ShardState, changes: bytes) -> None:
        """A batch's changes applied (``state_cache``'s reload)."""
        replay_changes(state, changes)

    def storing(self) -> Any:
        """The collector paused: keys' states are decoded, kept and encoded (no user code)."""
        return gc_pause.paused()

    def read(self, node: Node, state: ShardState, rows: Iterable[Any]) -> list[Marker]:
        """The elements by key (a keyed run's or a keyed row's)."""
        elements: dict[bytes, list[bytes]] = collections.defaultdict(list)
        markers = []
        for row in rows:
            if row[ELEMENT] is None:
                markers.append(marker_of(row))
            elif row[PORT] == KEYED_RUN:
                for key, element in keyed_run_elements(cell(row[ELEMENT])):
                    elements[key].append(element)
            else:
                elements[bytes(row[KEY])].append(cell(row[ELEMENT]))
        self.elements = elements
        return markers

    def before_watermark(self, state: ShardState, markers: list[Marker]) -> Iterator[Fired]:
        """Each key's new elements through its driver, at the batch's processing time."""
        grouper, watermarks = self.grouper, state.watermarks
        watermarks.processing_time = max(
            [watermarks.processing_time, *(m.processing_time for m in markers)]
        )
        grouper.clock.micros = watermarks.processing_time
        input_watermark = Timestamp(micros=watermarks.input_watermark)
        output_watermark = Timestamp(micros=watermarks.output_watermark)
        default = grouper.default
        fresh, blobs = self.fresh, state.blobs
        input_micros, floor = watermarks.input_watermark, watermarks.output_watermark
        for key_bytes, values in _decoded(grouper.pre_impl, self.elements):
            if (
                fresh is not None
                and key_bytes not in blobs
                and grouper.take_fresh(fresh, key_bytes, values, input_micros, floor)
            ):
                continue
            key_state = state.key_state(key_bytes)
            if key_state is None:
                new_state = default.new_state() if default else bi.trigger_state()
                key_state = KeyState(values[0].value[0], new_state)
                state.add(key_bytes, key_state)
            panes = grouper.driver_of(key_state).process_elements(
                key_state.state,
                [wv.with_value(wv.value[1]) for wv in values],
                output_watermark,
                input_watermark,
            )
            for pane in panes:
                yield key_bytes, key_state.key, pane

    def after_watermark(self, state: ShardState) -> Iterator[Fired]:
        """The due keys decoded, buffered windows now due back in them; default timers fired.

        The runner's driver's firings never set timers: its keys fire in one round, here.
        """
        grouper = self.grouper
        grouper.clock.micros = state.watermarks.processing_time
        state.load_due(state.watermarks.input_watermark)
        if state.buffered or self.fresh:
            assert self.chunks is not None, (
                f"GroupByKey '{grouper.name}' has windows in a chunk store"
            )
            yield from grouper.unbuffer(state, self.chunks, self.fresh)
        watermark = Timestamp(micros=state.watermarks.input_watermark)
        for key_bytes, key_state in state.loaded():
            if isinstance(key_state.state, DefaultTriggerState):
                for pane in grouper.driver_of(key_state).fire_timers(key_state.state, watermark):
                    yield key_bytes, key_state.key, pane
            else:
                self.beams.append((key_bytes, key_state))

    def timer_round(
        self, state: ShardState, watermark: Timestamp, now: Timestamp
    ) -> Generator[Fired, None, bool]:
        """One round of Beam's driver's timers, key by key, each key's in timestamp order."""
        fired = False
        driver = self.grouper.driver
        for key_bytes, key_state in self.beams:
            expired, _ = key_state.state.get_timers(
                clear=True, watermark=watermark, processing_time=now
            )
            for window, (name, domain, timestamp, _tag) in sorted(
                expired, key=lambda timer: timer[1][2]
            ):
                fired = True
                for pane in driver.process_timer(
                    window, name, domain, timestamp, key_state.state, watermark
                ):
                    yield key_bytes, key_state.key, pane
        return fired

    def timers_keep_coming(self, rounds: int) -> Exception:
        return RuntimeError(
            f"GroupByKey '{self.grouper.name}' fired timers {rounds} rounds in one "
            "micro-batch and they keep coming: its trigger re-arms itself at or before the "
            "current time. Check the windowing's trigger."
        )

    def finish(self, state: ShardState) -> None:
        """Expired windows forgotten, windows before their end buffered, keys settled."""
        grouper = self.grouper
        grouper.collect_garbage(state)
        if self.chunks is not None and grouper.buffers:
            grouper.buffer(state, self.chunks, self.fresh)
        grouper.settle(state)

    def hold(self, state: ShardState) -> int:
        return self.grouper.hold(state)

    def capture(self, output: Fired) -> tuple[bytes, bytes]:
        """The pane encoded now: Beam's driver goes on filling the list a pane holds."""
        key_bytes, key, pane = output
        return key_bytes, self.grouper.encode(key, pane)

    def rows(self, topology: Topology, node: Node, outputs: list[Any]) -> list[Row]:
        """The panes to the GroupByKey's readers, their grouping key along (readers shard by it)."""
        out: list[Row] = []
        for key_bytes, encoded in outputs:
            out.extend(output_rows(topology, node, 0, key_bytes, encoded))
        return out


_GROUPERS: collections.OrderedDict[str, StreamingGrouper] = collections.OrderedDict()
_MAX_CACHED = 64


def streaming_grouper(spec: GroupSpec) -> StreamingGrouper:
    """The grouper of ``spec`` in this process."""
    grouper = _GROUPERS.get(spec.cache_key)
    if grouper is None:
        grouper = StreamingGrouper(spec)
        _GROUPERS[spec.cache_key] = grouper
        while len(_GROUPERS) > _MAX_CACHED:
            _GROUPERS.popitem(last=False)
    spec.environment.enter()
    return grouper


def _decoded(impl: Any, elements: dict[bytes, list[bytes]]) -> Iterator[tuple[bytes, list[Any]]]:
    """Each key's elements decoded by ``impl``, from one stream over all of them.

    A stream and a generator per key (``decode_all``) cost more than a key's one element.
    """
    data = b"".join([cell for cells in elements.values() for cell in cells])
    stream = bi.create_InputStream(data)
    decode = impl.decode_from_stream
    left = len(data)
    for key_bytes, cells in elements.items():
        left -= sum(map(len, cells))
        values = []
        while stream.size() > left:
            values.append(decode(stream, True))
        yield key_bytes, values


def _window_tag(window: Any) -> bytes:
    """A window as the tag of its chunks: its ``window_token``, pickled."""
    return pickle.dumps(window_token(window), protocol=pickle.HIGHEST_PROTOCOL)
