"""The batched path's kinds of step, one class each, chosen once per step by its plan.

Every kind runs its step's DoFn through Beam's ``DoFnRunner`` for set-up, bundles and
teardown, with its own metrics container and timings (:class:`Step`); what differs is how a
chunk of windowed values is processed (``_process``). The plan
(``execution.batched_plan.StepSpec.kind``) names the kind; ``batched_steps.STEP_KINDS``
maps it to its class. The kinds that call a function directly are in
``execution.batched_direct_steps``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from apache_beam.transforms.window import GlobalWindow

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import batched_dofns
from beam_spark_runner.execution.batched_calls import (
    CHUNK,
)
from beam_spark_runner.execution.batched_plan import StepSpec

_WITH_VALUE = bi.WindowedValue.with_value
_TIMESTAMPED = bi.TimestampedValue
# What ``next`` gives an iterator that has ended.
_END = object()
_GLOBAL_WINDOW = GlobalWindow()


def _nanos_to_ms(nanos: int) -> int:
    return nanos // 1_000_000


class Step:
    """A batched step whose elements go through Beam's ``DoFnRunner`` one by one.

    The base of every kind: its DoFn set up, started, finished and torn down as Beam's
    ``DoOperation`` does, its metrics and timings.
    """

    # What a kind of step reads or binds, for its tests and stage worker to see.
    reads_global_sides = False
    reads_window_sides = False
    params_of: Callable[[Any], tuple[Any, ...]] | None = None
    per_window = False

    def __init__(self, spec: StepSpec, sampler: Any, state_handler: Any = None) -> None:
        self.spec = spec
        self.state_handler = state_handler
        # A ParDo's side-input maps (read through the stage's state handler), reset after
        # each batch.
        self.side_inputs: list[Any] = []
        self.receiver = bi.ListReceiver()
        self.container = bi.metrics_container(spec.step_name)
        self.states = [
            bi.scoped_state(sampler, spec.step_name, spec.transform_id, name, self.container)
            for name in ("start", "process", "finish")
        ]
        self.runner: Any = None
        self.nanos = [0, 0, 0]

    def set_up(self) -> None:
        dofn, windowing, args, kwargs = self.spec.make_dofn()
        if self.spec.side_inputs is not None:
            self.side_inputs = self.spec.side_inputs(self.state_handler)
        self.runner = bi.dofn_runner(
            dofn,
            windowing,
            self.receiver,
            self.spec.step_name,
            self.spec.transform_id,
            args,
            kwargs,
            self.side_inputs,
        )
        self._set_up(dofn, windowing, args, kwargs)
        with self.states[0]:
            self.runner.setup()

    def _set_up(
        self, dofn: Any, windowing: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """What the kind keeps of its fresh DoFn, before Beam's ``setup``."""

    def tear_down(self) -> None:
        runner, self.runner = self.runner, None
        self.side_inputs = []
        self._tear_down()
        if runner is not None:
            with self.states[2]:
                runner.teardown()

    def _tear_down(self) -> None:
        """Drops what ``_set_up`` kept."""

    def start(self) -> None:
        self.receiver.values = []
        began = time.perf_counter_ns()
        with self.states[0]:
            self.runner.start()
        self.nanos[0] += time.perf_counter_ns() - began

    def process(self, values: list[Any], sink: Callable[[list[Any]], None]) -> None:
        """Processes ``values``, handing the outputs to ``sink`` every ``CHUNK`` or so.

        A FlatMap may give many outputs per element: they go downstream in chunks, not all
        at once. The time ``sink`` takes is not this step's.
        """
        began = time.perf_counter_ns()

        def flush() -> None:
            nonlocal began
            outputs, self.receiver.values = self.receiver.values, []
            self.nanos[1] += time.perf_counter_ns() - began
            sink(outputs)
            began = time.perf_counter_ns()

        # A DoFn's outputs (and those of Beam's output handler) go on as they fill a chunk,
        # even while the DoFn is still iterating over one element's outputs.
        self.receiver.full, self.receiver.limit = flush, CHUNK
        try:
            with self.states[1]:
                self._process(values, flush)
        finally:
            self.receiver.full, self.receiver.limit = None, sys.maxsize
        self.nanos[1] += time.perf_counter_ns() - began
        outputs, self.receiver.values = self.receiver.values, []
        sink(outputs)

    def _process(self, values: list[Any], flush: Callable[[], None]) -> None:
        process = self.runner.process
        for windowed_value in values:
            process(windowed_value)

    def finish(self) -> list[Any]:
        """Finishes the bundle; returns what ``finish_bundle`` output."""
        began = time.perf_counter_ns()
        with self.states[2]:
            self.runner.finish()
        self.nanos[2] += time.perf_counter_ns() - began
        outputs, self.receiver.values = self.receiver.values, []
        # As Beam's DoOperation.reset: the next batch reads the side inputs again.
        for side_input in self.side_inputs:
            side_input.reset()
        self._end_batch()
        return outputs

    def _end_batch(self) -> None:
        """Drops what held for one batch only."""

    def _reraise(self, error: BaseException) -> None:
        """Re-raises ``error`` as Beam's ``DoFnRunner`` does: the message names the step."""
        bi.reraise_augmented(self.runner, error, None)

    def monitoring_infos(self) -> list[Any]:
        """The step's user metrics and timings since the last call (then reset)."""
        infos = bi.user_monitoring_infos(self.container, self.spec.transform_id)
        infos.extend(
            bi.execution_time_monitoring_infos(
                self.spec.transform_id, *(_nanos_to_ms(n) for n in self.nanos)
            )
        )
        self.container.reset()
        self.nanos = [0, 0, 0]
        return infos


class PassStep(Step):
    """A Flatten of one input: each windowed value passed on as it is, as Beam's operation."""

    def _process(self, values: list[Any], flush: Callable[[], None]) -> None:
        self.receiver.values.extend(values)


class PrecombineStep(Step):
    """A lifted combine's precombine: its table takes a chunk at a time (``add_all``)."""

    precombine: Any = None

    def _set_up(
        self, dofn: Any, windowing: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.precombine = dofn

    def _tear_down(self) -> None:
        self.precombine = None

    def _process(self, values: list[Any], flush: Callable[[], None]) -> None:
        """The precombine's table takes the chunk; what it flushes goes on."""
        try:
            self.receiver.values.extend(self.precombine.add_all(values))
        except BaseException as error:  # noqa: BLE001 - re-raised naming the step, as Beam
            self._reraise(error)
            raise


class WindowIntoStep(Step):
    """``WindowInto`` with Beam's standard windows: new windows by timestamp, from a cache."""

    # The new windows of an element in one window, by its timestamp in µs.
    assign: Callable[[int], Any] | None = None

    def _set_up(
        self, dofn: Any, windowing: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.assign = batched_dofns.window_assigner(dofn)

    def _tear_down(self) -> None:
        self.assign = None

    def _process(self, values: list[Any], flush: Callable[[], None]) -> None:
        """What Beam's ``WindowIntoDoFn`` outputs, windows from a cache.

        An element in one window becomes ``WindowedValue(value, timestamp, new windows)``
        (no pane), as the DoFn yields it; any other goes through Beam's DoFnRunner (one
        output per window).
        """
        assign = self.assign
        if assign is None:  # not one of Beam's standard window functions after all
            super()._process(values, flush)
            return
        make = bi.create_windowed_value  # from the timestamp in µs, as the input has it
        append = self.receiver.values.append
        for windowed_value in values:
            if len(windowed_value.windows) == 1:
                micros = windowed_value.timestamp_micros
                append(make(windowed_value.value, micros, assign(micros)))
            else:
                self.runner.process(windowed_value)
