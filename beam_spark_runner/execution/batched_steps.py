"""The batched path: a fused stage's stateless steps run step by step over a whole batch.

Steps that need nothing per element from the runner (Map, FlatMap, Filter, ``WindowInto``
with Beam's standard window functions, user DoFns taking only the element, timestamp, window
or iterable side inputs, a lifted combine's phases) run here one step at a time over the
batch's windowed values, through Beam's own ``DoFnRunner`` or with Beam's ``SimpleInvoker``
semantics, keeping Beam's outputs, bundle calls, metrics and errors. :func:`plan_batched_steps`
decides which (``execution.batched_plan``); the bundle processor runs the rest of the stage
from the unencoded *hand-off*. A stage of no steps whose outputs write its input's coder (a
*pass-through*) sends its encoded elements on as they are. Unlike Beam's path, a batch runs
a step at a time: a DoFn that mutates what it emitted (Beam forbids it) may see other values.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import random
import threading
import time
import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.pickled_runs import RunWriter, pickles_in_runs
from beam_spark_runner.execution import gc_pause
from beam_spark_runner.execution.batched_calls import CHUNK
from beam_spark_runner.execution.batched_direct_steps import (
    CombinePhaseStep,
    DirectStep,
    GlobalSidesStep,
    ParamsStep,
    WindowSidesStep,
)
from beam_spark_runner.execution.batched_plan import BatchedPlan
from beam_spark_runner.execution.batched_step_kinds import (
    PassStep,
    PrecombineStep,
    Step,
    WindowIntoStep,
)

_LOGGER = logging.getLogger(__name__)

# ``StepSpec.kind`` -> the class of its steps.
STEP_KINDS: dict[str, type[Step]] = {
    "runner": Step,
    "pass": PassStep,
    "precombine": PrecombineStep,
    "window_into": WindowIntoStep,
    "direct": DirectStep,
    "combine_phase": CombinePhaseStep,
    "params": ParamsStep,
    "global_sides": GlobalSidesStep,
    "window_sides": WindowSidesStep,
}


class SizeSampler:
    """Which elements of a PCollection to sample for their sizes, as Beam picks them.

    Beam's ``OperationCounters`` samples the first ten elements an operation sees, then
    about 10/N of the elements after the N-th (reservoir sampling's fast approximation: a
    random gap after each sample), over the operation's life, not per bundle. So does this,
    over the batched steps' life: a long-running stage samples ever fewer.
    """

    FIRST = 10

    def __init__(self) -> None:
        self.seen = 0
        self.next = 0  # the index of the next element to sample, over the life

    def pick(self, count: int) -> list[int]:
        """The indexes, in the next ``count`` elements, of those to sample."""
        start = self.seen
        end = self.seen = start + count
        picked: list[int] = []
        while self.next < end:
            picked.append(self.next - start)
            seen = self.next + 1
            if seen < self.FIRST:
                self.next = seen
            else:
                gap = math.floor(
                    math.log(1.0 - random.random()) / math.log(1.0 - self.FIRST / (seen + 1))
                )
                self.next = seen + gap
        return picked


class _Batch:
    """One batch on its way through the steps: counts, sizes, outputs, the hand-off."""

    def __init__(self, steps: BatchedSteps, runs: Mapping[str, int]) -> None:
        # A pass-through's input, as it came (pieces of encoded elements), and the end of
        # each element in their concatenation.
        self.passed: list[bytes] = []
        self.passed_ends: list[int] = []
        self._steps = steps
        self.counts = dict.fromkeys(steps.plan.coder_ids, 0)
        self.sizes: dict[str, list[int]] = {p: [] for p in steps.plan.coder_ids}
        self.handoff: list[Any] = []
        # Nanoseconds spent decoding the input and encoding each output.
        self.io_nanos = dict.fromkeys(
            [steps.plan.input_transform_id, *steps.plan.direct_outputs], 0
        )
        self.outputs: dict[str, tuple[Any, list[int]]] = {
            transform_id: (bi.create_OutputStream(), [])
            for transform_id in steps.plan.direct_outputs
        }
        # The outputs that go in pickled runs (until a value may not).
        self.runs: dict[str, RunWriter] = {
            transform_id: RunWriter(steps.run_coders[transform_id], parts)
            for transform_id, parts in runs.items()
            if transform_id in steps.run_coders
        }

    def emit(self, pcollection: str, values: list[Any]) -> None:
        """Hands ``values`` of ``pcollection`` to its readers, counted and size-sampled."""
        if not values:
            return
        steps = self._steps
        picked = self._count(pcollection, len(values))
        if picked:
            self._sample(pcollection, [values[i] for i in picked])
        if pcollection == steps.handoff_pcollection:
            self.handoff.extend(values)
        for transform_id in steps.outputs_of.get(pcollection, ()):
            stream, ends = self.outputs[transform_id]
            began = time.perf_counter_ns()
            writer = self.runs.get(transform_id)
            if writer is None:
                _encode_into(steps.outputs[transform_id][1], values, stream, ends)
            elif not writer.add(values):  # then every element, one at a time
                del self.runs[transform_id]
                _encode_into(steps.outputs[transform_id][1], writer.give_up(), stream, ends)
                _encode_into(steps.outputs[transform_id][1], values, stream, ends)
            self.io_nanos[transform_id] += time.perf_counter_ns() - began
        for step in steps.readers.get(pcollection, ()):
            step.process(values, functools.partial(self.emit, step.spec.output_pcollection))

    def _count(self, pcollection: str, count: int) -> list[int]:
        """Counts a chunk of ``count`` elements; returns which of them to sample for sizes."""
        self.counts[pcollection] += count
        return self._steps.samplers[pcollection].pick(count)

    def _sample(self, pcollection: str, values: list[Any]) -> None:
        estimate = self._steps.sizes[pcollection].estimate_size
        self.sizes[pcollection].extend(map(estimate, values))

    def pass_through(self, pieces: Iterable[bytes]) -> None:
        """A pass-through's input (see the module doc): where its elements end, counted.

        Only the elements sampled for their sizes are decoded, as ``emit`` samples them.
        """
        steps = self._steps
        assert steps.pass_through is not None
        read = steps.pass_through.decode_from_stream
        decode = steps.input_impl.decode_nested
        input_id = steps.plan.input_transform_id
        pcollection = steps.plan.input_pcollection
        offset = self.passed_ends[-1] if self.passed_ends else 0
        for piece in pieces:
            began = time.perf_counter_ns()
            stream = bi.create_InputStream(piece)
            remaining = stream.size
            size = len(piece)
            ends: list[int] = []  # in the piece
            while remaining():
                read(stream, True)
                ends.append(size - remaining())
            self.io_nanos[input_id] += time.perf_counter_ns() - began
            for chunk in range(0, len(ends), CHUNK):
                picked = self._count(pcollection, min(CHUNK, len(ends) - chunk))
                if picked:
                    sampled = [chunk + i for i in picked]
                    self._sample(
                        pcollection,
                        [decode(piece[ends[i - 1] if i else 0 : ends[i]]) for i in sampled],
                    )
            self.passed.append(piece)
            self.passed_ends.extend([offset + end for end in ends] if offset else ends)
            offset += size

    def encoded_outputs(self) -> dict[str, tuple[bytes, list[int]]]:
        """Per data output, its encoded elements (or pickled runs) and each one's end."""
        if self._steps.pass_through is not None:
            data = self.passed[0] if len(self.passed) == 1 else b"".join(self.passed)
            return dict.fromkeys(self.outputs, (data, self.passed_ends))
        for transform_id, writer in self.runs.items():
            began = time.perf_counter_ns()
            stream, ends = self.outputs[transform_id]
            for run in writer.finish():
                stream.write(run)
                ends.append(stream.size())
            self.io_nanos[transform_id] += time.perf_counter_ns() - began
        return {
            transform_id: (stream.get(), ends)
            for transform_id, (stream, ends) in self.outputs.items()
        }


@typing.runtime_checkable
class ValuesInput(Protocol):
    """A batch's input that can make its windowed values without Beam's decoding.

    A Spark stream's columns (``streaming.spark_sources.ColumnsInput``). Iterated, it gives
    them encoded, for the bundle processor.
    """

    def __iter__(self) -> Iterator[bytes]: ...

    def windowed_values(self) -> Iterator[Any] | None:
        """The values the input coder would decode, in order; None where it cannot."""


def _encode_into(impl: Any, values: list[Any], out: Any, ends: list[int]) -> None:
    """Encodes windowed values as the data plane does, noting each element's end."""
    encode = impl.encode_to_stream
    size = out.size
    end = ends.append
    for value in values:
        encode(value, out, True)
        end(size())


@dataclasses.dataclass
class BatchResult:
    """What a batch gave: encoded stage outputs, the hand-off's input, monitoring infos."""

    # Data output transform id -> (encoded elements, each element's end).
    outputs: dict[str, tuple[bytes, list[int]]]
    # The encoded elements for the bundle processor (None: no hand-off).
    handoff: bytes | None
    monitoring_infos: list[Any]


class BatchedSteps:
    """The batched steps of one stage worker (see the module docstring).

    DoFns are set up before their first batch, torn down with the stage worker, when the
    process is idle (``tear_down_if_idle``) and after a failed batch (Beam discards a failed
    bundle's processor too), and set up anew from the descriptor when needed again.
    """

    def __init__(self, plan: BatchedPlan, display_name: str, state_handler: Any = None) -> None:
        """``state_handler`` serves the steps' side inputs (``reads_side_inputs``)."""
        self.plan = plan
        self.display_name = display_name
        coders = bi.PipelineContext(plan.coders).coders
        self.input_impl = coders[plan.input_coder_id].get_impl()
        self.outputs = {
            transform_id: (pcollection, coders[coder_id].get_impl())
            for transform_id, (pcollection, coder_id) in plan.direct_outputs.items()
        }
        self.handoff_pcollection = plan.handoff[0] if plan.handoff else None
        # A pass-through (see the module doc): reads where each input element ends.
        self.pass_through = (
            coders[plan.pass_through_coder_id].get_impl() if plan.pass_through_coder_id else None
        )
        self.sizes = {p: coders[c].get_impl() for p, c in plan.coder_ids.items()}
        # The outputs whose elements may go in pickled runs (``coders.pickled_runs``).
        self.run_coders = {
            transform_id: coders[coder_id]
            for transform_id, (_, coder_id) in plan.direct_outputs.items()
            if pickles_in_runs(coders[coder_id])
        }
        self.samplers = {p: SizeSampler() for p in plan.coder_ids}
        self._sampler = bi.state_sampler(display_name)
        self._steps = [
            STEP_KINDS[spec.kind](spec, self._sampler, state_handler) for spec in plan.steps
        ]
        self.reads_side_inputs = any(spec.side_inputs is not None for spec in plan.steps)
        self.readers: dict[str, list[Step]] = {}
        for step in self._steps:
            self.readers.setdefault(step.spec.input_pcollection, []).append(step)
        self.outputs_of: dict[str, list[str]] = {}
        for transform_id, (pcollection, _) in plan.direct_outputs.items():
            self.outputs_of.setdefault(pcollection, []).append(transform_id)
        self._lock = threading.Lock()
        self._set_up = False
        self.last_used = 0.0

    @property
    def step_names(self) -> list[str]:
        """The batched steps' names, in the order they run."""
        return [spec.step_name for spec in self.plan.steps]

    def run(
        self, data: bytes | Iterable[bytes], runs: Mapping[str, int] | None = None
    ) -> BatchResult:
        """Runs the batched steps over one batch of encoded elements (one bundle).

        ``data`` is the batch's elements, or pieces of them decoded as the steps need them
        (a native text read's blocks, ``execution.text_read.TextInput``), or a
        ``ValuesInput`` that makes the windowed values itself. The data outputs in ``runs``
        whose coder allows it give pickled runs (``coders.pickled_runs``), each group of
        windows and pane in the given number of parts, instead of one element at a time.

        The batch goes through the steps a chunk at a time (``CHUNK`` elements, outputs
        included), so few windowed values are alive at once, with Python's cyclic garbage
        collector paused (``execution.gc_pause``: Beam's operation chain frees each element
        before the next is made, so the collector never runs there).
        """
        with self._lock:
            previous = bi.get_current_tracker()
            batch = _Batch(self, runs or {})
            try:
                with gc_pause.paused():
                    if not self._set_up:
                        self._set_up = True
                        # Beam sets its operations up outside any bundle: no metrics
                        # container is current, and what ``setup`` counts is not reported.
                        bi.set_current_tracker(None)
                        for step in self._steps:
                            step.set_up()
                    bi.set_current_tracker(self._sampler)
                    # Beam starts a bundle's operations downstream first, finishes upstream
                    # first.
                    for step in reversed(self._steps):
                        step.start()
                    if self.pass_through is not None:
                        batch.pass_through([data] if isinstance(data, bytes) else data)
                    else:
                        self._decode_and_emit(data, batch)
                    for step in self._steps:
                        batch.emit(step.spec.output_pcollection, step.finish())
                    outputs = batch.encoded_outputs()
            except BaseException:
                bi.record_failed_bundle_monitoring_infos(self._monitoring_infos(batch))
                self._tear_down_locked("a batch failed")
                raise
            finally:
                bi.set_current_tracker(previous)
                self.last_used = time.time()
            handoff = None
            if self.handoff_pcollection is not None:
                handoff = bi.hand_off(self.plan.token, batch.handoff)
            return BatchResult(outputs, handoff, self._monitoring_infos(batch))

    def _decode_and_emit(self, data: bytes | Iterable[bytes], batch: _Batch) -> None:
        """The batch's input values, a chunk at a time, through the steps."""
        decode = self.input_impl.decode_all
        made = data.windowed_values() if isinstance(data, ValuesInput) else None
        if made is not None:
            values = made
        elif isinstance(data, bytes):
            values = decode(data)
        else:
            values = itertools.chain.from_iterable(map(decode, data))
        input_id = self.plan.input_transform_id
        while True:
            began = time.perf_counter_ns()
            chunk = list(itertools.islice(values, CHUNK))
            batch.io_nanos[input_id] += time.perf_counter_ns() - began
            if not chunk:
                break
            batch.emit(self.plan.input_pcollection, chunk)

    def _monitoring_infos(self, batch: _Batch) -> list[Any]:
        """Per step and PCollection, as Beam's operations report them for a bundle.

        The hand-off PCollection is counted by the bundle processor's data input.
        """
        infos: list[Any] = []
        for step in self._steps:
            infos.extend(step.monitoring_infos())
        # The data input and outputs are operations of Beam's too: their times (decoding,
        # encoding), and the input's read index (the stage worker drops the one the bundle
        # processor reports for the hand-off).
        for transform_id, nanos in batch.io_nanos.items():
            infos.extend(bi.execution_time_monitoring_infos(transform_id, 0, nanos // 10**6, 0))
        read = batch.counts[self.plan.input_pcollection]
        infos.append(bi.read_index_monitoring_info(self.plan.input_transform_id, read))
        for pcollection, count in batch.counts.items():
            if pcollection == self.handoff_pcollection:
                continue
            sizes = batch.sizes[pcollection]
            summary = (sum(sizes), len(sizes), min(sizes), max(sizes)) if sizes else (0, 0, 0, 0)
            infos.extend(bi.pcollection_monitoring_infos(pcollection, count, summary))
        return infos

    def _tear_down_locked(self, why: str) -> int:
        if not self._set_up:
            return 0
        self._set_up = False
        _LOGGER.debug("Tearing down the batched steps of %s (%s)", self.display_name, why)
        for step in self._steps:
            try:
                step.tear_down()
            except Exception:  # noqa: BLE001 - as Beam: a teardown error fails nothing else
                _LOGGER.exception("Teardown of %s failed", step.spec.step_name)
        return 1

    def tear_down(self, why: str) -> None:
        """Tears down the steps' DoFns (a batch running meanwhile finishes first)."""
        with self._lock:
            self._tear_down_locked(why)

    def tear_down_if_idle(self, now: float, idle_seconds: float) -> int:
        """Tears down the DoFns if no batch ran for ``idle_seconds``; 1 if it did, else 0.

        A batch running now is never touched.
        """
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            if now - self.last_used < idle_seconds:
                return 0
            return self._tear_down_locked("idle")
        finally:
            self._lock.release()
