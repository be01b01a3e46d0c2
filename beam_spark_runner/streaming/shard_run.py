"""One micro-batch of one stateful shard: the skeleton the kinds of shard share.

A stateful level (``levels``) runs five kinds of shard: a GroupByKey's (``group_panes``), a
stateful DoFn's (``stateful``), an unbounded splittable DoFn's (``splittable``), a stage
with side inputs' (``side_inputs``) and a stateful DoFn's with side inputs
(``stateful_side_inputs``). ``ShardRun.run`` is the order all of them follow; a kind
supplies the steps that differ:

1. its state from the state store, or a new one expecting the node's producers;
2. the batch's rows read (``read``): the kind keeps the elements, the markers come back;
3. the elements processed against the *previous* input watermark (``before_watermark``);
4. the input watermark advanced from the markers;
5. what the new watermark makes ready (``after_watermark``), then timer rounds until none is
   due (``timer_round``, at ``timer_watermark``; once that is +inf, processing-time timers
   fire too);
6. what the kind settles before its state is written (``finish``);
7. its output rows, and its output watermark, the minimum of its input watermark and its
   hold (``hold``), as markers to its readers;
8. its state encoded, one value in the state store.

Outputs are taken as the steps yield them (``capture``): a pane of Beam's trigger driver
can be the list its state goes on filling.
"""

from __future__ import annotations

import contextlib
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.stage_worker import BundleOutputs, StageSpec
from beam_spark_runner.streaming.rows import (
    Row,
    framed_outputs,
    routed_marker,
    stage_output_rows,
)
from beam_spark_runner.streaming.topology import Node, Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, Marker, WatermarkState

# Timer rounds in one micro-batch before the runner says the timers keep re-arming.
MAX_TIMER_ROUNDS = 10_000

T = TypeVar("T")


class HasWatermarks(Protocol):
    """A shard's state: whatever else it keeps, its watermarks."""

    watermarks: WatermarkState


S = TypeVar("S", bound=HasWatermarks)
O = TypeVar("O")  # noqa: E741 - what a kind's steps yield


class ShardRun(ABC, Generic[S, O]):
    """One micro-batch of one shard of one kind; made per batch, so it may keep the batch's data."""

    def run_encoded(
        self,
        topology: Topology,
        node: Node,
        shard: int,
        previous: bytes | None,
        rows: Iterable[Any],
    ) -> tuple[bytes, list[Row]]:
        """``run`` between the state store's values: the shard's new value and its rows."""
        with self.storing():
            state, out = self.run(
                topology, node, shard, self.decode(previous) if previous else None, rows
            )
            encoded = self.encode(state)
            self.release(state)
        return encoded, out

    def run(
        self, topology: Topology, node: Node, shard: int, state: S | None, rows: Iterable[Any]
    ) -> tuple[S, list[Row]]:
        """One micro-batch: the shard's new state and the rows it emits."""
        if state is None:
            state = self.new_state(WatermarkState(expected=node.expected))
        markers = self.read(node, state, rows)
        outputs = [self.capture(output) for output in self.step(state, markers)]
        watermarks = state.watermarks
        output = watermarks.output(self.hold(state), self.main_input_watermark(node, state))
        out = self.rows(topology, node, outputs)
        out.extend(routed_marker(topology, node, shard, output, watermarks.processing_time))
        return state, out

    def step(self, state: S, markers: list[Marker]) -> Iterator[O]:
        """Steps 3 to 6 of the module's docstring; yields the outputs as they come."""
        with self.running(state):
            yield from self.before_watermark(state, markers)
            state.watermarks.advance(markers)
            yield from self.after_watermark(state)
            yield from self._timer_rounds(state)
        self.finish(state)

    def _timer_rounds(self, state: S) -> Iterator[O]:
        watermarks = state.watermarks
        micros = self.timer_watermark(state)
        watermark = Timestamp(micros=micros)
        done = micros >= MAX_MICROS
        now = MAX_TIMESTAMP if done else Timestamp(micros=watermarks.processing_time)
        for _ in range(MAX_TIMER_ROUNDS):
            fired = yield from self.timer_round(state, watermark, now)
            if not fired:
                return
        raise self.timers_keep_coming(MAX_TIMER_ROUNDS)

    @abstractmethod
    def new_state(self, watermarks: WatermarkState) -> S:
        """The state of a shard that has none yet."""

    @abstractmethod
    def decode(self, data: bytes) -> S:
        """The state ``encode`` wrote (or an earlier runner version did)."""

    @abstractmethod
    def encode(self, state: S) -> bytes:
        """The state as one state-store value."""

    def release(self, state: S) -> None:
        """Lets go of what the state holds once it is encoded."""

    def storing(self) -> contextlib.AbstractContextManager[Any]:
        """The context of decoding, running and encoding."""
        return contextlib.nullcontext()

    @abstractmethod
    def read(self, node: Node, state: S, rows: Iterable[Any]) -> list[Marker]:
        """Takes the batch's elements; returns its markers."""

    def running(self, state: S) -> contextlib.AbstractContextManager[Any]:
        """The context of the steps from the elements to the last timer round."""
        return contextlib.nullcontext()

    def before_watermark(self, state: S, markers: list[Marker]) -> Iterator[O]:
        """Processes the batch's elements against the previous input watermark."""
        yield from ()

    def after_watermark(self, state: S) -> Iterator[O]:
        """Runs what the advanced input watermark made ready."""
        yield from ()

    def timer_watermark(self, state: S) -> int:
        """The watermark event-time timers fire at (microseconds): the input watermark."""
        return state.watermarks.input_watermark

    def timer_round(
        self, state: S, watermark: Timestamp, now: Timestamp
    ) -> Generator[O, None, bool]:
        """Fires the timers due at ``watermark`` and processing time ``now``; whether any was."""
        yield from ()
        return False

    def timers_keep_coming(self, rounds: int) -> Exception:
        """The error when timers are still due after ``rounds`` rounds."""
        return RuntimeError(f"Timers fired {rounds} rounds in one micro-batch and keep coming.")

    def finish(self, state: S) -> None:
        """Settles what the state keeps, before its hold is read."""

    @abstractmethod
    def hold(self, state: S) -> int:
        """The shard's watermark hold (microseconds; ``MAX_MICROS`` for none)."""

    def main_input_watermark(self, node: Node, state: S) -> int | None:
        """The input watermark its output follows, where not the minimum over all producers."""
        return None

    def capture(self, output: O) -> Any:
        """An output as it is kept until the batch's rows are made."""
        return output

    @abstractmethod
    def rows(self, topology: Topology, node: Node, outputs: list[Any]) -> list[Row]:
        """The captured outputs as rows to the node's readers."""


def run_user_code(spec: StageSpec, call: Callable[[], T]) -> T:
    """``call()``; a user error is raised as a ``StageExecutionError`` naming the stage."""
    try:
        return call()
    except StageExecutionError:
        raise
    except Exception as error:  # noqa: BLE001 - re-raised with the stage's name
        raise StageExecutionError(spec.display_name, traceback.format_exc()) from error


def routed_outputs(
    topology: Topology, node: Node, spec: StageSpec, worker: Any, outputs: list[BundleOutputs]
) -> list[Row]:
    """A stage's bundle outputs as rows addressed to the readers of each output."""
    out: list[Row] = []
    unpacked = framed_outputs(topology, node)
    for bundle in outputs:
        for batch in bundle.record_batches(spec.outputs, worker.key_extractors, None, unpacked):
            out.extend(stage_output_rows(topology, node, batch))
    return out
