"""A lifted combine's precombine on the batched path: Beam's ``PGBKCVOperation`` table.

What the bundle processor builds for ``COMBINE_PER_KEY_PRECOMBINE``, as a DoFn the batched
steps (``execution.batched_steps``) hand a chunk of windowed values at a time; for Beam's
builtin CombineFns in windows, each key's values grouped while the windows stay the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.transforms import combiners, core, window
from apache_beam.utils.windowed_value import WindowedValue
from apache_beam.utils.windowed_value import create as create_windowed_value

from beam_spark_runner import beam_internals as bi


def precombine_dofn(payload: bytes, context: Any, windowing: Any) -> Any:
    """The DoFn the batched path runs for a lifted combine's precombine in a fused stage.

    It is Beam's ``PGBKCVOperation`` (what the bundle processor builds for
    ``COMBINE_PER_KEY_PRECOMBINE``): per bundle, a table from key (and window, outside the
    default windowing) to an accumulator, flushed in part past Beam's key limit, output in
    insertion order when the bundle finishes, with the CombineFn's ``compact`` and Beam's
    timestamps and windows. The batched path calls ``add_all`` with a chunk of windowed
    values (``runner_precombine``); ``process`` does the same for one.
    """
    combine_payload = beam_runner_api_pb2.CombinePayload.FromString(payload)
    combine_fn = core.CombineFn.from_runner_api(combine_payload.combine_fn, context)
    timestamp_combiner = (
        None
        if windowing.timestamp_combiner == window.TimestampCombiner.OUTPUT_AT_EOW
        else window.TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
    )
    # As Beam's operation checks.
    small = isinstance(combine_fn, (combiners.CountCombineFn, combiners.MeanCombineFn)) or (
        bi.callable_combine_fn_function(combine_fn) in (min, max, sum)
    )
    # Grouped: Beam's own classes only, not a subclass that may keep what it is given.
    grouped = type(combine_fn) in (combiners.CountCombineFn, combiners.MeanCombineFn) or (
        type(combine_fn) is core.CallableWrapperCombineFn
        and bi.callable_combine_fn_function(combine_fn) in (min, max, sum)
    )
    return _PrecombineDoFn(
        combine_fn,
        windowing.is_default(),
        timestamp_combiner,
        1000 * 1000 if small else 100 * 1000,
        grouped=grouped,
    )


class _PrecombineDoFn(core.DoFn):  # type: ignore[misc]
    runner_precombine = True

    def __init__(
        self,
        combine_fn: Any,
        default_windowing: bool,
        timestamp_combiner: Any,
        max_keys: int,
        grouped: bool = False,
    ) -> None:
        """A precombine of ``combine_fn``, Beam's table limit ``max_keys``.

        ``grouped``: the CombineFn is one of Beam's builtin ones (``add_inputs`` keeps
        neither the list it is given nor an order but the list's), so elements in windows
        may be grouped per key (``_add_grouped``).
        """
        self._combine_fn = combine_fn
        self._default_windowing = default_windowing
        self._timestamp_combiner = timestamp_combiner
        self._max_keys = max_keys
        # Grouped only where every entry's timestamp is its window's (end of window).
        self._grouped = grouped and not default_windowing and timestamp_combiner is None
        self._group = _KeyGroups(
            type(combine_fn) is combiners.CountCombineFn,
            bi.callable_combine_fn_function(combine_fn) is sum,
        )
        self._compact = (
            None if type(combine_fn).compact is core.CombineFn.compact else combine_fn.compact
        )
        # (window, key) -> [accumulator, timestamp, window]. An IntervalWindow is keyed by
        # its bounds (hashing the window object reads two Timestamp properties).
        self.table: dict[Any, list[Any]] = {}

    def setup(self) -> None:
        self._combine_fn.setup()

    def teardown(self) -> None:
        self._combine_fn.teardown()

    def start_bundle(self) -> None:
        self.table = {}
        self._group = _KeyGroups(self._group.counting, self._group.one_by_one)

    def add_all(self, values: list[Any]) -> list[Any]:
        """Adds a chunk of windowed ``(key, value)``s; returns what a flush output.

        Neighbours of one (window, key) go to the CombineFn's ``add_inputs`` together, in
        their order: Beam defines it as ``add_input`` over each, and a CombineFn may add a
        run faster (a wrapped ``max`` extends its buffer once, not per element). A run of
        one goes to ``add_input``, as Beam's operation adds every element.
        """
        if self._grouped:
            return self._add_grouped(values)
        return self._add_each(values)

    def _add_grouped(self, values: list[Any]) -> list[Any]:
        """``add_all`` for a builtin CombineFn: elements grouped per key, windows alike.

        Elements are grouped per key while their windows stay the same (the next element's
        windows usually equal the last's: a source's elements come in time order, their
        windows from a cache).

        A key's first element of a group finds or makes its entries, one per window, in the
        order Beam's operation makes them; its values wait in a list, added to each entry
        (``add_inputs``, in their order) when the windows change, the list is long, or the
        bundle ends. A new key whose entries might fill the table (Beam's flush) ends the
        group and goes element by element (``_add_each``), so the table's flushes are
        Beam's, with the same accumulators.
        """
        group = self._group
        table = self.table
        max_keys = self._max_keys
        create = self._combine_fn.create_accumulator
        counting = group.counting
        flushed: list[Any] = []
        keys = group.keys
        windows = group.windows
        for windowed_value in values:
            key, value = windowed_value.value
            if windowed_value.windows != windows:
                self._end_group()
                windows = windowed_value.windows
                if not windows:  # in no window: Beam adds it nowhere
                    windows = None
                    continue
                group.start(windows)
            found = keys.get(key)
            if found is not None:
                if counting:
                    keys[key] = found + 1
                else:
                    found.append(value)
                    if len(found) >= _GROUPED_VALUES:
                        group.add(key, self._combine_fn)
                continue
            if len(table) + len(windows) > max_keys:  # Beam's flush might come
                self._end_group()
                windows = None
                flushed.extend(self._add_each([windowed_value]))
                continue
            entries = []
            for at, window_ in zip(group.ats, windows, strict=True):
                wkey = (at, key)
                entry = table.get(wkey)
                if entry is None:  # as _new_entry, which has room to flush nothing
                    entry = table[wkey] = [create(), None, window_]
                entries.append(entry)
            group.entries[key] = entries
            keys[key] = 1 if counting else [value]
        return flushed

    def _end_group(self) -> None:
        """Adds the waiting values of the group to their entries; no group after it."""
        group = self._group
        for key in group.keys:
            group.add(key, self._combine_fn)
        group.start(None)

    def _add_each(self, values: list[Any]) -> list[Any]:
        """``add_all`` element by element (each window of each, as Beam's operation)."""
        table = self.table
        add_input, add_inputs = self._combine_fn.add_input, self._combine_fn.add_inputs

        def add_run(entry: Any, run: list[Any]) -> None:
            # A run of one (sliding windows' usual) as Beam adds it.
            entry[0] = add_input(entry[0], run[0]) if len(run) == 1 else add_inputs(entry[0], run)

        new_entry = self._new_entry
        flushed: list[Any] = []
        # The (window, key)'s entry the run adds to, and its key.
        entry: list[Any] | None = None
        current: Any = None
        run: list[Any] = []
        if self._default_windowing:
            for windowed_value in values:
                key, value = windowed_value.value
                if entry is None or not _same_key(key, current):
                    if run:
                        add_run(entry, run)
                        run = []
                    current = key
                    entry = table.get(key) or new_entry(key, None, None, flushed)
                run.append(value)
            if run:
                add_run(entry, run)
            return flushed
        timestamp_combiner = self._timestamp_combiner
        interval_window, bounds = window.IntervalWindow, bi.interval_bounds
        # The run's window and key objects: the next element's, mostly (windows come from
        # a cache), which needs neither its window's bounds nor a comparison.
        last_window: Any = None
        last_key: Any = None
        for windowed_value in values:
            key, value = windowed_value.value
            timestamp = windowed_value.timestamp if timestamp_combiner else None
            for window_ in windowed_value.windows:
                if entry is None or window_ is not last_window or key is not last_key:
                    at = bounds(window_) if type(window_) is interval_window else window_
                    if entry is None or not (
                        _same_key(at, current[0]) and _same_key(key, current[1])
                    ):
                        if run:
                            add_run(entry, run)
                            run = []
                        current = (at, key)
                        entry = table.get(current) or new_entry(
                            current, timestamp, window_, flushed
                        )
                    last_window, last_key = window_, key
                run.append(value)
                if timestamp_combiner:
                    entry[1] = timestamp_combiner.combine(entry[1], timestamp)  # type: ignore[index]
        if run:
            add_run(entry, run)
        return flushed

    def _new_entry(self, wkey: Any, timestamp: Any, window_: Any, flushed: list[Any]) -> list[Any]:
        """A new accumulator in the table, after Beam's flush if the table is full."""
        if len(self.table) >= self._max_keys:
            flushed.extend(self._flush())
        entry = self.table[wkey] = [self._combine_fn.create_accumulator(), timestamp, window_]
        return entry

    def process(
        self,
        element: Any,
        window_: Any = core.DoFn.WindowParam,
        timestamp: Any = core.DoFn.TimestampParam,
    ) -> Iterator[Any]:
        # The batched path calls add_all with whole chunks; this is one element of it.
        yield from self.add_all([WindowedValue(element, timestamp, (window_,))])

    def finish_bundle(self) -> Iterator[Any]:
        self._end_group()
        table, self.table = self.table, {}
        for wkey, entry in table.items():
            yield self._output(wkey, *entry)

    def _flush(self) -> list[Any]:
        """Beam's eviction: the oldest tenth of the table (and a key more) goes out."""
        table = self.table
        count = len(table)
        target = count * 9 // 10
        evicted = []
        for wkey in table:
            evicted.append(wkey)
            count -= 1
            if count <= target:
                break
        return [self._output(wkey, *table.pop(wkey)) for wkey in evicted]

    def _output(self, wkey: Any, accumulator: Any, timestamp: Any, window_: Any) -> Any:
        value = accumulator if self._compact is None else self._compact(accumulator)
        if self._default_windowing:
            return _GLOBAL_WINDOWED_NONE.with_value((wkey, value))
        at, key = wkey
        if self._timestamp_combiner is not None:
            return WindowedValue((key, value), timestamp, (window_,))
        if type(at) is tuple:  # an IntervalWindow's max_timestamp: its end's predecessor
            return create_windowed_value((key, value), at[1] - 1, (window_,))
        return WindowedValue((key, value), window_.max_timestamp(), (window_,))


# Values of one key a group holds before adding them to the key's entries.
_GROUPED_VALUES = 256


class _KeyGroups:
    """A grouped precombine's group (``_PrecombineDoFn._add_grouped``).

    Its windows, and per key its entries (one per window, in order) and values not yet
    added to them; for Beam's ``CountCombineFn`` (``counting``) only how many (its
    ``add_inputs`` adds their number). A wrapped ``sum`` (``one_by_one``) gets each value
    by ``add_input``, as Beam adds it: its buffer is summed when full, and Python's
    ``sum`` of floats (compensated from 3.12) may round a longer buffer otherwise.
    """

    def __init__(self, counting: bool, one_by_one: bool = False) -> None:
        self.counting = counting
        self.one_by_one = one_by_one
        self.entries: dict[Any, list[list[Any]]] = {}
        self.keys: dict[Any, Any] = {}
        self.start(None)

    def start(self, windows: Any) -> None:
        """A new group, of elements in ``windows`` (None: no group).

        Its dicts stay the same objects, emptied: the precombine holds them.
        """
        self.windows = windows
        # Each window's part of the table's key: an IntervalWindow's bounds, as the table
        # keys it.
        self.ats = (
            []
            if windows is None
            else [bi.interval_bounds(w) if type(w) is window.IntervalWindow else w for w in windows]
        )
        self.entries.clear()
        self.keys.clear()

    def add(self, key: Any, combine_fn: Any) -> None:
        """Adds ``key``'s waiting values to its entries; none wait after."""
        values = self.keys[key]
        if not values:
            return
        if self.counting:
            for entry in self.entries[key]:
                entry[0] += values
            self.keys[key] = 0
            return
        if self.one_by_one:
            add_input = combine_fn.add_input
            for entry in self.entries[key]:
                accumulator = entry[0]
                for value in values:
                    accumulator = add_input(accumulator, value)
                entry[0] = accumulator
            self.keys[key] = []
            return
        for entry in self.entries[key]:
            entry[0] = (
                combine_fn.add_input(entry[0], values[0])
                if len(values) == 1
                else combine_fn.add_inputs(entry[0], values)
            )
        self.keys[key] = []


def _same_key(key: Any, other: Any) -> bool:
    """Whether a dict surely holds the two as one key: the same object, or equal, one type.

    Keys that fail this merely start another run, which finds its entry in the table.
    """
    return key is other or (type(key) is type(other) and key == other)


# As Beam's operations module makes it.
_GLOBAL_WINDOWED_NONE = window.GlobalWindows.windowed_value(None)
