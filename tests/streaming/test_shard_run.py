"""The skeleton every stateful shard runs on (``streaming.shard_run``): a fake kind, no Spark."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import pytest
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp

from beam_spark_runner.streaming.shard_run import MAX_TIMER_ROUNDS, ShardRun
from beam_spark_runner.streaming.topology import SINK, STAGE, Node, Topology
from beam_spark_runner.streaming.watermarks import MAX_MICROS, Marker, WatermarkState

_SOURCE = "0#0"


@dataclasses.dataclass
class _State:
    watermarks: WatermarkState
    timers: list[int] = dataclasses.field(default_factory=list)


class _Kind(ShardRun[_State, str]):
    """Records the steps in order; fires one timer per round while any is due."""

    def __init__(self, rearm: bool = False) -> None:
        self.steps: list[str] = []
        self.rearm = rearm

    def new_state(self, watermarks: WatermarkState) -> _State:
        return _State(watermarks)

    def decode(self, data: bytes) -> _State:
        state = pickle.loads(data)
        assert isinstance(state, _State)
        return state

    def encode(self, state: _State) -> bytes:
        self.steps.append("encode")
        return pickle.dumps(state)

    def release(self, state: _State) -> None:
        self.steps.append("release")

    def read(self, node: Node, state: _State, rows: Iterable[Any]) -> list[Marker]:
        markers = []
        for row in rows:
            if isinstance(row, Marker):
                markers.append(row)
            else:
                state.timers.append(row)
        return markers

    def before_watermark(self, state: _State, markers: list[Marker]) -> Iterator[str]:
        yield f"before at {state.watermarks.input_watermark}"

    def after_watermark(self, state: _State) -> Iterator[str]:
        yield f"after at {state.watermarks.input_watermark}"

    def timer_round(
        self, state: _State, watermark: Timestamp, now: Timestamp
    ) -> Generator[str, None, bool]:
        due = [t for t in state.timers if t <= watermark.micros]
        if not due:
            return False
        state.timers.remove(min(due))
        if self.rearm:
            state.timers.append(min(due))
        yield f"timer {min(due)} now {'max' if now == MAX_TIMESTAMP else now.micros}"
        return True

    def finish(self, state: _State) -> None:
        self.steps.append("finish")

    def hold(self, state: _State) -> int:
        return min(state.timers, default=MAX_MICROS)

    def capture(self, output: str) -> str:
        self.steps.append(output)
        return output

    def rows(self, topology: Topology, node: Node, outputs: list[Any]) -> list[Any]:
        return [("out", output) for output in outputs]


def _node() -> tuple[Topology, Node]:
    """A stateful node reading one source, with no readers of its own (only the sink)."""
    node = Node(1, "stage", STAGE, True, 1, ((),), expected=frozenset({_SOURCE}))
    return Topology((node,), {_SOURCE: (1,)}, 1, 1, frozenset()), node


def test_the_steps_run_in_order_and_the_output_watermark_follows_the_hold() -> None:
    topology, node = _node()
    kind = _Kind()
    rows: list[Any] = [5, 50, Marker(_SOURCE, 10, 3)]
    state, out = kind.run(topology, node, 0, None, rows)
    assert kind.steps == [
        f"before at {WatermarkState(frozenset()).input_watermark}",  # the previous watermark
        "after at 10",
        "timer 5 now 3",
        "finish",
    ]
    assert [row for row in out if row[0] == "out"] == [("out", step) for step in kind.steps[:3]]
    markers = [row for row in out if row[0] != "out"]
    assert {m[0] for m in markers} == {SINK}
    assert {m[5] for m in markers} == {10}  # min(input 10, the timer at 50)
    assert state.timers == [50]


def test_run_encoded_decodes_and_encodes_the_state() -> None:
    topology, node = _node()
    previous = pickle.dumps(_State(WatermarkState(frozenset({_SOURCE})), [20]))
    kind = _Kind()
    encoded, _ = kind.run_encoded(topology, node, 0, previous, [Marker(_SOURCE, MAX_MICROS, 0)])
    # Once the input is at +inf, processing-time timers fire too: "now" is the end of time.
    assert kind.steps[2:] == ["timer 20 now max", "finish", "encode", "release"]
    assert pickle.loads(encoded).timers == []


def test_timers_that_keep_coming_are_an_error() -> None:
    topology, node = _node()
    with pytest.raises(RuntimeError, match=f"{MAX_TIMER_ROUNDS} rounds"):
        _Kind(rearm=True).run(topology, node, 0, None, [1, Marker(_SOURCE, 10, 0)])
