"""One fused stage's Beam SDK worker in a Spark Python worker process: runs its bundles.

Beam's ``SdkWorker`` with a bundle processor cache, fed through :class:`ArrowDataChannel`,
with side inputs and user state served by a state backend (``execution.state``). A stateful
stage runs whole keys at a time and fires their timers (``execution.timers``). A stage's
stateless steps may run batched before the bundle processor (``execution.batched_steps``).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import KeyExtractor
from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.batched_plan import plan_batched_steps
from beam_spark_runner.execution.batched_steps import BatchedSteps
from beam_spark_runner.execution.bundle_outputs import BundleOutputs
from beam_spark_runner.execution.data_channel import ArrowDataChannel, ArrowDataChannelFactory
from beam_spark_runner.execution.partial_aggregation import PartialAggregator
from beam_spark_runner.execution.stage_spec import StageSpec
from beam_spark_runner.execution.state import InMemoryStateBackend, StateBackend
from beam_spark_runner.execution.text_read import TextInput
from beam_spark_runner.execution.timers import PendingTimers, TimerFamilyId, timer_families
from beam_spark_runner.monitoring.metrics import TaskMetrics

_LOGGER = logging.getLogger(__name__)

# A bundle's input: its encoded elements, or pieces of them read as the bundle runs (a
# native text read's ``TextInput``; a Spark stream's columns, ``batched_steps.ValuesInput``).
Bundle = bytes | Iterable[bytes]


# An SDF may ask to be resumed after a delay; in batch the runner waits, up to this long.
_MAX_RESUME_DELAY_SECONDS = 5.0
# Decoded side inputs a stage worker's SDK state cache may keep across bundles.
_SIDE_INPUT_CACHE_BYTES = 256 << 20


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
            sampling_period_ms=BUNDLE_SAMPLING_PERIOD_MS,
        )
        self.processor_cache = processor_cache
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

    def serve_side_inputs(self, servicer: Any, token: str) -> None:
        """Serves bundles the side inputs ``servicer`` holds (a streaming shard's, per batch).

        ``servicer`` answers the SDK's side-input state requests (``get_raw``); ``token``
        names its contents: the SDK caches decoded side inputs by it, so new contents need a
        new token.
        """
        self.state.serve_side_inputs(servicer)
        # Processors built from now on resolve global-window side inputs per element.
        self.processor_cache.side_inputs_change = True
        self.cache_tokens = _side_input_cache_tokens(self._side_inputs, token)

    def _run_batched(self, data: Bundle, runs: Mapping[int, int]) -> Any:
        """The batched steps over ``data``; a step with side inputs reads them from state.

        ``runs``: output index -> parts, the outputs asked for in pickled runs.
        """
        assert self.batched is not None
        outputs = self.spec.outputs
        by_id = {  # a keyed output's elements each carry their key: never in runs
            outputs[index].transform_id: parts
            for index, parts in runs.items()
            if not outputs[index].key_coder_id
        }
        if not self.batched.reads_side_inputs:
            return self.batched.run(data, by_id)
        with self.state_handler.process_instruction_id(
            f"{self._instruction_id()}-batched", self.cache_tokens
        ):
            return self.batched.run(data, by_id)

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
        runs: Mapping[int, int] | None = None,
    ) -> list[Any]:
        """Runs one bundle over ``data`` and ``timers``; returns its SDF residuals.

        Timers the bundle sets go into ``pending`` (stateful stages only). With
        ``batched`` (a bundle of the stage's input, not of residuals or timers), the
        stage's batched steps run first and hand their output to the bundle processor;
        the outputs in ``runs`` (index -> parts) may come from them as pickled runs
        (``execution.batched_steps.BatchedSteps.run``).
        """
        handed_off = False
        if batched and self.batched is not None and not timers:
            result = self._run_batched(data, runs or {})
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
        runs: Mapping[int, int] | None = None,
    ) -> Iterator[BundleOutputs]:
        """Runs one bundle, then its SDF residuals until none remain, yielding each output.

        The caller hands each bundle's output to Spark before asking for the next one, and
        finalizes the bundle in between (:meth:`finalize_bundles`): a self-checkpointing
        SDF sees its bundle finalized before its residual resumes.
        """
        outputs = BundleOutputs(len(self.spec.outputs))
        residuals = self._run_once(data, outputs, metrics, timers, pending, True, runs)
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

    def process(
        self, data: Bundle, metrics: TaskMetrics, runs: Mapping[int, int] | None = None
    ) -> Iterator[BundleOutputs]:
        """Runs one bundle over ``data``, then its SDF residuals; yields each's output.

        ``runs``: output index -> parts, the outputs that may give pickled runs
        (``coders.pickled_runs``), each group of windows and pane in that many parts.
        """
        yield from self._bundles(data, metrics, runs=runs)

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
