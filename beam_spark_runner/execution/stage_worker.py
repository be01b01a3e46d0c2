"""Runs a fused Beam stage over Arrow batches inside a Spark task.

The driver ships a :class:`StageSpec` (the stage's process bundle descriptor as bytes, its
I/O wiring and its side inputs as a broadcast). In the Python worker, a :class:`StageWorker`
is built once per stage and process and reused across tasks: Beam's ``SdkWorker`` with a
bundle processor cache, fed through :class:`ArrowDataChannel`, with side inputs served from
an in-memory ``StateServicer``. Each input Arrow batch is one Beam bundle.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import itertools
import logging
import time
import traceback
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from beam_spark_runner import beam_internals as bi
from beam_spark_runner import worker_warnings
from beam_spark_runner.coders import KeyExtractor, packed_bytes, split_packed
from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.data_channel import ArrowDataChannel, ArrowDataChannelFactory
from beam_spark_runner.metrics import TaskMetrics, task_metrics

_LOGGER = logging.getLogger(__name__)

TAG = "tag"
KEY = "key"
ELEMENT = "element"
STAGE_OUTPUT_SCHEMA = pa.schema(
    [pa.field(TAG, pa.int32()), pa.field(KEY, pa.binary()), pa.field(ELEMENT, pa.binary())]
)
STAGE_OUTPUT_DDL = f"{TAG} int, {KEY} binary, {ELEMENT} binary"

# An SDF may ask to be resumed after a delay; in batch the runner waits, up to this long.
_MAX_RESUME_DELAY_SECONDS = 5.0
# Worker processes keep this many stage workers (descriptors, DoFn instances) alive.
_MAX_CACHED_STAGES = 64


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output of the stage: the transform writing it, and how to key it."""

    transform_id: str
    # The runner-safe windowed coder id, when the output feeds a GroupByKey.
    key_coder_id: str | None


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """Everything a Spark task needs to run one fused stage. Pickled to executors."""

    run_id: str
    name: str
    display_name: str
    descriptor: bytes
    input_transform_id: str
    outputs: tuple[OutputSpec, ...]
    # A pyspark Broadcast of [(StateKey bytes, data bytes)], or None without side inputs.
    side_input_state: Any = None

    @functools.cached_property
    def cache_key(self) -> str:
        """Identifies what was shipped, so a worker never reuses another spec's state."""
        digest = hashlib.sha1(self.descriptor, usedforsecurity=False).hexdigest()
        return f"{self.run_id}/{self.name}/{digest}"


class BundleOutputs:
    """The outputs of one bundle: per output index, the stream and element ends."""

    def __init__(self, output_count: int) -> None:
        self.data: list[list[tuple[bytes, list[int]]]] = [[] for _ in range(output_count)]

    def record_batches(
        self, outputs: tuple[OutputSpec, ...], key_extractors: dict[int, KeyExtractor]
    ) -> Iterator[pa.RecordBatch]:
        """Arrow batches in the stage output layout (tag, key, element)."""
        for index, chunks in enumerate(self.data):
            extractor = key_extractors.get(index)
            for data, ends in chunks:
                if not ends:
                    continue
                keys = extractor.keys(data, ends) if extractor is not None else None
                offset = 0
                for array in split_packed(data, ends):
                    count = len(array)
                    key_array = (
                        pa.array(keys[offset : offset + count], type=pa.binary())
                        if keys is not None
                        else pa.nulls(count, type=pa.binary())
                    )
                    offset += count
                    yield pa.RecordBatch.from_arrays(
                        [pa.array(np.full(count, index, dtype=np.int32)), key_array, array],
                        schema=STAGE_OUTPUT_SCHEMA,
                    )


class StageWorker:
    """Beam's SDK worker for one stage, living in a Spark Python worker process."""

    _ids = itertools.count()

    def __init__(self, spec: StageSpec) -> None:
        self.spec = spec
        self.descriptor = bi.beam_fn_api_pb2.ProcessBundleDescriptor.FromString(spec.descriptor)
        self.channel = ArrowDataChannel()
        self.state = bi.StateServicer()
        if spec.side_input_state is not None:
            for key, data in spec.side_input_state.value:
                self.state.append_raw(bi.beam_fn_api_pb2.StateKey.FromString(key), data)
        processor_cache = bi.BundleProcessorCache(
            bi.FNAPI_RUNNER_CAPABILITIES,
            bi.SingletonStateHandlerFactory(
                bi.GlobalCachingStateHandler(bi.StateCache(0), self.state)
            ),
            ArrowDataChannelFactory(self.channel),
            {self.descriptor.id: self.descriptor},
        )
        self.worker = bi.SdkWorker(processor_cache)
        context = bi.PipelineContext(self.descriptor)
        self.key_extractors = {
            index: KeyExtractor(context.coders[output.key_coder_id])
            for index, output in enumerate(spec.outputs)
            if output.key_coder_id
        }
        self.output_index = {o.transform_id: i for i, o in enumerate(spec.outputs)}

    def _instruction_id(self) -> str:
        return f"{self.spec.name}-{next(self._ids)}"

    def _run_once(self, data: bytes, outputs: BundleOutputs, metrics: TaskMetrics) -> list[Any]:
        instruction_id = self._instruction_id()
        self.channel.set_input(instruction_id, self.spec.input_transform_id, data)
        request = bi.beam_fn_api_pb2.InstructionRequest(
            instruction_id=instruction_id,
            process_bundle=bi.beam_fn_api_pb2.ProcessBundleRequest(
                process_bundle_descriptor_id=self.descriptor.id
            ),
        )
        response = self.worker.do_instruction(request)
        if response.error:
            self.channel.discard(instruction_id)
            raise StageExecutionError(self.spec.display_name, response.error)
        for transform_id, stream in self.channel.take_outputs(instruction_id).items():
            outputs.data[self.output_index[transform_id]].append((stream.get(), stream.ends))
        result = response.process_bundle
        metrics.extend(result.monitoring_infos)
        if result.requires_finalization:
            finalize = self.worker.do_instruction(
                bi.beam_fn_api_pb2.InstructionRequest(
                    instruction_id=self._instruction_id(),
                    finalize_bundle=bi.beam_fn_api_pb2.FinalizeBundleRequest(
                        instruction_id=instruction_id
                    ),
                )
            )
            if finalize.error:
                raise StageExecutionError(self.spec.display_name, finalize.error)
        return list(result.residual_roots)

    def process(self, data: bytes, metrics: TaskMetrics) -> BundleOutputs:
        """Runs one bundle, then its SDF residuals until none remain."""
        outputs = BundleOutputs(len(self.spec.outputs))
        residuals = self._run_once(data, outputs, metrics)
        while residuals:
            delay = max(
                (r.requested_time_delay.ToTimedelta().total_seconds() for r in residuals),
                default=0.0,
            )
            if delay > 0:
                time.sleep(min(delay, _MAX_RESUME_DELAY_SECONDS))
            resumed = b"".join(r.application.element for r in residuals)
            residuals = self._run_once(resumed, outputs, metrics)
        return outputs


_WORKERS: collections.OrderedDict[str, StageWorker] = collections.OrderedDict()


def stage_worker(spec: StageSpec) -> StageWorker:
    """The worker for ``spec`` in this process, built on first use."""
    worker = _WORKERS.get(spec.cache_key)
    if worker is None:
        worker = StageWorker(spec)
        _WORKERS[spec.cache_key] = worker
        while len(_WORKERS) > _MAX_CACHED_STAGES:
            _, evicted = _WORKERS.popitem(last=False)
            evicted.worker.bundle_processor_cache.shutdown()
    else:
        _WORKERS.move_to_end(spec.cache_key)
    return worker


class TaskSinks(NamedTuple):
    """Spark accumulators a task reports into (None where not collected)."""

    metrics: Any = None
    warnings: Any = None


NO_SINKS = TaskSinks()


def run_stage(
    spec: StageSpec, batches: Iterable[pa.RecordBatch], sinks: TaskSinks = NO_SINKS
) -> Iterator[pa.RecordBatch]:
    """The body of the stage's ``mapInArrow``: one bundle per input batch."""
    with worker_warnings.recording(sinks.warnings):
        worker = stage_worker(spec)
    with task_metrics(sinks.metrics) as metrics:
        for batch in batches:
            data = packed_bytes(batch.column(ELEMENT))
            if not data:
                continue
            try:
                with worker_warnings.recording(sinks.warnings):
                    outputs = worker.process(data, metrics)
            except StageExecutionError:
                raise
            except Exception as error:  # noqa: BLE001 - re-raised with the stage's name
                raise StageExecutionError(spec.display_name, traceback.format_exc()) from error
            yield from outputs.record_batches(spec.outputs, worker.key_extractors)
