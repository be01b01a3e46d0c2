"""Runs a fused Beam stage over Arrow batches inside a Spark task.

The driver ships a :class:`StageSpec` (the stage's process bundle descriptor as bytes, its
I/O wiring and its side inputs as a broadcast). In the Python worker, a :class:`StageWorker`
is built once per stage and process and reused across tasks: Beam's ``SdkWorker`` with a
bundle processor cache, fed through :class:`ArrowDataChannel`, with side inputs and user
state served by a state backend (``execution.state``). Each input Arrow batch of a stateless
stage is one Beam bundle; a stateful stage runs whole keys at a time and fires their timers
(``execution.timers``). A stage's stateless steps may run batched before the bundle
processor (``execution.batched_steps``, ``--spark_batched_steps``).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import os
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import KeyExtractor, packed_bytes, split_packed
from beam_spark_runner.coders.arrow_columns import ELEMENT, KEY, STAGE_OUTPUT_SCHEMA
from beam_spark_runner.coders.arrow_columns import TAG as TAG  # re-exported: the stage's layout
from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution import beam_globals
from beam_spark_runner.execution.batched_plan import plan_batched_steps
from beam_spark_runner.execution.batched_steps import BatchedSteps
from beam_spark_runner.execution.data_channel import ArrowDataChannel, ArrowDataChannelFactory
from beam_spark_runner.execution.key_runs import complete_key_groups, pack_by_key
from beam_spark_runner.execution.partial_aggregation import (
    TYPED_STAGE_OUTPUT_SCHEMA,
    NativeOutput,
    PartialAggregator,
)
from beam_spark_runner.execution.state import InMemoryStateBackend, StateBackend
from beam_spark_runner.execution.text_read import TextInput, TextRange
from beam_spark_runner.execution.timers import PendingTimers, TimerFamilyId, timer_families
from beam_spark_runner.monitoring import worker_logs, worker_warnings
from beam_spark_runner.monitoring.metrics import TaskMetrics, task_metrics

_LOGGER = logging.getLogger(__name__)

# A bundle's input: its encoded elements, or pieces of them read as the bundle runs (a
# native text read's ``TextInput``; a Spark stream's columns, ``batched_steps.ValuesInput``).
Bundle = bytes | Iterable[bytes]


# An SDF may ask to be resumed after a delay; in batch the runner waits, up to this long.
_MAX_RESUME_DELAY_SECONDS = 5.0
# Decoded side inputs a stage worker's SDK state cache may keep across bundles.
_SIDE_INPUT_CACHE_BYTES = 256 << 20
# Worker processes keep this many stage workers (descriptors, DoFn instances) alive.
_MAX_CACHED_STAGES = 64
# DoFn (and CombineFn) teardown, as batch users expect it: a process tears down its idle
# DoFn instances once it has run no bundle for IDLE_TEARDOWN_SECONDS (in batch, shortly
# after its last task of a pipeline run), and tears down the stage workers of a run when it
# starts a stage of another run, when it evicts them and at interpreter exit. The delay is
# longer than Spark's locality wait (3 s) between task waves and shorter than Spark's 60 s
# idle-worker timeout, after which Spark ends the process without running Python exit hooks.
IDLE_TEARDOWN_SECONDS = 5.0
# In a streaming query a process's DoFns live across micro-batches, as Beam's streaming
# runners keep them: Spark hands a micro-batch's few tasks to any of its worker processes,
# and one of them went 5-20 s without a task in a 2 s-trigger query (measured: its DoFns
# were torn down and set up again every 10-20 s, an expensive ``setup`` paid each time).
# The query's end still tears them down, this long after, before Spark's 60 s timeout.
STREAMING_IDLE_TEARDOWN_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output of the stage: the transform writing it, and how to key it."""

    transform_id: str
    # The runner-safe windowed coder id, when the output feeds a GroupByKey.
    key_coder_id: str | None
    # For a native combine's buffer: what it aggregates. Its rows are partial aggregates
    # per key and bundle, in typed columns (execution.partial_aggregation).
    native: NativeOutput | None = None


def has_typed_outputs(outputs: tuple[OutputSpec, ...]) -> bool:
    """Whether a stage's output rows have the typed columns of native combines."""
    return any(output.native is not None for output in outputs)


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
    # A stateful stage reads key-sorted partitions and runs whole keys (see process_keys).
    stateful: bool = False
    # The runner-safe input coder when it has state-backed iterables: input elements are
    # re-encoded with it so that iterables' values go to state (--spark_state_backed_iterables).
    state_backed_input_coder_id: str | None = None
    # The pipeline's --pickle_library: workers unpickle its DoFns and coders with it.
    pickle_library: str = beam_globals.DEFAULT_PICKLE_LIBRARY
    # A Spark broadcast of the run's main session (--save_main_session), or None.
    main_session: Any = None
    # The stage reads a ReadFromText's lines natively (execution.text_read): its input rows
    # are byte ranges of the files, and this is the encoding of a line's windowed value up
    # to its length.
    text_read_header: bytes | None = None
    # Run the stage's stateless steps batched (execution.batched_steps; --spark_batched_steps).
    batched_steps: bool = True
    # A process tears its DoFns down after running no bundle for this long (see
    # IDLE_TEARDOWN_SECONDS; STREAMING_IDLE_TEARDOWN_SECONDS in a streaming query).
    idle_teardown_seconds: float = IDLE_TEARDOWN_SECONDS

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
        self,
        outputs: tuple[OutputSpec, ...],
        key_extractors: dict[int, KeyExtractor],
        aggregators: dict[int, PartialAggregator] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Arrow batches in the stage output layout (tag, key, element[, typed columns])."""
        typed = has_typed_outputs(outputs)
        for index, chunks in enumerate(self.data):
            extractor = key_extractors.get(index)
            aggregator = (aggregators or {}).get(index)
            if aggregator is not None:
                for data, ends in chunks:
                    if ends:
                        yield aggregator.record_batch(index, data, ends)
                continue
            for data, ends in chunks:
                if not ends:
                    continue
                keys = extractor.keys(data, ends) if extractor is not None else None
                offset = 0
                for array in split_packed(data, ends):
                    count = len(array)
                    if keys is None:
                        key_array = pa.nulls(count, type=pa.binary())
                    else:
                        # A key's elements travel to the shuffle as one row.
                        key_array, array = pack_by_key(
                            pa.array(keys[offset : offset + count], type=pa.binary()), array
                        )
                    offset += count
                    columns = [
                        pa.array(np.full(len(array), index, dtype=np.int32)),
                        key_array,
                        array,
                    ]
                    if typed:
                        columns += [
                            pa.nulls(len(array), pa.int64()),
                            pa.nulls(len(array), pa.float64()),
                            pa.nulls(len(array), pa.int64()),
                        ]
                    yield pa.RecordBatch.from_arrays(
                        columns, schema=TYPED_STAGE_OUTPUT_SCHEMA if typed else STAGE_OUTPUT_SCHEMA
                    )


def _side_input_cache_tokens(side_inputs: list[tuple[str, str]], token: str) -> list[Any]:
    """One cache token per side input, all naming the contents ``token``."""
    cache_token = bi.beam_fn_api_pb2.ProcessBundleRequest.CacheToken
    return [
        cache_token(
            side_input=cache_token.SideInput(transform_id=transform_id, side_input_id=tag),
            token=f"side-input/{token}".encode(),
        )
        for transform_id, tag in side_inputs
    ]


# Beam's bundle processors sample which step runs every 200 ms by default, and a bundle's
# end waits out the sampler's current sleep: up to that long on every task's critical path.
BUNDLE_SAMPLING_PERIOD_MS = 20


class StageWorker:
    """Beam's SDK worker for one stage, living in a Spark Python worker process."""

    _ids = itertools.count()

    def __init__(self, spec: StageSpec) -> None:
        bi.set_bundle_sampling_period(BUNDLE_SAMPLING_PERIOD_MS)
        self.spec = spec
        self.descriptor = bi.beam_fn_api_pb2.ProcessBundleDescriptor.FromString(spec.descriptor)
        self.channel = ArrowDataChannel()
        self.state: StateBackend = InMemoryStateBackend(
            spec.side_input_state.value if spec.side_input_state is not None else ()
        )
        # Side inputs never change for a stage worker: one cache token each lets the SDK keep
        # them decoded across bundles. User state gets no token, so it is never cached.
        # (Taken from the whole stage: the batched steps read side inputs too.)
        self._side_inputs = bi.side_input_ids(self.descriptor.transforms)
        self.cache_tokens = _side_input_cache_tokens(self._side_inputs, spec.cache_key)
        self.state_handler = bi.GlobalCachingStateHandler(
            bi.StateCache(_SIDE_INPUT_CACHE_BYTES if self.cache_tokens else 0), self.state
        )
        self.batched = _batched_steps(spec, self.descriptor, self.state_handler)
        if self.batched is not None and self.batched.plan.remainder is not None:
            # The bundle processor runs the rest of the stage, from the hand-off on.
            self.descriptor = self.batched.plan.remainder
        self.timer_families = timer_families(self.descriptor)
        processor_cache = bi.BundleProcessorCache(
            bi.FNAPI_RUNNER_CAPABILITIES,
            bi.SingletonStateHandlerFactory(self.state_handler),
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
        self.aggregators = {
            index: PartialAggregator(
                output.native,
                context.coders[output.key_coder_id],
                context.coders[output.native.coder_id],
            )
            for index, output in enumerate(spec.outputs)
            if output.key_coder_id and output.native is not None
        }
        self.output_index = {o.transform_id: i for i, o in enumerate(spec.outputs)}
        # Bundles that asked for finalization, finalized once their output is with Spark.
        self.unfinalized: list[str] = []
        self._state_backed_input = None
        if spec.state_backed_input_coder_id:
            writing = bi.PipelineContext(
                self.descriptor, iterable_state_write=self.state.write_iterable
            )
            self._state_backed_input = writing.coders[spec.state_backed_input_coder_id].get_impl()

    def load_side_inputs(self, entries: list[tuple[bytes, bytes]], token: str) -> None:
        """Replaces the side inputs served to bundles (a streaming shard's, per batch).

        ``token`` names the contents: the SDK caches decoded side inputs by it, so new
        contents need a new token.
        """
        self.state.load_side_inputs(entries)
        self.cache_tokens = _side_input_cache_tokens(self._side_inputs, token)

    def _run_batched(self, data: Bundle) -> Any:
        """The batched steps over ``data``; a step with side inputs reads them from state."""
        assert self.batched is not None
        if not self.batched.reads_side_inputs:
            return self.batched.run(data)
        with self.state_handler.process_instruction_id(
            f"{self._instruction_id()}-batched", self.cache_tokens
        ):
            return self.batched.run(data)

    def _with_state_backed_iterables(self, data: Bundle) -> Bundle:
        """Re-encodes input elements so their iterables' values are read from state."""
        impl = self._state_backed_input
        if impl is None or not data or isinstance(data, TextInput):
            return data
        if not isinstance(data, bytes):
            data = b"".join(data)
        out = bi.create_OutputStream()
        for element in impl.decode_all(data):
            impl.encode_to_stream(element, out, True)
        return out.get()

    def _instruction_id(self) -> str:
        return f"{self.spec.name}-{next(self._ids)}"

    def _run_once(
        self,
        data: Bundle,
        outputs: BundleOutputs,
        metrics: TaskMetrics,
        timers: dict[TimerFamilyId, bytes] | None = None,
        pending: PendingTimers | None = None,
        batched: bool = False,
    ) -> list[Any]:
        """Runs one bundle over ``data`` and ``timers``; returns its SDF residuals.

        Timers the bundle sets go into ``pending`` (stateful stages only). With
        ``batched`` (a bundle of the stage's input, not of residuals or timers), the
        stage's batched steps run first and hand their output to the bundle processor.
        """
        handed_off = False
        if batched and self.batched is not None and not timers:
            result = self._run_batched(data)
            for transform_id, chunk in result.outputs.items():
                outputs.data[self.output_index[transform_id]].append(chunk)
            metrics.extend(result.monitoring_infos)
            if result.handoff is None:
                return []
            data = result.handoff
            handed_off = True
        instruction_id = self._instruction_id()
        if data:
            data = self._with_state_backed_iterables(data)
            self.channel.set_input(instruction_id, self.spec.input_transform_id, data)
        for (transform_id, family_id), encoded in (timers or {}).items():
            self.channel.set_timers(instruction_id, transform_id, family_id, encoded)
        request = bi.beam_fn_api_pb2.InstructionRequest(
            instruction_id=instruction_id,
            process_bundle=bi.beam_fn_api_pb2.ProcessBundleRequest(
                process_bundle_descriptor_id=self.descriptor.id, cache_tokens=self.cache_tokens
            ),
        )
        response = self.worker.do_instruction(request)
        self.state.release_iterables()
        if response.error:
            self.channel.discard(instruction_id)
            raise StageExecutionError(self.spec.display_name, response.error)
        for transform_id, stream in self.channel.take_outputs(instruction_id).items():
            outputs.data[self.output_index[transform_id]].append((stream.get(), stream.ends))
        written_timers = self.channel.take_timers(instruction_id)
        if written_timers:
            if pending is None:
                raise StageExecutionError(
                    self.spec.display_name,
                    "Expected timers only from a stateful stage, but a bundle of this stage "
                    f"set timers for {sorted(written_timers)}. This is a bug in "
                    "SparkStructuredRunner's planning; please report it with the pipeline.",
                )
            for family_key, encoded in written_timers.items():
                pending.add_written(family_key, encoded)
        result = response.process_bundle
        infos = result.monitoring_infos
        if handed_off:
            # The batch reported how many elements the stage read, not the hand-off's count.
            input_id = self.spec.input_transform_id
            infos = [i for i in infos if not bi.is_read_index_info(i, input_id)]
        metrics.extend(infos)
        if result.requires_finalization:
            self.unfinalized.append(instruction_id)
        return list(result.residual_roots)

    def finalize_bundles(self) -> None:
        """Runs the finalization callbacks of bundles whose output Spark has taken.

        Called after the task handed a bundle's output batches to Spark (the task's
        generator resumes only when Spark asks for more), before the next bundle or
        residual runs. A bundle that fails, or whose output was not handed over before
        its task failed, is never finalized.
        """
        while self.unfinalized:
            finalize = self.worker.do_instruction(
                bi.beam_fn_api_pb2.InstructionRequest(
                    instruction_id=self._instruction_id(),
                    finalize_bundle=bi.beam_fn_api_pb2.FinalizeBundleRequest(
                        instruction_id=self.unfinalized.pop(0)
                    ),
                )
            )
            if finalize.error:
                raise StageExecutionError(self.spec.display_name, finalize.error)

    def drop_unfinalized(self) -> None:
        """Forgets the unfinalized bundles of a task that failed.

        Spark recomputes their output, so they must never be finalized; their processors go
        back to the cache.
        """
        while self.unfinalized:
            self.worker.bundle_processor_cache.release(self.unfinalized.pop())

    def _bundles(
        self,
        data: Bundle,
        metrics: TaskMetrics,
        timers: dict[TimerFamilyId, bytes] | None = None,
        pending: PendingTimers | None = None,
    ) -> Iterator[BundleOutputs]:
        """Runs one bundle, then its SDF residuals until none remain, yielding each output.

        The caller hands each bundle's output to Spark before asking for the next one, and
        finalizes the bundle in between (:meth:`finalize_bundles`): a self-checkpointing
        SDF sees its bundle finalized before its residual resumes.
        """
        outputs = BundleOutputs(len(self.spec.outputs))
        residuals = self._run_once(data, outputs, metrics, timers, pending, batched=True)
        yield outputs
        while residuals:
            delay = max(
                (r.requested_time_delay.ToTimedelta().total_seconds() for r in residuals),
                default=0.0,
            )
            if delay > 0:
                time.sleep(min(delay, _MAX_RESUME_DELAY_SECONDS))
            resumed = b"".join(r.application.element for r in residuals)
            outputs = BundleOutputs(len(self.spec.outputs))
            residuals = self._run_once(resumed, outputs, metrics, pending=pending)
            yield outputs

    def run_bundle(self, data: bytes, metrics: TaskMetrics) -> tuple[BundleOutputs, list[Any]]:
        """One bundle over ``data``; its output and its SDF residuals, not resumed.

        A streaming run keeps the residuals (a splittable DoFn's deferred remainders) in
        state and resumes them in a later micro-batch, once their requested delay passed.
        """
        outputs = BundleOutputs(len(self.spec.outputs))
        residuals = self._run_once(data, outputs, metrics, batched=True)
        return outputs, residuals

    def process_with_timers(
        self,
        data: bytes,
        metrics: TaskMetrics,
        pending: PendingTimers,
        timers: dict[TimerFamilyId, bytes] | None = None,
    ) -> Iterator[BundleOutputs]:
        """One bundle of ``data`` and ``timers`` of a stateful stage (and its residuals).

        The timers its DoFns set go to ``pending``; a streaming shard decides when to fire
        them.
        """
        yield from self._bundles(data, metrics, timers, pending)

    def process(self, data: Bundle, metrics: TaskMetrics) -> Iterator[BundleOutputs]:
        """Runs one bundle over ``data``, then its SDF residuals; yields each's output."""
        yield from self._bundles(data, metrics)

    def process_keys(self, data: Bundle, metrics: TaskMetrics) -> Iterator[BundleOutputs]:
        """Runs complete key groups of a stateful stage: elements, then timers, then done.

        ``data`` holds every element of the keys it contains. After the elements' bundle
        the keys' input is complete, so the watermark is +inf for them: timers fire round
        by round in timestamp order until none remain, then the keys' state is released.
        """
        self.state.release_user_state()  # never another task's keys, even after a failure
        pending = PendingTimers(self.timer_families)
        try:
            yield from self._bundles(data, metrics, pending=pending)
            rounds = 0
            while pending:
                rounds += 1
                yield from self._bundles(b"", metrics, pending.next_round(), pending)
            _LOGGER.debug(
                "Stage %s: %d timers fired in %d rounds, %d state cells released",
                self.spec.display_name,
                pending.fired,
                rounds,
                self.state.user_state_size(),
            )
        finally:
            self.state.release_user_state()


def _batched_steps(spec: StageSpec, descriptor: Any, state_handler: Any) -> BatchedSteps | None:
    """The stage's batched steps, if the path is on and the stage has any.

    Stateful stages (whole keys, timers) and state-backed iterables keep the bundle
    processor for everything, and so does a native text read whose batched steps would
    hand off: the hand-off holds its elements until the batch ends, and a text read's
    batch is a partition's lines (up to 64 MiB a range), read a block at a time.
    """
    if not spec.batched_steps or spec.stateful or spec.state_backed_input_coder_id:
        return None
    plan = plan_batched_steps(
        descriptor, spec.input_transform_id, f"{spec.cache_key}/{os.getpid()}"
    )
    if plan is None or (spec.text_read_header is not None and plan.remainder is not None):
        return None
    batched = BatchedSteps(plan, spec.display_name, state_handler)
    if plan.pass_through_coder_id is not None:
        _LOGGER.debug("Stage %s: passes its elements through encoded", spec.display_name)
    else:
        _LOGGER.debug(
            "Stage %s: batched steps %s, %s",
            spec.display_name,
            batched.step_names,
            "the rest in the bundle processor" if plan.remainder is not None else "no others",
        )
    return batched


_WORKERS: collections.OrderedDict[str, StageWorker] = collections.OrderedDict()

_IDLE_POLL_SECONDS = 1.0


@dataclasses.dataclass
class _Lifecycle:
    """Per-process state of the teardown machinery (see :func:`stage_worker`)."""

    # The process that started the idle thread and exit hook; a forked child starts its own.
    pid: int | None = None
    # A threading.Lock guarding _WORKERS and last_used against the idle thread.
    lock: Any = None
    # time.time() of the last stage_worker() call (Beam's bundle times are time.time() too).
    last_used: float = 0.0


_LIFECYCLE = _Lifecycle()


def _lifecycle_lock() -> Any:
    """The lock guarding ``_WORKERS``; starts the idle thread and exit hook once per process.

    The task thread creates the lock (in stage_worker) before it starts the idle thread, so
    no other thread can race the creation. Not done at import: PySpark's daemon imports this
    module before it forks the workers, and a fork copies no threads.
    """
    if _LIFECYCLE.pid != os.getpid():
        _LIFECYCLE.pid = os.getpid()
        _LIFECYCLE.lock = threading.Lock()
        atexit.register(tear_down_stage_workers)
        threading.Thread(
            target=_tear_down_idle_forever, name="beam-spark-dofn-teardown", daemon=True
        ).start()
    return _LIFECYCLE.lock


def _shut_down(workers: Iterable[StageWorker], why: str) -> None:
    """Tears down every DoFn of ``workers``; an error is logged, never raised."""
    for worker in workers:
        _LOGGER.debug("Tearing down stage %s (%s)", worker.spec.display_name, why)
        try:
            worker.worker.bundle_processor_cache.shutdown()
            batched = getattr(worker, "batched", None)
            if batched is not None:
                batched.tear_down(why)
        except Exception:  # noqa: BLE001 - a teardown error must not fail other work
            _LOGGER.exception("Teardown of stage %s failed", worker.spec.display_name)


def tear_down_stage_workers() -> None:
    """Tears down and forgets every stage worker of this process (at exit, or on demand)."""
    with _lifecycle_lock():
        workers = list(_WORKERS.values())
        _WORKERS.clear()
    _shut_down(workers, "process exit")


def tear_down_idle_dofns(now: float, idle_seconds: float | None = None) -> int:
    """Tears down the DoFns of this process if it has run no bundle for ``idle_seconds``.

    By default, the longest ``idle_teardown_seconds`` of the cached stage workers' specs
    (a process runs one pipeline's stages at a time: the run's own setting).

    Only bundle processors waiting in Beam's cache are torn down: one running a bundle is
    never touched, and a bundle starting meanwhile takes a processor from the cache (an
    atomic pop) or builds a new one. The stage workers stay cached. Returns how many bundle
    processors (each holding one instance of each DoFn of its stage) were torn down.
    """
    with _lifecycle_lock():
        stages = [(w.worker.bundle_processor_cache, w.spec.display_name) for w in _WORKERS.values()]
        batched = [b for w in _WORKERS.values() if (b := getattr(w, "batched", None)) is not None]
        last_used = _LIFECYCLE.last_used
        if idle_seconds is None:
            idle_seconds = max(
                (w.spec.idle_teardown_seconds for w in _WORKERS.values()),
                default=IDLE_TEARDOWN_SECONDS,
            )
    caches = [cache for cache, _ in stages]
    if any(bi.bundle_processors_busy(c) for c in caches):
        return 0
    bundle_times = [t for c in caches for t in list(c.last_access_times.values())]
    batch_times = [b.last_used for b in batched]
    if now - max([last_used, *bundle_times, *batch_times]) < idle_seconds:
        return 0
    torn_down = sum(b.tear_down_if_idle(now, idle_seconds) for b in batched)
    for cache, name in stages:
        for processors in list(cache.cached_bundle_processors.values()):
            while processors:
                try:
                    processor = processors.pop()
                except IndexError:  # the task thread took it meanwhile
                    break
                torn_down += 1
                try:
                    processor.shutdown()
                except Exception:  # noqa: BLE001 - logged; the other processors still go
                    _LOGGER.exception("Teardown of an idle bundle processor of %s failed", name)
    if torn_down:
        _LOGGER.debug("Tore down %d idle bundle processors", torn_down)
    return torn_down


def _tear_down_idle_forever() -> None:
    while True:
        time.sleep(_IDLE_POLL_SECONDS)
        try:
            tear_down_idle_dofns(time.time())
        except Exception:  # noqa: BLE001 - keep the thread alive; the next poll retries
            _LOGGER.exception("Tearing down idle DoFns failed")


def stage_worker(spec: StageSpec) -> StageWorker:
    """The worker for ``spec`` in this process, built on first use.

    Workers of other pipeline runs are torn down first (their DoFns' ``teardown`` runs):
    a process runs one pipeline's stages at a time, and an old run's DoFns never run again.
    Least recently used workers beyond ``_MAX_CACHED_STAGES`` are torn down too.
    """
    lock = _lifecycle_lock()
    with lock:
        _LIFECYCLE.last_used = time.time()
        other_runs = [key for key, w in _WORKERS.items() if w.spec.run_id != spec.run_id]
        retired = [_WORKERS.pop(key) for key in other_runs]
    _shut_down(retired, f"a stage of run {spec.run_id} started")
    # Beam's per-pipeline globals (pickler, pickled-type caches), before unpickling anything.
    beam_globals.enter_run(spec.run_id, spec.pickle_library, spec.main_session)
    with lock:
        worker = _WORKERS.get(spec.cache_key)
        evicted: list[StageWorker] = []
        if worker is None:
            worker = StageWorker(spec)
            _WORKERS[spec.cache_key] = worker
            while len(_WORKERS) > _MAX_CACHED_STAGES:
                evicted.append(_WORKERS.popitem(last=False)[1])
        else:
            _WORKERS.move_to_end(spec.cache_key)
    _shut_down(evicted, "evicted from the stage worker cache")
    return worker


class TaskSinks(NamedTuple):
    """Where a task reports (None where not collected).

    ``metrics``: a ``metrics.MetricsSink`` (the run's metrics accumulator, and the driver's
    side channel for failed attempts' metrics); ``warnings``: the warnings accumulator.
    """

    metrics: Any = None
    warnings: Any = None
    # The log records accumulator (worker_logs) and the levels user code logs at.
    logs: Any = None
    log_levels: worker_logs.LogLevels = worker_logs.LogLevels()


NO_SINKS = TaskSinks()


@contextlib.contextmanager
def recording(sinks: TaskSinks) -> Iterator[None]:
    """Records the warnings and log records of the code run inside, for the driver."""
    with (
        worker_warnings.recording(sinks.warnings),
        worker_logs.recording(sinks.logs, sinks.log_levels),
    ):
        yield


def _bundle_inputs(spec: StageSpec, batches: Iterable[pa.RecordBatch]) -> Iterator[Bundle]:
    """The encoded elements of each bundle: one per batch, or per run of whole keys.

    A stage reading text files natively gets a batch of byte ranges: its bundle's input is
    their lines, read as the bundle runs.
    """
    if spec.stateful:
        yield from complete_key_groups((b.column(KEY), b.column(ELEMENT)) for b in batches)
        return
    if spec.text_read_header is not None:
        for batch in batches:
            ranges = [TextRange.decode(cell) for cell in batch.column(ELEMENT).to_pylist()]
            yield TextInput(ranges, spec.text_read_header)
        return
    for batch in batches:
        yield packed_bytes(batch.column(ELEMENT))


def run_stage(
    spec: StageSpec, batches: Iterable[pa.RecordBatch], sinks: TaskSinks = NO_SINKS
) -> Iterator[pa.RecordBatch]:
    """The body of the stage's ``mapInArrow``.

    A stateless stage runs one bundle per input batch. A stateful stage reads a partition
    sorted by key and runs whole keys at a time: their elements, then their timers.
    """
    return run_stage_bundles(spec, _bundle_inputs(spec, batches), sinks)


def run_stage_bundles(
    spec: StageSpec, bundles: Iterable[Bundle], sinks: TaskSinks = NO_SINKS
) -> Iterator[pa.RecordBatch]:
    """Runs the stage over each bundle's input (see :func:`run_stage`); yields its outputs.

    A bundle's input is its encoded elements, or an iterable of pieces of them: a native
    text read's (``TextInput``), a Spark stream's columns (``ValuesInput``).
    """
    worker: StageWorker | None = None
    with task_metrics(sinks.metrics, spec.name) as metrics:
        for data in bundles:
            if not data:
                continue
            if worker is None:
                # Set up on the first element: a task of an empty partition (a
                # GroupByKey's keys all hashed elsewhere) sets nothing up.
                with recording(sinks):
                    worker = stage_worker(spec)
                worker.drop_unfinalized()  # left over from a task of this worker that failed
            process = worker.process_keys if spec.stateful else worker.process
            outputs_of_bundle = process(data, metrics)
            while True:
                try:
                    with recording(sinks):
                        outputs = next(outputs_of_bundle, None)
                except StageExecutionError:
                    raise
                except Exception as error:  # noqa: BLE001 - re-raised with the stage's name
                    # The last exception only: Beam re-raises the user's error with the step
                    # name ("[while running ...]"), and its traceback ends in the user's code.
                    detail = "".join(traceback.format_exception(error, chain=False))
                    raise StageExecutionError(spec.display_name, detail) from error
                if outputs is None:
                    break
                yield from outputs.record_batches(
                    spec.outputs, worker.key_extractors, worker.aggregators
                )
                # Spark has taken the bundle's output: its finalization may run now.
                with recording(sinks):
                    worker.finalize_bundles()
