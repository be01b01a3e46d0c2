"""A native combine's aggregated rows, as the elements Beam's lifted combine would give.

Spark aggregates a native combine (``planning.phases.native_combines``) per key in the JVM
(``translators.native_combine``): one row per key holding the key, as its writers encoded
it with the runner-safe key coder, the aggregate (``RESULT``) and, for a mean, the count
(``COUNT``). Here each row becomes the ``KV`` element the stage after the combine reads: in
the global window, at its end, in its only pane (first and last, on time), as Beam's
``GroupingBuffer`` and the combine's merge and extract steps give it, its key encoded with
the output's runner-safe key coder and its value with the output's value coder. The value
is computed from the aggregate as Beam's CombineFn computes it (``output_value``).
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from apache_beam.coders import coders

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import split_packed
from beam_spark_runner.execution import beam_globals
from beam_spark_runner.execution.grouping import GROUPED_SCHEMA, at_end_of_global_window
from beam_spark_runner.execution.stage_worker import (
    KEY,
    NO_SINKS,
    StageSpec,
    TaskSinks,
    run_stage,
)

# The aggregated frame's columns, beside KEY.
RESULT = "result"
COUNT = "count"
# Keys per output batch, as grouping hands out (execution.grouped_stage.BUNDLE_KEYS).
_BATCH_KEYS = 10_000


@dataclasses.dataclass(frozen=True)
class NativeCombineSpec:
    """What a task needs to write a native combine's output elements. Pickled to executors."""

    environment: beam_globals.TaskEnvironment
    name: str
    function: str
    value_type: str
    # Components holding the two coders below (and what they are built from).
    components: bytes
    # The runner-safe windowed KV coder the writers encoded the keys with.
    input_coder_id: str
    # The windowed KV coder of the combine's output (the data channel's), and its
    # runner-safe twin: keys are written with the latter (user-coded keys stay opaque
    # bytes), values with the former (the safe coder may see a float as opaque bytes).
    output_coder_id: str
    safe_output_coder_id: str


def output_value(function: str, value_type: str, result: Any, count: Any = None) -> Any:
    """The combine's output for one key, from Spark's aggregate, as Beam's CombineFn gives it.

    Integer sums come as exact decimals (Spark sums ``int64`` values as ``decimal(38, 0)``):
    Python's ``sum`` does not overflow, and an output outside ``int64`` fails to encode as
    it does on Beam's path. A mean is ``sum / float(count)``, as ``MeanCombineFn`` computes
    it (an integer sum is converted to a float first, as Python's ``int / float`` does).
    """
    if function == "count":
        return int(result)
    if function == "mean":
        total = int(result) if value_type == "int" else float(result)
        return total / float(count)
    if value_type == "int":
        return int(result) if isinstance(result, decimal.Decimal) else result
    return float(result)


class _Encoder:
    def __init__(self, spec: NativeCombineSpec) -> None:
        context = bi.PipelineContext(bi.beam_runner_api_pb2.Components.FromString(spec.components))
        input_coder = context.coders[spec.input_coder_id]
        self._key_impl = input_coder.wrapped_value_coder.key_coder().get_impl()
        output = context.coders[spec.output_coder_id]
        safe_key_coder = context.coders[spec.safe_output_coder_id].wrapped_value_coder.coders()[0]
        self._output_impl = coders.WindowedValueCoder(
            coders.TupleCoder([safe_key_coder, output.wrapped_value_coder.coders()[1]]),
            output.window_coder,
        ).get_impl()
        self._in_global_window = at_end_of_global_window()
        self._spec = spec

    def batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        spec = self._spec
        decode_key = self._key_impl.decode
        encode = self._output_impl.encode_to_stream
        for batch in batches:
            if batch.num_rows == 0:
                continue
            keys = batch.column(KEY).to_pylist()
            results = batch.column(RESULT).to_pylist()
            counts = (
                batch.column(COUNT).to_pylist()
                if COUNT in batch.schema.names
                else [None] * len(keys)
            )
            for first in range(0, len(keys), _BATCH_KEYS):
                out = bi.create_OutputStream()
                ends = []
                chunk = slice(first, first + _BATCH_KEYS)
                for key, result, count in zip(
                    keys[chunk], results[chunk], counts[chunk], strict=True
                ):
                    value = output_value(spec.function, spec.value_type, result, count)
                    encode(self._in_global_window((decode_key(key), value)), out, True)
                    ends.append(out.size())
                cells = split_packed(out.get(), ends)
                offset = first
                for cell in cells:
                    yield pa.RecordBatch.from_arrays(
                        [pa.array(keys[offset : offset + len(cell)], type=pa.binary()), cell],
                        schema=GROUPED_SCHEMA,
                    )
                    offset += len(cell)


def encode_results(
    spec: NativeCombineSpec, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """(key, element) rows of the combine's output, from its aggregated rows."""
    spec.environment.enter()
    yield from _Encoder(spec).batches(batches)


def run_native_combined_stage(
    combine: NativeCombineSpec,
    stage: StageSpec,
    batches: Iterable[pa.RecordBatch],
    sinks: TaskSinks = NO_SINKS,
) -> Iterator[pa.RecordBatch]:
    """The stage reading a native combine, over the combine's aggregated rows, in one task."""
    yield from run_stage(stage, encode_results(combine, batches), sinks)
