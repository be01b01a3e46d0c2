"""GroupByKey over key-sorted partitions.

Spark shuffles elements on their ``key`` column and sorts each partition by it; a
``mapInArrow`` function walks the sorted batches in runs of one key (a run may span
batches) and groups each run with Beam's ``GroupingBuffer`` and batch trigger driver, as
FnApiRunner does. Three common cases are grouped without them, for a lower cost per element
and the same output (see ``_Grouper._made``): default windowing, the default trigger over
windows that do not merge, and ``Sessions`` under the triggers ``execution.session_trigger``
takes. The output is one cell per key, next to its key, holding its encoded
``KV<K, Iterable<V>>`` elements, one per window and pane.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from apache_beam.coders import coders
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import TimestampCombiner

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import split_packed
from beam_spark_runner.coders.arrow_columns import ELEMENT, KEY
from beam_spark_runner.execution import beam_globals
from beam_spark_runner.execution.key_runs import key_run_cells
from beam_spark_runner.execution.session_trigger import SessionsDriver
from beam_spark_runner.execution.session_trigger import applies as sessions_apply

GROUPED_SCHEMA = pa.schema([pa.field(KEY, pa.binary()), pa.field(ELEMENT, pa.binary())])

_MAX_CACHED = 64
# Grouped keys per output Arrow batch.
_OUTPUT_BATCH_KEYS = 1024
# ... or fewer, once their grouped elements reach this size (Arrow binary offsets are 32-bit).
_OUTPUT_BATCH_BYTES = 64 << 20
# Grouped as windowed values (group_sorted_values): a bundle's input elements, at most.
_VALUES_BATCH_BYTES = 16 << 20
# The header of an element in the global window: timestamp (8 bytes), window count
# (big-endian int32; global windows encode to nothing) and a one-byte pane.
_WINDOW_COUNT_OFFSET = 8
_PANE_OFFSET = 12
_GLOBAL_HEADER_BYTES = 13


def at_end_of_global_window() -> Any:
    """``value -> WindowedValue`` in the global window, at its end, in its one on-time pane.

    What a key's output is under default windowing, as Beam's ``GroupingBuffer.partition``
    builds it (and so the merge and extract steps of a lifted combine after it).
    """
    return window.GlobalWindows.windowed_value(
        None,
        timestamp=window.GlobalWindow().max_timestamp(),
        pane_info=bi.PaneInfo(
            is_first=True,
            is_last=True,
            timing=bi.PaneInfoTiming.ON_TIME,
            index=0,
            nonspeculative_index=0,
        ),
    ).with_value


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """What a grouping task needs: coders and windowing, shipped as Components bytes."""

    environment: beam_globals.TaskEnvironment
    name: str
    components: bytes
    pre_grouping_coder_id: str
    post_grouping_coder_id: str
    windowing_strategy_id: str

    @functools.cached_property
    def cache_key(self) -> str:
        """Identifies what was shipped, so a worker never reuses another spec's state."""
        digest = hashlib.sha1(self.components, usedforsecurity=False).hexdigest()
        return f"{self.environment.run_id}/{self.name}/{digest}"


class _Grouper:
    def __init__(self, spec: GroupSpec) -> None:
        context = bi.PipelineContext(bi.beam_runner_api_pb2.Components.FromString(spec.components))
        self.pre_coder = context.coders[spec.pre_grouping_coder_id]
        self.post_coder = context.coders[spec.post_grouping_coder_id]
        self.windowing = context.windowing_strategies[spec.windowing_strategy_id]
        self.post_impl = self.post_coder.get_impl()
        # Default windowing: Beam's GroupingBuffer gives each key one output in the global
        # window, at its end, in an on-time pane that is the first and the last. Grouping a
        # run of one key needs only its values, so the default path reads them directly.
        self._default_layout = (
            self.windowing.is_default()
            and type(self.pre_coder) in (coders.WindowedValueCoder, coders.ParamWindowedValueCoder)
            and type(self.pre_coder.window_coder) is coders.GlobalWindowCoder
            and type(self.pre_coder.wrapped_value_coder) is coders.TupleCoder
            and len(self.pre_coder.wrapped_value_coder.coders()) == 2
        )
        # Value-only elements: the nested key, then the value; no header.
        self._value_only = type(self.pre_coder) is coders.ParamWindowedValueCoder
        # The default trigger over windows that do not merge: one on-time pane per window.
        self._per_window = (
            not self.windowing.is_default()
            and self.windowing.triggerfn == trigger.DefaultTrigger()
            and not self.windowing.windowfn.is_merging()
            and isinstance(self.pre_coder, coders.WindowedValueCoder)
        )
        # Beam's Sessions under the triggers the runner's SessionsDriver takes.
        self._sessions: SessionsDriver | None = None
        if isinstance(self.pre_coder, coders.WindowedValueCoder) and sessions_apply(self.windowing):
            self._sessions = SessionsDriver(self.windowing)
        if self._per_window or self._sessions is not None:
            self._pre_impl = self.pre_coder.get_impl()
            # As GroupingBuffer: keys are told apart by this coder's encoding.
            self._grouping_key_impl = self.pre_coder.key_coder().get_impl()
            self._timestamp_impl = TimestampCombiner.get_impl(
                self.windowing.timestamp_combiner, self.windowing.windowfn
            )
        if self._default_layout:
            key_coder, value_coder = self.pre_coder.wrapped_value_coder.coders()
            self._key_impl = key_coder.get_impl()
            self._value_impl = value_coder.get_impl()
            self._globally_window = at_end_of_global_window()

    def group(self, elements: bytes) -> bytes:
        """The grouped output of one key's elements (as Beam's GroupingBuffer gives it)."""
        out = bi.create_OutputStream()
        self.group_into(elements, out)
        return out.get()  # type: ignore[no-any-return]

    def group_into(self, elements: bytes, out: Any) -> None:
        """Writes the grouped output of one key's elements to ``out``."""
        made = self._made(elements)
        if made is None:
            for chunk in self._buffered(elements):
                out.write(chunk)
            return
        _encode_all(self.post_impl, made, out)

    def windowed(self, elements: bytes) -> list[Any]:
        """The grouped output of one key's elements, as the windowed values it encodes."""
        made = self._made(elements)
        if made is None:
            return list(self.post_impl.decode_all(b"".join(self._buffered(elements))))
        return made

    def _made(self, elements: bytes) -> list[Any] | None:
        """One key's grouped output where the runner groups; None where GroupingBuffer does."""
        if self._per_window:
            return self._group_per_window(elements)
        if self._sessions is not None:
            return self._group_sessions(self._sessions, elements)
        if self._default_layout:
            grouped = (
                self._group_values(elements) if self._value_only else self._group_default(elements)
            )
            if grouped is not None:
                return [grouped]
        return None

    def _buffered(self, elements: bytes) -> list[bytes]:
        """One key's grouped output, encoded, from Beam's GroupingBuffer."""
        buffer = bi.GroupingBuffer(self.pre_coder, self.post_coder, self.windowing)
        buffer.append(elements)
        return list(buffer.partition(1)[0])

    def _group_default(self, elements: bytes) -> Any:
        """Groups one key's elements under default windowing, without a GroupingBuffer.

        Reads each element as its header (timestamp, window count, pane), the key and the
        value, decoding only the value. Returns None unless every element has a one-byte
        pane, a plain window count and exactly the first element's key bytes; then
        GroupingBuffer would hold one entry (the key, all values in stream order), and the
        output is the one it gives.
        """
        if not _fits(elements[:_GLOBAL_HEADER_BYTES], b""):
            return None
        stream = bi.create_InputStream(elements)
        stream.read(_GLOBAL_HEADER_BYTES)
        key = self._key_impl.decode_from_stream(stream, True)
        header = len(elements) - stream.size()
        if header > len(elements):
            return None
        nested_key = elements[_GLOBAL_HEADER_BYTES:header]
        # Most elements repeat the first one's window count and pane: one comparison.
        usual = elements[_WINDOW_COUNT_OFFSET:header]
        stream = bi.create_InputStream(elements)
        size, read = stream.size, stream.read
        decode_value = self._value_impl.decode_from_stream
        values: list[Any] = []
        append = values.append
        while (remaining := size()) > 0:
            if remaining < header:
                return None
            head = read(header)
            if not head.endswith(usual) and not _fits(head, nested_key):
                return None
            append(decode_value(stream, True))
        return self._globally(key, values)

    def _globally(self, key: Any, values: list[Any]) -> Any:
        """One key's grouped values as GroupingBuffer gives them under default windowing."""
        # GroupingBuffer's output key: the key decoded from its encoding.
        output_key = self._key_impl.decode(self._key_impl.encode(key))
        return self._globally_window((output_key, values))

    def _group_per_window(self, elements: bytes) -> list[Any]:
        """Groups under the default trigger and windows that do not merge, as Beam does.

        What ``GroupingBuffer`` and the ``GeneralTriggerDriver`` it uses in batch give for
        this windowing, without the driver's state and timers: per key (told apart by the
        key's encoding, in order of first appearance), per window in order of first
        appearance, the window's values in input order, at the output time the timestamp
        combiner assigns and merges, in pane ``(first, not last, ON_TIME, 0, 0)``: the
        driver's watermark timer for the window fires at its end, and the default trigger
        never finishes.
        """
        stream = bi.create_InputStream(elements)
        decode = self._pre_impl.decode_from_stream
        encode_key = self._grouping_key_impl.encode
        table: dict[bytes, dict[Any, tuple[list[Any], list[Any]]]] = {}
        while stream.size() > 0:
            windowed = decode(stream, True)
            key, value = windowed.value
            windows = table.get(encoded := encode_key(key))
            if windows is None:
                windows = table[encoded] = {}
            for w in windowed.windows:
                entry = windows.get(w)
                if entry is None:
                    entry = windows[w] = ([], [])
                entry[0].append(value)
                entry[1].append(windowed.timestamp)
        combiner = self._timestamp_impl
        decode_key = self._grouping_key_impl.decode
        grouped: list[Any] = []
        for encoded, windows in table.items():
            key = decode_key(encoded)
            for w, (values, timestamps) in windows.items():
                hold = combiner.merge(w, (combiner.assign_output_time(w, t) for t in timestamps))
                timestamp = w.max_timestamp() if hold is None else combiner.combine_all([hold])
                grouped.append(bi.WindowedValue((key, values), timestamp, (w,), _ON_TIME_NOT_LAST))
        return grouped

    def _group_sessions(self, driver: SessionsDriver, elements: bytes) -> list[Any]:
        """Groups into sessions with the runner's ``SessionsDriver``, as Beam does in batch.

        Per key (told apart by the key's encoding, in order of first appearance), the panes
        Beam's ``GeneralTriggerDriver.process_entire_key`` gives, in its order.
        """
        stream = bi.create_InputStream(elements)
        decode = self._pre_impl.decode_from_stream
        encode_key = self._grouping_key_impl.encode
        table: dict[bytes, list[Any]] = {}
        while stream.size() > 0:
            windowed = decode(stream, True)
            key, value = windowed.value
            run = table.get(encoded := encode_key(key))
            if run is None:
                run = table[encoded] = []
            run.append(windowed.with_value(value))
        decode_key = self._grouping_key_impl.decode
        grouped: list[Any] = []
        for encoded, run in table.items():
            key = decode_key(encoded)
            grouped.extend(
                pane.with_value((key, pane.value)) for pane in driver.process_entire_key(run)
            )
        return grouped

    def _group_values(self, elements: bytes) -> Any:
        """:meth:`_group_default` for value-only elements (the nested key, then the value).

        Returns None unless every element starts with exactly the first element's key bytes.
        """
        stream = bi.create_InputStream(elements)
        key = self._key_impl.decode_from_stream(stream, True)
        key_bytes = len(elements) - stream.size()
        nested_key = elements[:key_bytes]
        stream = bi.create_InputStream(elements)
        size, read = stream.size, stream.read
        decode_value = self._value_impl.decode_from_stream
        values: list[Any] = []
        append = values.append
        while size() > 0:
            if read(key_bytes) != nested_key:
                return None
            append(decode_value(stream, True))
        return self._globally(key, values)


def _encode_all(impl: Any, values: list[Any], out: Any) -> None:
    """Writes grouped windowed values to ``out`` with the grouped output's coder."""
    encode = impl.encode_to_stream
    for value in values:
        encode(value, out, True)


def _fits(head: bytes, nested_key: bytes) -> bool:
    """Whether an element's header and key (``head``) are those the default path reads."""
    return (
        len(head) >= _GLOBAL_HEADER_BYTES
        and head[_PANE_OFFSET] < 0x10
        and head[_WINDOW_COUNT_OFFSET] < 0x80
        and head.endswith(nested_key)
    )


# The pane GeneralTriggerDriver gives a window's one firing under the default trigger in
# batch: its watermark timer fires at the window's end, and the trigger never finishes.
_ON_TIME_NOT_LAST = bi.PaneInfo(
    is_first=True, is_last=False, timing=bi.PaneInfoTiming.ON_TIME, index=0, nonspeculative_index=0
)

_GROUPERS: collections.OrderedDict[str, _Grouper] = collections.OrderedDict()


def _grouper(spec: GroupSpec) -> _Grouper:
    # With SDK coders (custom windows) grouping decodes and re-encodes keys: run's globals.
    spec.environment.enter()
    grouper = _GROUPERS.get(spec.cache_key)
    if grouper is None:
        grouper = _Grouper(spec)
        _GROUPERS[spec.cache_key] = grouper
        while len(_GROUPERS) > _MAX_CACHED:
            _GROUPERS.popitem(last=False)
    return grouper


def _output_batches(
    keys: list[bytes | None], data: bytes, ends: list[int]
) -> Iterator[pa.RecordBatch]:
    # The key stays with its group: a stateful stage reading the group re-shuffles on it.
    first = 0
    for grouped in split_packed(data, ends):
        count = len(grouped)
        yield pa.RecordBatch.from_arrays(
            [pa.array(keys[first : first + count], type=pa.binary()), grouped],
            schema=GROUPED_SCHEMA,
        )
        first += count


def _key_runs(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[bytes | None, bytes]]:
    """Each key's elements in a key-sorted partition, joined (a key's run may span batches).

    Only the current key's elements are held in memory.
    """
    current_key: bytes | None = None
    current: list[bytes] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        for key, cell in key_run_cells(batch.column(KEY), batch.column(ELEMENT)):
            if key != current_key:
                if current:
                    yield current_key, b"".join(current)
                    current.clear()
                current_key = key
            current.append(cell)
    if current:
        yield current_key, b"".join(current)


def group_sorted(
    spec: GroupSpec, batches: Iterable[pa.RecordBatch], batch_keys: int = _OUTPUT_BATCH_KEYS
) -> Iterator[pa.RecordBatch]:
    """Groups a key-sorted partition; the body of the GroupByKey's ``mapInArrow``.

    Emits one cell per key holding its grouped elements (one per window and pane), in
    batches of at most ``batch_keys`` keys. The grouped elements of an output batch are
    written to one stream, whose element boundaries become the cells.
    """
    grouper = _grouper(spec)
    grouped_keys: list[bytes | None] = []
    out = bi.create_OutputStream()
    ends: list[int] = []
    for key, elements in _key_runs(batches):
        if len(ends) >= batch_keys or (ends and ends[-1] >= _OUTPUT_BATCH_BYTES):
            yield from _output_batches(grouped_keys, out.get(), ends)
            grouped_keys.clear()
            ends.clear()
            out = bi.create_OutputStream()
        before = out.size()
        grouper.group_into(elements, out)
        if out.size() > before:
            grouped_keys.append(key)
            ends.append(out.size())
    if ends:
        yield from _output_batches(grouped_keys, out.get(), ends)


class GroupedValues:
    """A bundle of grouped elements, as windowed values (``batched_steps.ValuesInput``).

    The batched steps of the stage reading the grouping take the values as they are;
    iterated (for Beam's bundle processor), they are encoded with the grouped output's coder.
    """

    def __init__(self, values: list[Any], impl: Any) -> None:
        self.values = values
        self._impl = impl

    def __bool__(self) -> bool:
        return bool(self.values)

    def __iter__(self) -> Iterator[bytes]:
        out = bi.create_OutputStream()
        _encode_all(self._impl, self.values, out)
        yield out.get()

    def windowed_values(self) -> Iterator[Any]:
        """The grouped elements, in the order they would be encoded."""
        return iter(self.values)


def group_sorted_values(
    spec: GroupSpec,
    batches: Iterable[pa.RecordBatch],
    batch_keys: int,
    batch_bytes: int = _VALUES_BATCH_BYTES,
) -> Iterator[GroupedValues]:
    """:func:`group_sorted`'s output as windowed values, without encoding them.

    A bundle per ``batch_keys`` keys, or fewer once their elements (encoded, as read) reach
    ``batch_bytes``: its values are alive all at once, as objects.
    """
    grouper = _grouper(spec)
    values: list[Any] = []
    keys = size = 0
    for _, elements in _key_runs(batches):
        if keys >= batch_keys or size >= batch_bytes:
            yield GroupedValues(values, grouper.post_impl)
            values = []
            keys = size = 0
        values.extend(grouper.windowed(elements))
        keys += 1
        size += len(elements)
    if values:
        yield GroupedValues(values, grouper.post_impl)
