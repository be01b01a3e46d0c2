"""GroupByKey over key-sorted partitions.

Spark shuffles elements on their ``key`` column and sorts each partition by it; a
``mapInArrow`` function then walks the sorted batches, cutting them into runs of one key
(a run may span batches). Each key's elements go through Beam's own ``GroupingBuffer``,
which decodes them with the pre-grouping coder and runs Beam's batch trigger driver (or,
for the global window with the default trigger, its fast path): windows, merging windows,
triggers and panes all follow Beam's semantics, as in FnApiRunner. The grouped output is
one cell per key, next to its key, holding its encoded ``KV<K, Iterable<V>>`` elements, one
per window and pane.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
from collections.abc import Iterable, Iterator

import pyarrow as pa

from beam_spark_runner import beam_globals
from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import packed_bytes
from beam_spark_runner.execution.key_runs import run_starts
from beam_spark_runner.execution.stage_worker import ELEMENT, KEY

GROUPED_SCHEMA = pa.schema([pa.field(KEY, pa.binary()), pa.field(ELEMENT, pa.binary())])
GROUPED_DDL = f"{KEY} binary, {ELEMENT} binary"

_MAX_CACHED = 64
# Grouped keys per output Arrow batch.
_OUTPUT_BATCH_KEYS = 1024


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """What a grouping task needs: coders and windowing, shipped as Components bytes."""

    run_id: str
    name: str
    components: bytes
    pre_grouping_coder_id: str
    post_grouping_coder_id: str
    windowing_strategy_id: str
    # The pipeline's --pickle_library, to unpickle its coders and windowing with.
    pickle_library: str = beam_globals.DEFAULT_PICKLE_LIBRARY

    @functools.cached_property
    def cache_key(self) -> str:
        """Identifies what was shipped, so a worker never reuses another spec's state."""
        digest = hashlib.sha1(self.components, usedforsecurity=False).hexdigest()
        return f"{self.run_id}/{self.name}/{digest}"


class _Grouper:
    def __init__(self, spec: GroupSpec) -> None:
        context = bi.PipelineContext(bi.beam_runner_api_pb2.Components.FromString(spec.components))
        self.pre_coder = context.coders[spec.pre_grouping_coder_id]
        self.post_coder = context.coders[spec.post_grouping_coder_id]
        self.windowing = context.windowing_strategies[spec.windowing_strategy_id]

    def group(self, elements: bytes) -> bytes:
        buffer = bi.GroupingBuffer(self.pre_coder, self.post_coder, self.windowing)
        buffer.append(elements)
        return b"".join(buffer.partition(1)[0])


_GROUPERS: collections.OrderedDict[str, _Grouper] = collections.OrderedDict()


def _grouper(spec: GroupSpec) -> _Grouper:
    # With SDK coders (custom windows) grouping decodes and re-encodes keys: run's globals.
    beam_globals.enter_run(spec.run_id, spec.pickle_library)
    grouper = _GROUPERS.get(spec.cache_key)
    if grouper is None:
        grouper = _Grouper(spec)
        _GROUPERS[spec.cache_key] = grouper
        while len(_GROUPERS) > _MAX_CACHED:
            _GROUPERS.popitem(last=False)
    return grouper


def _output_batch(keys: list[bytes | None], grouped: list[bytes]) -> pa.RecordBatch:
    # The key stays with its group: a stateful stage reading the group re-shuffles on it.
    return pa.RecordBatch.from_arrays(
        [pa.array(keys, type=pa.binary()), pa.array(grouped, type=pa.binary())],
        schema=GROUPED_SCHEMA,
    )


def group_sorted(spec: GroupSpec, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Groups a key-sorted partition; the body of the GroupByKey's ``mapInArrow``.

    Emits one cell per key holding its grouped elements (one per window and pane). Only
    the current key's elements are held in memory.
    """
    grouper = _grouper(spec)
    current_key: bytes | None = None
    current: list[bytes] = []
    grouped_keys: list[bytes | None] = []
    grouped: list[bytes] = []

    def flush() -> None:
        if current:
            result = grouper.group(b"".join(current))
            if result:
                grouped_keys.append(current_key)
                grouped.append(result)
            current.clear()

    for batch in batches:
        rows = batch.num_rows
        if rows == 0:
            continue
        keys = batch.column(KEY)
        elements = batch.column(ELEMENT)
        for start, end in itertools.pairwise(run_starts(keys)):
            key = keys[start].as_py()
            if key != current_key:
                flush()
                current_key = key
            current.append(packed_bytes(elements.slice(start, end - start)))
        if len(grouped) >= _OUTPUT_BATCH_KEYS:
            yield _output_batch(grouped_keys, grouped)
            grouped_keys.clear()
            grouped.clear()
    flush()
    if grouped:
        yield _output_batch(grouped_keys, grouped)
