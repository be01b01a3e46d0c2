"""The runner's own DoFns and checks for the batched path give what Beam's own give."""

from __future__ import annotations

from typing import Any

from apache_beam.transforms import core
from apache_beam.transforms.window import GlobalWindow, IntervalWindow

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import batched_dofns, batched_policy
from beam_spark_runner.execution.batched_side_inputs import _PerWindowSideInput


class _CountingMap:
    """A side-input map that counts its look-ups."""

    def __init__(self) -> None:
        self.looked_up: list[Any] = []
        self.resets = 0

    def __getitem__(self, window: Any) -> Any:
        self.looked_up.append(window)
        return f"value of {window}"

    def is_globally_windowed(self) -> bool:
        return False

    def reset(self) -> None:
        self.resets += 1


def test_a_per_window_side_input_looks_each_window_up_once_until_reset() -> None:
    side_map = _CountingMap()
    side_input = _PerWindowSideInput(side_map)
    # Equal windows decoded apart are different objects: one look-up for both.
    first, same, other = IntervalWindow(0, 10), IntervalWindow(0, 10), IntervalWindow(10, 20)
    assert side_input[first] == side_input[same] == f"value of {first}"
    assert side_input[other] == f"value of {other}"
    assert side_input[GlobalWindow()] == side_input[GlobalWindow()]
    assert side_map.looked_up == [first, other, GlobalWindow()]
    side_input.reset()
    assert side_input[same] == f"value of {same}"
    assert side_map.looked_up[-1] is same and side_map.resets == 1


def test_key_with_none_dofns_are_fresh_copies_of_one_map() -> None:

    first, second = batched_dofns.key_with_none_dofn(), batched_dofns.key_with_none_dofn()
    assert first is not second
    assert type(first) is core.CallableWrapperDoFn
    assert list(first.process("v")) == list(second.process("v")) == [(None, "v")]
    assert bi.wrapped_callable(first) == bi.wrapped_callable(second)


def test_is_simple_callable_reads_the_process_method_as_beams_signature_does() -> None:
    import apache_beam as beam
    from apache_beam.runners import common

    class Plain(beam.DoFn):
        def process(self, element: Any) -> Any:
            yield element

    class Stamped(beam.DoFn):
        def process(self, element: Any, t: Any = beam.DoFn.TimestampParam) -> Any:
            yield element

    dofns = {
        "Map(lambda)": (beam.Map(lambda x: x).fn, True),
        "Map(float)": (beam.Map(float).fn, True),  # float(x=0, /): a plain default
        "Map(timestamp)": (beam.Map(lambda x, t=beam.DoFn.TimestampParam: x).fn, False),
        "Plain": (Plain(), True),
        "Stamped": (Stamped(), False),
    }
    for name, (dofn, expected) in dofns.items():
        defaults = common.DoFnSignature(dofn).process_method.defaults
        beams = (
            not any(isinstance(d, core._DoFnParam) for d in defaults)  # noqa: SLF001
            if type(dofn) is core.CallableWrapperDoFn
            else not defaults
        )
        assert batched_policy.is_simple_callable(dofn) is beams is expected, name
