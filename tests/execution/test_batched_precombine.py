"""The batched path's precombine gives what Beam's ``PGBKCVOperation`` gives."""

from __future__ import annotations

from typing import Any

import pytest
from apache_beam.transforms import combiners, core
from apache_beam.transforms.window import GlobalWindow, IntervalWindow

from beam_spark_runner.execution import batched_precombine


class _RecordingSum(core.CombineFn):  # type: ignore[misc]
    """A CombineFn summing, recording the runs ``add_inputs`` is given."""

    def __init__(self) -> None:
        self.runs: list[list[int]] = []
        # What ``add_input`` is given, one element at a time.
        self.singles: list[int] = []

    def create_accumulator(self) -> int:
        return 0

    def add_input(self, accumulator: int, element: int) -> int:
        self.singles.append(element)
        return accumulator + element

    def add_inputs(self, accumulator: int, elements: Any) -> int:
        self.runs.append(list(elements))
        return accumulator + sum(elements)

    def merge_accumulators(self, accumulators: Any) -> int:
        return sum(accumulators)

    def extract_output(self, accumulator: int) -> int:
        return accumulator


@pytest.mark.parametrize("default_windowing", [True, False])
def test_a_precombine_adds_each_run_of_one_window_and_key_at_once(
    default_windowing: bool,
) -> None:
    """Neighbours of one (window, key) reach the CombineFn's ``add_inputs`` together, in
    order; keys equal but not the same object join the run, ones equal across types start
    another, a run of one goes to ``add_input`` as Beam's operation adds each element;
    the accumulators are Beam's element-by-element ones."""
    from apache_beam.utils.windowed_value import WindowedValue

    combine_fn = _RecordingSum()
    precombine = batched_precombine._PrecombineDoFn(combine_fn, default_windowing, None, 1000)
    one, other = IntervalWindow(0, 10), IntervalWindow(10, 20)
    windows = [(GlobalWindow(),)] * 7 if default_windowing else [(one,)] * 4 + [(other,)] * 3
    # "ab" made anew is equal to, not the same object as, the first; 1.0 equals 1.
    keys = ["a", "a", "".join(["a", "b"]), "ab", 1, 1.0, 1.0]
    values = [
        WindowedValue((key, n), 5, w)
        for n, (key, w) in enumerate(zip(keys, windows, strict=True), start=1)
    ]
    precombine.start_bundle()
    assert precombine.add_all(values) == []
    assert combine_fn.runs == [[1, 2], [3, 4], [6, 7]]
    assert combine_fn.singles == [5]
    if default_windowing:
        expected = {"a": 3, "ab": 7, 1: 18}
    else:
        expected = {(one, "a"): 3, (one, "ab"): 7, (other, 1): 18}
    out = {
        (wv.value[0] if default_windowing else (wv.windows[0], wv.value[0])): wv.value[1]
        for wv in precombine.finish_bundle()
    }
    assert out == expected


def test_a_precombine_adds_elements_in_sliding_windows_one_by_one() -> None:
    """Elements each in two sliding windows make runs of one (window, key) each: each goes
    to the CombineFn's ``add_input``, as Beam's operation adds it, not ``add_inputs`` of a
    list of one; the accumulators per (window, key) are Beam's."""
    from apache_beam.utils.windowed_value import WindowedValue

    combine_fn = _RecordingSum()
    precombine = batched_precombine._PrecombineDoFn(combine_fn, False, None, 1000)
    early, late = IntervalWindow(0, 10), IntervalWindow(5, 15)
    values = [WindowedValue((key, n), 7, (early, late)) for n, key in enumerate("xyxy", 1)]
    precombine.start_bundle()
    assert precombine.add_all(values) == []
    assert combine_fn.runs == []
    assert combine_fn.singles == [1, 1, 2, 2, 3, 3, 4, 4]
    out = [(wv.windows, wv.value) for wv in precombine.finish_bundle()]
    assert out == [
        ((early,), ("x", 4)),
        ((late,), ("x", 4)),
        ((early,), ("y", 6)),
        ((late,), ("y", 6)),
    ]


def _precombined(combine_fn: Any, grouped: bool, max_keys: int, chunks: Any) -> list[Any]:
    """What a precombine outputs for ``chunks`` of windowed values: its flushes, then its
    table at the bundle's end, each as (windows, timestamp, (key, accumulator))."""
    precombine = batched_precombine._PrecombineDoFn(combine_fn, False, None, max_keys, grouped)
    precombine.start_bundle()
    out = [wv for chunk in chunks for wv in precombine.add_all(chunk)]
    out.extend(precombine.finish_bundle())
    return [(wv.windows, wv.timestamp, wv.value) for wv in out]


@pytest.mark.parametrize(
    "combine_fn",
    [
        combiners.CountCombineFn(),
        combiners.MeanCombineFn(),
        core.CombineFn.maybe_from_callable(sum),
        core.CombineFn.maybe_from_callable(min),
    ],
    ids=["count", "mean", "sum", "min"],
)
@pytest.mark.parametrize("max_keys", [1000, 7])
def test_a_grouped_precombine_gives_the_element_by_element_outputs(
    combine_fn: Any, max_keys: int
) -> None:
    """A builtin CombineFn's precombine groups values per key while the windows stay the
    same: the same accumulators (float sums added in Beam's order), entries in Beam's
    order, and, with a small table, Beam's flushes at the same elements."""
    from apache_beam.utils.windowed_value import WindowedValue

    sliding = [IntervalWindow(s, s + 10) for s in range(0, 30, 2)]
    # Runs of elements in the same (cached) windows, a run of equal windows made apart,
    # an element in no window, windows going back; several keys interleaved.
    groups = [
        sliding[0:5],
        sliding[0:5],
        [IntervalWindow(w.start, w.end) for w in sliding[0:5]],
        [],
        sliding[1:6],
        sliding[0:5],
        [GlobalWindow()],
    ]
    values = [
        WindowedValue((f"k{(n * 7) % 5}", n / 3), 5, groups[(n // 4) % len(groups)])
        for n in range(300)
    ]
    chunks = [values[i : i + 37] for i in range(0, len(values), 37)]
    grouped = _precombined(combine_fn, True, max_keys, chunks)
    each = _precombined(combine_fn, False, max_keys, chunks)
    assert grouped == each
    assert len(grouped) > (20 if max_keys == 7 else 10)


def test_a_grouped_sum_adds_each_value_by_add_input_as_beam_does() -> None:
    """A wrapped ``sum`` sums its buffer when full: given longer runs, Python's ``sum`` of
    floats (compensated from 3.12) could round otherwise than Beam's element by element."""
    from apache_beam.utils.windowed_value import WindowedValue

    def refused(accumulator: Any, elements: Any) -> Any:
        raise AssertionError("a wrapped sum's values go to add_input one by one")

    sliding = [IntervalWindow(s, s + 10) for s in range(0, 10, 2)]
    values = [WindowedValue((n % 3, 0.1 * n), 5, list(sliding)) for n in range(100)]
    outputs = []
    for grouped in (True, False):
        combine_fn = core.CombineFn.maybe_from_callable(sum)
        combine_fn.add_inputs = refused
        outputs.append(_precombined(combine_fn, grouped, 1000, [values]))
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == 3 * len(sliding)


class _KeepingMean(combiners.MeanCombineFn):  # type: ignore[misc]
    """A user's subclass of a builtin CombineFn: it may keep what ``add_inputs`` is given."""


@pytest.mark.parametrize(
    ("combine_fn", "grouped"),
    [
        (combiners.CountCombineFn(), True),
        (combiners.MeanCombineFn(), True),
        (core.CombineFn.maybe_from_callable(max), True),
        (_KeepingMean(), False),
    ],
    ids=["count", "mean", "max", "subclass"],
)
def test_only_beams_own_builtin_combine_fns_are_grouped(combine_fn: Any, grouped: bool) -> None:
    from apache_beam.portability.api import beam_runner_api_pb2
    from apache_beam.runners import pipeline_context
    from apache_beam.transforms import window

    context = pipeline_context.PipelineContext()
    payload = beam_runner_api_pb2.CombinePayload(
        combine_fn=combine_fn.to_runner_api(context)
    ).SerializeToString()
    windowing = core.Windowing(window.SlidingWindows(10, 2))
    dofn = batched_precombine.precombine_dofn(payload, context, windowing)
    assert dofn._grouped is grouped
    default = batched_precombine.precombine_dofn(
        payload, context, core.Windowing(window.GlobalWindows())
    )
    assert default._grouped is False
