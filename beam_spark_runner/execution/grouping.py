"""GroupByKey inside a Spark grouped-map function.

Spark shuffles elements on their ``key`` column; each key's elements arrive together in one
Arrow table. They go through Beam's own ``GroupingBuffer``, which decodes them with the
pre-grouping coder and runs Beam's batch trigger driver (or, for the global window with the
default trigger, its fast path): windows, merging windows, triggers and panes all follow
Beam's semantics, as in FnApiRunner. The grouped output is one cell holding the key's
encoded ``KV<K, Iterable<V>>`` elements, one per window and pane.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pyarrow as pa

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import packed_bytes
from beam_spark_runner.execution.stage_worker import ELEMENT, KEY

GROUPED_SCHEMA = pa.schema([pa.field(KEY, pa.binary()), pa.field(ELEMENT, pa.binary())])
GROUPED_DDL = f"{KEY} binary, {ELEMENT} binary"

_MAX_CACHED = 64


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """What a grouping task needs: coders and windowing, shipped as Components bytes."""

    run_id: str
    name: str
    components: bytes
    pre_grouping_coder_id: str
    post_grouping_coder_id: str
    windowing_strategy_id: str

    @property
    def cache_key(self) -> str:
        """Identifies this GroupByKey of this run in a worker's cache."""
        return f"{self.run_id}/{self.name}"


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
    grouper = _GROUPERS.get(spec.cache_key)
    if grouper is None:
        grouper = _Grouper(spec)
        _GROUPERS[spec.cache_key] = grouper
        while len(_GROUPERS) > _MAX_CACHED:
            _GROUPERS.popitem(last=False)
    return grouper


def group_key(spec: GroupSpec, table: pa.Table) -> pa.Table:
    """Groups one key's elements; the body of the GroupByKey's grouped map."""
    grouped = _grouper(spec).group(packed_bytes(table.column(ELEMENT)))
    if not grouped:
        return GROUPED_SCHEMA.empty_table()
    return pa.table(
        {KEY: pa.nulls(1, type=pa.binary()), ELEMENT: pa.array([grouped], type=pa.binary())},
        schema=GROUPED_SCHEMA,
    )


def group_key_pandas(spec: GroupSpec, frame: Any) -> Any:
    """The pandas form of :func:`group_key`, for Spark lines without ``applyInArrow``."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    return group_key(spec, table).to_pandas()
