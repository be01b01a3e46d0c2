"""The batched path for stateless steps against Beam's bundle processor, in process.

Each test plans a pipeline, runs the stage holding the steps under test through a
``StageWorker`` with the batched path on and off, and compares the encoded outputs byte for
byte (values, timestamps, windows, panes), the element counts and the user metrics.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import random
import time
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from unittest import mock

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.metrics import Metrics
from apache_beam.transforms import window
from apache_beam.transforms.userstate import BagStateSpec
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner import planning
from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution import (
    batched_dofns,
    batched_policy,
    batched_side_inputs,
    text_read,
)
from beam_spark_runner.execution.batched_calls import CHUNK as _CHUNK
from beam_spark_runner.execution.batched_calls import with_arguments as _with_arguments
from beam_spark_runner.execution.batched_plan import plan_batched_steps
from beam_spark_runner.execution.batched_steps import SizeSampler
from beam_spark_runner.execution.side_inputs import side_input_state_entries
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    StageSpec,
    run_stage,
    stage_worker,
    tear_down_idle_dofns,
    tear_down_stage_workers,
)
from beam_spark_runner.execution.text_read import TextInput, TextRange
from beam_spark_runner.monitoring.metrics import TaskMetrics
from beam_spark_runner.planning import Plan, PlannedStage, build_plan
from tests.stage_specs import stage_spec

_RUNS = itertools.count()
ELEMENTS = 40


class Source(beam.DoFn):
    """Elements with distinct timestamps and panes, in the global window."""

    def process(self, element: bytes) -> Iterator[WindowedValue]:
        for i in range(ELEMENTS):
            pane = PaneInfo(i % 2 == 0, i % 3 == 0, PaneInfoTiming.EARLY, i, -1)
            yield WindowedValue(i, Timestamp(micros=i * 1_700_123), [window.GlobalWindow()], pane)


class WithParams(beam.DoFn):
    """A DoFn reading the element's timestamp and window, counting what it sees."""

    def process(
        self,
        element: Any,
        timestamp: Any = beam.DoFn.TimestampParam,
        win: Any = beam.DoFn.WindowParam,
    ) -> Iterator[Any]:
        Metrics.counter("test", "seen").inc()
        Metrics.distribution("test", "values").update(int(element))
        yield element, int(timestamp.micros), repr(win)


class CountsAfterYielding(beam.DoFn):
    """A generator of 0, 1, 255, 256, 257 or 512 outputs, counting after its last one."""

    def process(self, element: int) -> Iterator[int]:
        for i in range((0, 1, 255, 256, 257, 512)[element % 6]):
            yield element * 1000 + i
        Metrics.counter("test", "ended").inc()


class InTwoWindows(beam.DoFn):
    """Each element in two windows, with a pane of its own (Beam's handler keeps both)."""

    def process(self, element: int) -> Iterator[WindowedValue]:
        pane = PaneInfo(False, element % 2 == 0, PaneInfoTiming.LATE, element, element)
        windows = [window.IntervalWindow(0, 10 + element), window.IntervalWindow(5, 15)]
        yield WindowedValue(element, Timestamp(micros=element * 1_000), windows, pane)


class FewOutputs(beam.DoFn):
    """None, one or two outputs per element, as an empty iterator, a tuple or a generator."""

    def process(self, element: int) -> Iterable[Any]:
        case = element % 6
        if case == 0:
            return iter(())
        if case == 1:
            return (element,)
        if case == 2:
            return (element, window.TimestampedValue(-element, Timestamp(element)))
        return self._generate(element, case)

    def _generate(self, element: int, case: int) -> Iterator[Any]:
        if case == 3:
            yield element
            yield window.TimestampedValue(element + 1, Timestamp(element * 2))
        elif case == 4:
            yield window.TimestampedValue(element, Timestamp(element * 3))
        Metrics.counter("test", "generated").inc()


class BundleOutputs(beam.DoFn):
    """Outputs from finish_bundle, after counting the bundle's elements."""

    def start_bundle(self) -> None:
        self.count = 0

    def process(self, element: Any) -> Iterator[Any]:
        self.count += 1
        if element % 5 == 0:
            yield element

    def finish_bundle(self) -> Iterator[WindowedValue]:
        Metrics.counter("test", "bundles").inc()
        yield WindowedValue(-self.count, Timestamp(7), [window.GlobalWindow()])


class Stateful(beam.DoFn):
    BUFFER = BagStateSpec("buffer", beam.coders.VarIntCoder())

    def process(self, element: Any, buffer: Any = beam.DoFn.StateParam(BUFFER)) -> Iterator[Any]:
        buffer.add(1)
        yield element


class PaneReader(beam.DoFn):
    """A DoFn with a parameter the batched path does not serve."""

    def process(self, element: Any, pane: Any = beam.DoFn.PaneInfoParam) -> Iterator[Any]:
        yield element, pane.index


class WithSide(beam.DoFn):
    """A user DoFn reading a side input and its window."""

    def process(self, element: Any, side: Any, win: Any = beam.DoFn.WindowParam) -> Iterator[Any]:
        Metrics.counter("test", "sides").inc()
        yield element, side, repr(win)


class SelectWithSide(beam.DoFn):
    """A user DoFn taking the element and a side input (Nexmark q7's form), counting."""

    def process(self, element: Any, side: Any) -> Iterator[Any]:
        Metrics.counter("test", "selected").inc()
        if element[0] % 2:
            yield element, type(side).__name__


class Selecting(beam.DoFn):
    """A user DoFn taking only the element; some outputs timestamped."""

    def process(self, element: Any) -> Iterator[Any]:
        if element % 3 == 1:
            yield element
        elif element % 3 == 2:
            yield window.TimestampedValue(element, Timestamp(element))


def _windowed_side(pc: Any, label: str = "") -> Any:
    """A side input in fixed windows of 10 s (its values: _side_input_state's)."""
    return beam.pvalue.AsSingleton(
        _side(pc, label) | f"SideWindows{label}" >> beam.WindowInto(window.FixedWindows(10))
    )


def _side(pc: Any, label: str = "") -> Any:
    """A side input's PCollection; its elements are _side_input_state's, not Create's."""
    return pc.pipeline | f"Side{label}" >> beam.Create([(0, 0)])


def _counted(x: int) -> int:
    Metrics.counter("test", "mapped").inc()
    return x * 3


def _three_maps(pc: Any) -> Any:
    """Three steps: with the source, enough to run batched before a hand-off."""
    return (
        pc
        | "One" >> beam.Map(lambda x: x + 1)
        | "Two" >> beam.Map(lambda x: x - 1)
        | "Three" >> beam.Map(lambda x: x + 1)
    )


STEPS: dict[str, Callable[[Any], Any]] = {
    "map": lambda pc: pc | beam.Map(_counted),
    "flat_map": lambda pc: pc | beam.FlatMap(lambda x: [x] * (x % 3)),
    "generators_around_a_chunk": lambda pc: pc | beam.ParDo(CountsAfterYielding()),
    "none_one_or_two_outputs": lambda pc: pc | beam.ParDo(FewOutputs()),
    # Beam's invoker calls a DoFn taking its window once per window, the element in that
    # window alone and with no pane (``PerWindowInvoker.invoke_process``).
    "several_windows_with_a_pane": lambda pc: (
        pc | beam.ParDo(InTwoWindows()) | beam.ParDo(WithParams())
    ),
    "filter": lambda pc: pc | beam.Filter(lambda x: x % 4 != 1),
    "map_tuple": lambda pc: (
        pc | beam.Map(lambda x: (x, str(x))) | beam.MapTuple(lambda a, b: f"{b}:{a + 1}")
    ),
    "flat_map_tuple": lambda pc: (
        pc | beam.Map(lambda x: (x, x % 3)) | beam.FlatMapTuple(lambda a, b: [a] * b)
    ),
    # Callables with plain defaults (no DoFn.*Param): str.split's are sep=None,
    # maxsplit=-1, float's x=0 (its only parameter); Beam's invoker calls them with the
    # element alone, or with extra arguments in their slots.
    "plain_defaults": lambda pc: (
        pc
        | beam.Map(lambda x: f"{x} {x + 1}")
        | beam.FlatMap(str.split)
        | beam.Map(lambda s, base=10: int(s, base))
        | beam.Map(lambda x, offset=0: x + offset, 7)
        | beam.Filter(lambda x, limit=30: x < limit)
        | beam.Map(float)
        | beam.Map(lambda x: (x, -x))
        | beam.Map(list)
    ),
    "timestamped_outputs": lambda pc: (
        pc | beam.FlatMap(lambda x: [window.TimestampedValue(x, 1000 - x), x])
    ),
    "timestamped_map": lambda pc: (
        pc
        | beam.Map(lambda x: window.TimestampedValue(x, x * 2) if x % 2 else x)
        | beam.Filter(lambda x: x % 3 != 0)
        | beam.WindowInto(window.FixedWindows(5))
        | beam.ParDo(WithParams())
    ),
    # Only TimestampedValues: windows from a cache (``batched_dofns.micros_windows``); in sliding
    # windows an element in three windows gets its three new windows three times, as Beam.
    "only_timestamped": lambda pc: (
        pc
        | beam.FlatMap(
            lambda x: [window.TimestampedValue(x, 1000 - x), window.TimestampedValue(-x, x)]
        )
        | beam.ParDo(WithParams())
    ),
    # A FlatMap's TimestampedValues read their element's windows once
    # (``DirectStep._timestamped_outputs``): in three sliding windows, in one fixed window,
    # from a generator (outputs in chunks), in the global window (above).
    "timestamped_flat_map_in_windows": lambda pc: (
        pc
        | beam.WindowInto(window.SlidingWindows(15, 5))
        | beam.FlatMap(
            lambda x: [window.TimestampedValue(x, x * 3), window.TimestampedValue(-x, x)]
        )
        | "InFixed" >> beam.WindowInto(window.FixedWindows(7))
        | "Stamped"
        >> beam.FlatMap(lambda x: (window.TimestampedValue(x + i, x * 2 + i) for i in range(300)))
        | beam.ParDo(WithParams())
    ),
    "timestamped_in_windows": lambda pc: (
        pc
        | beam.WindowInto(window.SlidingWindows(15, 5))
        | beam.Map(lambda x: window.TimestampedValue(x, x * 3))
        | "InFixed" >> beam.WindowInto(window.FixedWindows(7))
        | "Again" >> beam.Map(lambda x: window.TimestampedValue(x, x * 2))
        | beam.ParDo(WithParams())
    ),
    "dofn_params": lambda pc: pc | beam.ParDo(WithParams()),
    "map_params": lambda pc: (
        pc | beam.Map(lambda x, t=beam.DoFn.TimestampParam: (x, int(t.micros)))
    ),
    "extra_arguments": lambda pc: (
        pc
        | beam.Map(lambda x, n, m: x * n + m, 3, m=1)
        | beam.FlatMap(lambda x, times: [x] * (x % times), times=3)
        | beam.Filter(lambda x, odd: x % 2 == odd, 1)
        | beam.Map(lambda x, k: x + k, k=5)
    ),
    # Keyword arguments passed positionally where they bind so, else as keywords.
    "keyword_arguments": lambda pc: (
        pc
        | beam.Map(lambda x, a, b, c: x * a + b - c, 2, c=1, b=7)
        | beam.Map(lambda x, a=1, b=2: x * a + b, b=3)
        | beam.Map(lambda x, *, k: x + k, k=4)
        | beam.Map(lambda x, **kw: x + sum(kw.values()), p=1, q=2)
        | beam.FlatMap(lambda x, a, b, c, d: [x, a + b + c + d], 1, 2, 3, d=4)
    ),
    "bundle_outputs": lambda pc: pc | beam.ParDo(BundleOutputs()),
    "global_windows": lambda pc: (
        pc
        | beam.WindowInto(window.FixedWindows(10))
        | "Global" >> beam.WindowInto(window.GlobalWindows())
        | beam.ParDo(WithParams())
    ),
    "fixed_windows": lambda pc: (
        pc | beam.WindowInto(window.FixedWindows(10)) | beam.ParDo(WithParams())
    ),
    "sliding_windows": lambda pc: (
        pc
        | beam.WindowInto(window.SlidingWindows(15, 5))
        | beam.Map(lambda x: x + 1)
        | beam.ParDo(WithParams())
    ),
    # Windows from a cache (``batched_dofns.window_assigner``); after sliding windows each
    # element is in several, which the second ``WindowInto`` runs through Beam's DoFnRunner.
    "uneven_sliding_then_fixed": lambda pc: (
        pc
        | beam.WindowInto(window.SlidingWindows(10, 3, offset=1))
        | "Fixed" >> beam.WindowInto(window.FixedWindows(7, offset=2))
        | beam.ParDo(WithParams())
    ),
    # Inputs of other coders than the Flatten's output: Beam's fusion gives each input a
    # transcode in the stage.
    "flatten": lambda pc: (
        (
            pc | "Odd" >> beam.Filter(lambda x: x % 2),
            pc | "Tens" >> beam.Map(lambda x: str(x * 10)).with_output_types(str),
        )
        | beam.Flatten()
        | beam.Map(lambda x: f"{x}!")
    ),
    # A lifted combine's precombine (Beam's PGBKCVOperation), up to the GroupByKey's write.
    "combine_per_key": lambda pc: pc | beam.Map(lambda x: (x % 3, x)) | beam.CombinePerKey(sum),
    "count_per_element": lambda pc: (
        pc | beam.Map(lambda x: x % 7) | beam.combiners.Count.PerElement()
    ),
    # CombineGlobally's KeyWithVoid (Beam's _KeyWithNone, a DoFn by URN) and precombine.
    "combine_globally": lambda pc: pc | beam.Map(lambda x: x % 5) | beam.CombineGlobally(sum),
    "combine_globally_fixed": lambda pc: (
        pc | beam.WindowInto(window.FixedWindows(10)) | beam.CombineGlobally(max).without_defaults()
    ),
    # Builtin CombineFns in windows: values grouped per key while the windows stay the
    # same (``batched_precombine._PrecombineDoFn._add_grouped``).
    "count_sliding": lambda pc: (
        pc
        | beam.WindowInto(window.SlidingWindows(10, 2))
        | beam.Map(lambda x: x % 4)
        | beam.combiners.Count.PerElement()
    ),
    "sum_floats_sliding": lambda pc: (
        pc
        | beam.WindowInto(window.SlidingWindows(6, 2, offset=1))
        | beam.Map(lambda x: (x % 3, x / 7))
        | beam.CombinePerKey(sum)
    ),
    "mean_fixed": lambda pc: (
        pc
        | beam.WindowInto(window.FixedWindows(10))
        | beam.Map(lambda x: (x % 2, x))
        | beam.CombinePerKey(beam.combiners.MeanCombineFn())
    ),
    # Elements in several windows, the earliest timestamp kept, a CombineFn with compact.
    "combine_sliding_earliest": lambda pc: (
        pc
        | beam.WindowInto(
            window.SlidingWindows(15, 5),
            timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST,
        )
        | beam.Map(lambda x: (x % 2, x))
        | beam.CombinePerKey(beam.combiners.TopCombineFn(3))
    ),
    "combine_fixed_mean": lambda pc: (
        pc
        | beam.WindowInto(window.FixedWindows(10))
        | beam.Map(lambda x: (str(x % 4), float(x)))
        | beam.combiners.Mean.PerKey()
    ),
    "sessions": lambda pc: (
        pc
        | beam.WindowInto(window.Sessions(4))
        | beam.Map(lambda x, w=beam.DoFn.WindowParam: (x, repr(w)))
    ),
    # Side inputs read as iterables (each side input's elements: _side_input_state).
    "side_input": lambda pc: (
        _three_maps(pc)
        | beam.Map(lambda x, n: x + n[1], beam.pvalue.AsSingleton(_side(pc)))
        | beam.Map(_counted)
    ),
    "side_inputs_list_dict_iter": lambda pc: (
        pc
        | beam.Map(
            lambda x, as_list, as_dict, as_iter: (x, as_list, sorted(as_dict.items()), *as_iter),
            beam.pvalue.AsList(_side(pc)),
            beam.pvalue.AsDict(_side(pc, "Dict")),
            beam.pvalue.AsIter(_side(pc, "Iter")),
        )
    ),
    # By keyword, beside a plain extra argument (the side-input workload's form).
    "keyword_side_input": lambda pc: (
        pc
        | beam.Map(
            lambda x, k, weights: x * weights[5] + k, 2, weights=beam.pvalue.AsDict(_side(pc))
        )
    ),
    # Globally windowed side inputs read by Map/Filter/FlatMap over elements in fixed
    # windows: called directly, the side inputs read once per batch (as Beam's invoker).
    "global_sides_windowed_main": lambda pc: (
        pc
        | beam.WindowInto(window.FixedWindows(10))
        | beam.Filter(lambda x, one: x % 3 != one[0] % 3, beam.pvalue.AsSingleton(_side(pc)))
        | beam.FlatMap(lambda x, d: [x, x * d[5]], beam.pvalue.AsDict(_side(pc, "Dict")))
        | beam.ParDo(WithParams())
    ),
    # A windowed side input: each main window sees its own value (the mapping runs once
    # per window and batch), read by a user DoFn with a window parameter.
    "windowed_side_input": lambda pc: (
        pc
        | beam.WindowInto(window.FixedWindows(10))
        | beam.ParDo(
            WithSide(),
            beam.pvalue.AsSingleton(
                _side(pc) | "SideWindows" >> beam.WindowInto(window.FixedWindows(10))
            ),
        )
    ),
    # Windowed side inputs read by Map, FlatMap and a user DoFn taking the element and the
    # side input: called directly, bound once per window and batch.
    "windowed_side_direct": lambda pc: (
        pc
        | beam.WindowInto(window.FixedWindows(10))
        | beam.Map(lambda x, k: (x, k), _windowed_side(pc))
        | "Again" >> beam.Map(lambda xk, k: (*xk, k), _windowed_side(pc, "Again"))
        | beam.FlatMap(lambda xk, k: [xk, (xk[0], k)], _windowed_side(pc, "FlatMap"))
        | beam.ParDo(SelectWithSide(), _windowed_side(pc, "Select"))
    ),
    # Elements in two windows each: Beam's DoFnRunner calls once per window.
    "windowed_side_sliding": lambda pc: (
        pc
        | beam.WindowInto(window.SlidingWindows(20, 10))
        | beam.Map(lambda x, k: (x, k), _windowed_side(pc))
        | beam.ParDo(SelectWithSide(), _windowed_side(pc, "Select"))
    ),
    "user_dofn": lambda pc: pc | beam.ParDo(Selecting()),
    # Steps the batched path hands to the bundle processor.
    "multimap_side_input": lambda pc: (
        _three_maps(pc)
        | beam.Map(lambda x, m: x + len(m[5]), beam.pvalue.AsMultiMap(_side(pc)))
        | beam.Map(_counted)
    ),
    "pane_param": lambda pc: _three_maps(pc) | beam.ParDo(PaneReader()),
    "short_chain": lambda pc: pc | beam.Map(lambda x: x + 1) | beam.ParDo(PaneReader()),
}


def _stage(build: Callable[[Any], Any], run_id: str, batched: bool) -> StageSpec:
    p = beam.Pipeline()
    source = p | beam.Impulse() | "Source" >> beam.ParDo(Source())
    _ = build(source) | "Key" >> beam.Map(lambda x: (0, x)) | beam.GroupByKey()
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    (stage,) = [s for s in plan.stages if any("Source" in n for n in s.user_transform_names)]
    spec = stage_spec(plan, stage, run_id, keyed=False)
    return dataclasses.replace(
        spec, batched_steps=batched, side_input_state=_side_input_state(plan, stage)
    )


class _Broadcast(typing.NamedTuple):
    value: list[tuple[bytes, bytes]]


def _side_input_state(plan: Plan, stage: PlannedStage) -> _Broadcast | None:
    """The stage's side inputs, as the driver would broadcast them.

    Each is (5, 5) in the global window, or, for a side input in fixed windows of 10 s,
    (k, k) in window k for the source's windows.
    """
    if not stage.side_inputs:
        return None
    context = bi.PipelineContext(plan.components)
    entries: list[tuple[bytes, bytes]] = []
    for side_input in stage.side_inputs:
        data_channel_coder = plan.data_channel_coders[side_input.pcollection_id]
        coder = context.coders[plan.safe_coders[data_channel_coder]]
        sdk_coder = context.coders[data_channel_coder]
        strategy = plan.components.windowing_strategies[
            plan.components.pcollections[side_input.pcollection_id].windowing_strategy_id
        ]
        if strategy.window_fn.urn == bi.common_urns.global_windows.urn:
            values = [window.GlobalWindows.windowed_value((5, 5))]
        else:
            values = [
                WindowedValue(
                    (k, k), Timestamp(k * 10), [window.IntervalWindow(k * 10, k * 10 + 10)]
                )
                for k in range(8)
            ]
        entries.extend(
            side_input_state_entries(
                side_input.transform_id,
                side_input.tag,
                side_input.access_pattern_urn,
                [sdk_coder.encode(value) for value in values],
                coder,
            )
        )
    return _Broadcast(entries)


def _run(spec: StageSpec, bundles: int = 2) -> tuple[list[bytes], dict[Any, Any]]:
    """The stage's output elements and its merged metrics (name -> value)."""
    worker = stage_worker(spec)
    metrics = TaskMetrics()
    elements: list[bytes] = []
    for _ in range(bundles):
        for outputs in worker.process(bi.ENCODED_IMPULSE_VALUE, metrics):
            for batch in outputs.record_batches(spec.outputs, worker.key_extractors):
                elements.extend(batch.column(ELEMENT).to_pylist())
    return elements, _comparable_metrics(metrics.infos, worker.descriptor)


def _comparable_metrics(infos: list[Any], descriptor: Any) -> dict[Any, Any]:
    """Element counts per PCollection and user metrics per step, summed over bundles."""
    totals: dict[Any, Any] = collections.defaultdict(int)
    for info in infos:
        if info.urn == bi.monitoring_infos.ELEMENT_COUNT_URN:
            key = ("count", info.labels["PCOLLECTION"])
        elif info.urn in TIME_URNS:
            # Times differ run by run: only which steps report them must be the same.
            totals[("time", info.urn, info.labels["PTRANSFORM"])] = True
            continue
        elif info.urn == bi.monitoring_infos.DATA_CHANNEL_READ_INDEX:
            key = ("read index", info.labels["PTRANSFORM"])
        elif bi.is_user_monitoring_info(info):
            key = (info.urn, info.labels.get("PTRANSFORM"), info.labels.get("NAME"))
        else:
            continue
        value = bi.monitoring_infos.extract_metric_result_map_value(info)
        if isinstance(value, int):
            totals[key] += value
        else:
            totals[key] = (totals.get(key) or ()) + ((value.sum, value.count),)
    return dict(totals)


TIME_URNS = frozenset(
    [
        bi.monitoring_infos.START_BUNDLE_MSECS_URN,
        bi.monitoring_infos.PROCESS_BUNDLE_MSECS_URN,
        bi.monitoring_infos.FINISH_BUNDLE_MSECS_URN,
        bi.monitoring_infos.TOTAL_MSECS_URN,
    ]
)


def _compare(kind: str) -> tuple[list[bytes], dict[Any, Any], StageSpec]:
    return _compare_with(STEPS[kind], kind)


def _compare_with(
    build: Callable[[Any], Any], kind: str
) -> tuple[list[bytes], dict[Any, Any], StageSpec]:
    run = next(_RUNS)
    on = _stage(build, f"batched-on-{kind}-{run}", True)
    off = _stage(build, f"batched-off-{kind}-{run}", False)
    on_elements, on_metrics = _run(on)
    off_elements, off_metrics = _run(off)
    assert on_elements == off_elements
    assert on_metrics == off_metrics
    assert on_elements, "the stage gave no output"
    return on_elements, on_metrics, on


BATCHED_KINDS = [k for k in STEPS if k not in ("multimap_side_input", "pane_param", "short_chain")]


@pytest.mark.parametrize("kind", BATCHED_KINDS)
def test_batched_steps_give_the_bundle_processors_bytes_and_metrics(kind: str) -> None:
    _, metrics, spec = _compare(kind)
    worker = stage_worker(spec)
    assert worker.batched is not None
    # Everything up to the GroupByKey's write runs batched: no bundle processor.
    assert worker.batched.plan.remainder is None
    assert any(key[0] == "count" for key in metrics)
    tear_down_stage_workers()


def test_user_metrics_land_under_their_step() -> None:
    _, metrics, _ = _compare("dofn_params")
    counters = {key[1]: value for key, value in metrics.items() if key[-1] == "seen"}
    assert counters == {"ParDo(WithParams)": 2 * ELEMENTS}
    tear_down_stage_workers()


def _fan_out(pc: Any) -> Any:
    doubled = pc | "Double" >> beam.Map(lambda x: x * 2)
    _ = doubled | "Side" >> beam.Map(lambda x: (1, x)) | "SideGroup" >> beam.GroupByKey()
    return (
        doubled | "Plus" >> beam.Map(lambda x: x + 1),
        pc | "Minus" >> beam.Map(lambda x: -x),
    ) | beam.Flatten()


def test_a_stage_with_branches_gives_the_same_outputs() -> None:
    elements, _, spec = _compare_with(_fan_out, "fan_out")
    assert len(elements) == 3 * ELEMENTS * 2
    batched = stage_worker(spec).batched
    assert batched is not None and batched.plan.remainder is None
    assert len(batched.step_names) == 5
    tear_down_stage_workers()


@pytest.mark.parametrize("kind", ["multimap_side_input", "pane_param"])
def test_steps_that_do_not_qualify_keep_the_bundle_processor(kind: str) -> None:
    elements, _, spec = _compare(kind)
    assert len(elements) == 2 * ELEMENTS
    worker = stage_worker(spec)
    assert worker.batched is not None
    # The steps before it run batched and hand their output on.
    assert worker.batched.plan.remainder is not None
    assert worker.batched.step_names == ["Source", "One", "Two", "Three"]
    remaining = {t.unique_name for t in worker.descriptor.transforms.values()}
    assert "Source" not in remaining
    tear_down_stage_workers()


def test_a_pardo_reading_its_main_input_as_a_side_input_runs_once() -> None:
    """Beam's ``test_pardo_unfusable_side_inputs``: one PCollection, main and side input."""
    p = beam.Pipeline()
    pc = p | beam.Impulse() | "Source" >> beam.ParDo(Source())
    _ = (
        pc
        | "Cross" >> beam.FlatMap(lambda x, sides: [(x, s) for s in sides], beam.pvalue.AsList(pc))
        | "Key" >> beam.Map(lambda x: (0, x))
        | beam.GroupByKey()
    )
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    (stage,) = [s for s in plan.stages if any("Cross" in n for n in s.user_transform_names)]
    batched = plan_batched_steps(stage.descriptor, stage.input_transform_id)
    assert batched is not None
    names = [spec.step_name for spec in batched.steps]
    assert names.count("Cross") == 1, names


def test_a_hand_off_after_a_short_chain_keeps_the_bundle_processor() -> None:
    """A hand-off costs more than a few batched steps save (MIN_STEPS_BEFORE_HANDOFF)."""
    elements, _, spec = _compare("short_chain")
    assert len(elements) == 2 * ELEMENTS
    assert stage_worker(spec).batched is None
    tear_down_stage_workers()


def test_a_stateful_dofn_is_never_batched() -> None:
    p = beam.Pipeline()
    _ = (
        p
        | beam.Create([(1, 2), (1, 3)])
        | beam.ParDo(Stateful())
        | beam.Map(lambda kv: kv)
        | beam.GroupByKey()
    )
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    (stage,) = [s for s in plan.stages if s.stateful]
    batched = plan_batched_steps(stage.descriptor, stage.input_transform_id)
    assert batched is None


def _fail(x: int) -> int:
    if x == 7:
        raise ValueError(f"cannot take {x}")
    return x


@pytest.mark.parametrize("batched", [True, False])
def test_an_error_names_the_step_and_carries_the_users_exception(batched: bool) -> None:
    spec = _stage(lambda pc: pc | "Fails" >> beam.Map(_fail), f"fail-{next(_RUNS)}", batched)
    batches = [pa.RecordBatch.from_arrays([pa.array([bi.ENCODED_IMPULSE_VALUE])], [ELEMENT])]
    with pytest.raises(StageExecutionError) as raised:
        list(run_stage(spec, batches))
    message = str(raised.value)
    assert "cannot take 7" in message
    assert "[while running 'Fails']" in message
    tear_down_stage_workers()


LIFECYCLE: list[str] = []


class Lifecycle(beam.DoFn):
    def setup(self) -> None:
        LIFECYCLE.append("setup")

    def start_bundle(self) -> None:
        LIFECYCLE.append("start")

    def process(self, element: Any) -> Iterator[Any]:
        yield element

    def finish_bundle(self) -> None:
        LIFECYCLE.append("finish")

    def teardown(self) -> None:
        LIFECYCLE.append("teardown")


def test_each_step_gets_its_lifecycle_calls() -> None:
    LIFECYCLE.clear()
    spec = _stage(lambda pc: pc | beam.ParDo(Lifecycle()), f"life-{next(_RUNS)}", True)
    _run(spec, bundles=3)
    assert stage_worker(spec).batched is not None
    tear_down_stage_workers()
    assert LIFECYCLE == ["setup"] + ["start", "finish"] * 3 + ["teardown"]


class Counted:
    """Counts its live instances, and the most ever alive at once."""

    live = 0
    most = 0

    def __init__(self, n: int) -> None:
        self.n = n
        Counted.live += 1
        Counted.most = max(Counted.most, Counted.live)

    def __del__(self) -> None:
        Counted.live -= 1


class ManyCounted(beam.DoFn):
    def process(self, element: int, ts: Any = beam.DoFn.TimestampParam) -> Iterator[Any]:
        if element == 0:
            for i in range(5000):
                yield Counted(i)


@pytest.mark.parametrize(
    "kind",
    [
        lambda pc: pc | beam.FlatMap(lambda x: (Counted(i) for i in range(5000)) if x == 0 else []),
        lambda pc: pc | beam.ParDo(ManyCounted()),
    ],
    ids=["flat_map_generator", "dofn_generator"],
)
def test_a_generators_outputs_go_on_a_chunk_at_a_time(kind: Callable[[Any], Any]) -> None:
    Counted.most = Counted.live = 0
    spec = _stage(lambda pc: kind(pc) | beam.Map(lambda c: c.n), f"lazy-{next(_RUNS)}", True)
    elements, _ = _run(spec, bundles=1)
    assert len(elements) == 5000
    assert stage_worker(spec).batched is not None
    # Beam's path holds one at a time; the batched path a chunk or so (256), not all.
    assert Counted.most <= 600
    tear_down_stage_workers()


def test_idle_batched_dofns_are_torn_down_and_set_up_again() -> None:
    LIFECYCLE.clear()
    spec = _stage(lambda pc: pc | beam.ParDo(Lifecycle()), f"idle-{next(_RUNS)}", True)
    _run(spec, bundles=1)
    assert tear_down_idle_dofns(time.time() + 60) >= 1
    assert LIFECYCLE == ["setup", "start", "finish", "teardown"]
    _run(spec, bundles=1)  # a fresh instance
    tear_down_stage_workers()
    assert LIFECYCLE == ["setup", "start", "finish", "teardown"] * 2


@pytest.mark.parametrize(
    "window_fn",
    [
        window.FixedWindows(10),
        window.FixedWindows(7, offset=2),
        window.SlidingWindows(10, 3, offset=1),
        window.SlidingWindows(15, 5),
        window.Sessions(4),
        window.GlobalWindows(),
    ],
    ids=["fixed", "fixed_with_offset", "sliding_uneven", "sliding", "sessions", "global"],
)
def test_window_assigner_gives_what_beams_assign_gives(window_fn: Any) -> None:
    """The cached windows equal Beam's ``assign`` for every timestamp, negative ones too,
    by the timestamp in µs, for a ``WindowInto`` (``window_assigner``) or a window
    function (``micros_windows``)."""
    windowing = beam.transforms.core.Windowing(window_fn)
    assign = batched_dofns.window_assigner(batched_dofns.window_into_dofn(windowing))
    by_micros = batched_dofns.micros_windows(window_fn)
    assert assign is not None and by_micros is not None
    # Each timestamp twice: from Beam's assign, then from the cache.
    for micros in [*range(-25_000_000, 25_000_000, 250_001)] * 2:
        timestamp = Timestamp(micros=micros)
        expected = window_fn.assign(window.WindowFn.AssignContext(timestamp))
        for got in (assign(micros), by_micros(micros)):
            assert got == expected, micros
            assert type(got) is type(expected)


class _MySessions(window.Sessions):  # type: ignore[misc]
    pass


def test_window_assigner_takes_only_the_runners_window_into_and_standard_windows() -> None:
    assert batched_dofns.window_assigner(WithParams()) is None
    subclass = beam.transforms.core.Windowing(_MySessions(4))
    assert batched_dofns.window_assigner(batched_dofns.window_into_dofn(subclass)) is None


def test_beams_machinery_keeps_the_bundle_processor_its_shipped_user_code_does_not() -> None:
    """Beam's own DoFns keep the bundle processor, but DoFns of its examples and benchmarks
    (user code Beam ships: Nexmark's) are judged as a user's are."""
    # nexmark_util first: Beam 2.69's Nexmark modules import each other in a cycle.
    from apache_beam.testing.benchmarks.nexmark import nexmark_util  # noqa: F401
    from apache_beam.testing.benchmarks.nexmark.queries import nexmark_query_util
    from apache_beam.transforms.util import WithSharedKey

    nexmark = nexmark_query_util.AuctionBySellerFn()
    assert batched_policy.unbatchable_dofn_reason(nexmark, (), {}) is None
    # A DoFn of Beam's transforms whose signature would otherwise qualify.
    assert (
        batched_policy.unbatchable_dofn_reason(WithSharedKey(), (), {})
        == "Beam's own WithSharedKey"
    )


def test_a_flatten_inside_the_stage_runs_batched() -> None:
    _, _, spec = _compare("flatten")
    batched = stage_worker(spec).batched
    assert batched is not None and batched.plan.remainder is None
    assert any("Flatten/Transcode" in name for name in batched.step_names)
    tear_down_stage_workers()


class Payload:
    """A value Beam's FastPrimitivesCoder pickles: a user object on the data channel."""

    def __init__(self, n: int) -> None:
        self.n = n


def _cogroup_plan(window_fn: Any) -> tuple[Plan, PlannedStage, PlannedStage]:
    """A CoGroupByKey's plan: the stage writing its Flatten, and the stage reading the
    Flatten and writing the GroupByKey (nothing else: a pass-through)."""
    p = beam.Pipeline()
    source = p | beam.Impulse() | "Source" >> beam.ParDo(Source()) | beam.WindowInto(window_fn)
    left = source | "Left" >> beam.Map(lambda x: (x % 5, x))
    right = source | "Right" >> beam.Map(lambda x: (x % 3, Payload(x)))
    _ = {"left": left, "right": right} | beam.CoGroupByKey()
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    (writer,) = [s for s in plan.stages if any("Source" in n for n in s.user_transform_names)]
    (stage,) = [s for s in plan.stages if plan.buffers[s.input_buffer_id].kind == "materialize"]
    return plan, writer, stage


def _in_other_windows_and_panes(
    plan: Plan, stage: PlannedStage, elements: list[bytes]
) -> list[bytes]:
    """The elements again, each in one or two windows of its own, in panes of every form."""
    impl = bi.PipelineContext(plan.components).coders[stage.input_coder_id].get_impl()
    out = []
    for i, element in enumerate(elements):
        value = impl.decode_nested(element).value
        windows = [window.IntervalWindow(i, i + 10), window.IntervalWindow(i - 5, i + 5)]
        timing = (PaneInfoTiming.EARLY, PaneInfoTiming.ON_TIME, PaneInfoTiming.LATE)[i % 3]
        nonspeculative = -1 if timing == PaneInfoTiming.EARLY else i // 3
        pane = PaneInfo(i % 2 == 0, i % 5 == 0, timing, i % 7 * 40, nonspeculative)
        timestamp = Timestamp(micros=i * 1_700_000 - 20_000_000)
        out.append(impl.encode_nested(WindowedValue(value, timestamp, windows[: 1 + i % 2], pane)))
    return out


def _run_input(spec: StageSpec, pieces: bytes | list[bytes]) -> tuple[list[bytes], dict[Any, Any]]:
    """The stage over one bundle of ``pieces`` (concatenated elements), twice."""
    worker = stage_worker(spec)
    metrics = TaskMetrics()
    elements: list[bytes] = []
    for _ in range(2):
        for outputs in worker.process(pieces, metrics):
            for batch in outputs.record_batches(spec.outputs, worker.key_extractors):
                elements.extend(batch.column(ELEMENT).to_pylist())
    return elements, _comparable_metrics(metrics.infos, worker.descriptor)


@pytest.mark.parametrize(
    "window_fn", [window.FixedWindows(10), window.GlobalWindows()], ids=["fixed", "global"]
)
def test_a_cogroup_by_keys_pass_through_stage_runs_batched(window_fn: Any) -> None:
    """The stage between a CoGroupByKey's Flatten and its GroupByKey holds no step (a
    data input and a data output): it ran in the bundle processor, which decodes each
    element (user objects unpickled) and encodes it again. Batched, it gives the same
    bytes (values, timestamps, windows, panes), element counts and read index. Where its
    output writes its input's coder (fixed windows), it hands the input's bytes through;
    in the global window of a batch run the GroupByKey's writers send values only, so it
    decodes and encodes them, batched."""
    run = next(_RUNS)
    plan, writer, stage = _cogroup_plan(window_fn)
    written, _ = _run(stage_spec(plan, writer, f"cogroup-writer-{run}", keyed=False), bundles=1)
    assert len(written) == 2 * ELEMENTS
    fixed = isinstance(window_fn, window.FixedWindows)
    elements = _in_other_windows_and_panes(plan, stage, written) if fixed else written
    # One bundle in two pieces, as a native text read's blocks come.
    pieces = [b"".join(elements[:ELEMENTS]), b"".join(elements[ELEMENTS:])]
    results = []
    for batched in (True, False):
        spec = dataclasses.replace(
            stage_spec(plan, stage, f"cogroup-{batched}-{run}", keyed=False),
            batched_steps=batched,
        )
        results.append(_run_input(spec, pieces))
        worker = stage_worker(spec)
        if batched:
            assert worker.batched is not None
            assert worker.batched.plan.steps == () and worker.batched.plan.remainder is None
            assert (worker.batched.plan.pass_through_coder_id is not None) is fixed
        else:
            assert worker.batched is None
    (on_elements, on_metrics), (off_elements, off_metrics) = results
    assert on_elements == off_elements
    assert on_metrics == off_metrics
    assert on_metrics[("read index", stage.input_transform_id)] == 2 * 2 * ELEMENTS
    if fixed:
        assert on_elements == elements * 2  # the bytes it read
    tear_down_stage_workers()


def test_a_precombine_flushes_past_beams_key_limit_as_beam_does() -> None:
    """Beam's PGBKCVOperation outputs the oldest tenth of its table once it holds 100 000
    keys (a CombineFn outside its short list): the same outputs, in the same order."""

    def key(k: int) -> int:
        # 101 000 keys, then 12 000-14 999 again: still in the table after Beam's flush of
        # its oldest tenth, so they add to their accumulators rather than start new ones.
        return k if k < 101_000 else k - 89_000

    def many_keys(pc: Any) -> Any:
        return (
            pc
            | beam.FlatMap(lambda x: [(key(k), x) for k in range(x * 2_600, (x + 1) * 2_600)])
            | beam.CombinePerKey(beam.combiners.TopCombineFn(2))
        )

    elements, _, _ = _compare_with(many_keys, "many_keys")
    # Per bundle: the 10 000 flushed, then the other 91 000 at its end.
    assert len(elements) == 2 * 101_000


def _text_stage(path: str, build: Callable[[Any], Any], run_id: str, batched: bool) -> StageSpec:
    p = beam.Pipeline()
    _ = build(p | beam.io.ReadFromText(path))
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    (stage,) = [
        s
        for s in plan.stages
        if plan.buffers[s.input_buffer_id].kind == planning.TEXT_READ_BUFFER_KIND
    ]
    impl = bi.PipelineContext(plan.components).coders[stage.input_coder_id].get_impl()
    header = impl.encode_nested(window.GlobalWindows.windowed_value(""))[:-1]
    spec = stage_spec(plan, stage, run_id, keyed=False)
    return dataclasses.replace(spec, batched_steps=batched, text_read_header=header)


def _run_text(spec: StageSpec, ranges: list[TextRange]) -> tuple[list[bytes], dict[Any, Any]]:
    worker = stage_worker(spec)
    metrics = TaskMetrics()
    elements: list[bytes] = []
    for outputs in worker.process(TextInput(ranges, spec.text_read_header or b""), metrics):
        for batch in outputs.record_batches(spec.outputs, worker.key_extractors):
            elements.extend(batch.column(ELEMENT).to_pylist())
    return elements, _comparable_metrics(metrics.infos, worker.descriptor)


def _word_count(lines: Any) -> Any:
    return (
        lines | beam.FlatMap(str.split) | beam.Map(lambda word: (word, 1)) | beam.CombinePerKey(sum)
    )


def test_a_native_text_reads_lines_run_batched_when_nothing_hands_off(tmp_path: Any) -> None:
    """The stage after a native text read runs its steps batched over the lines, read a
    block at a time (several blocks here), with the bundle processor's bytes and metrics;
    a step that would hand off keeps the bundle processor for the whole stage."""
    words = [f"w{i % 997} x{i % 13}" for i in range(30_000)]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(words) + "\n")
    size = path.stat().st_size
    ranges = [TextRange(str(path), 0, size // 3), TextRange(str(path), size // 3, size)]
    run = next(_RUNS)
    results = []
    for batched in (True, False):
        spec = _text_stage(str(path), _word_count, f"text-{batched}-{run}", batched)
        with mock.patch.object(text_read, "BLOCK_BYTES", 64 << 10):
            results.append(_run_text(spec, ranges))
        assert (stage_worker(spec).batched is not None) is batched
    (on_elements, on_metrics), (off_elements, off_metrics) = results
    assert on_elements == off_elements
    assert len(on_elements) == 997 + 13
    assert on_metrics == off_metrics
    assert on_metrics[("read index", spec.input_transform_id)] == 30_000

    handing_off = _text_stage(
        str(path), lambda lines: lines | beam.ParDo(PaneReader()), f"text-pane-{run}", True
    )
    assert stage_worker(handing_off).batched is None
    tear_down_stage_workers()


def test_globally_windowed_side_inputs_are_read_once_per_batch_for_a_direct_call() -> None:
    spec = _stage(STEPS["keyword_side_input"], f"global-sides-{next(_RUNS)}", True)
    reads = []
    original = batched_side_inputs.side_input_arguments

    def counted(*args: Any) -> Any:
        reads.append(1)
        return original(*args)

    with mock.patch.object(batched_side_inputs, "side_input_arguments", counted):
        _run(spec, bundles=3)
    batched = stage_worker(spec).batched
    assert batched is not None
    (step,) = [s for s in batched._steps if s.reads_global_sides]
    # Read once per batch; the call made with the values is dropped at the batch's end.
    assert len(reads) == 3 and step.call is None
    tear_down_stage_workers()


def test_windowed_side_inputs_are_bound_once_per_window_and_batch_for_a_direct_call() -> None:
    spec = _stage(STEPS["windowed_side_direct"], f"window-sides-{next(_RUNS)}", True)
    windows = []
    original = batched_side_inputs.side_input_arguments

    def counted(side_inputs: Any, window: Any, *args: Any) -> Any:
        windows.append(window)
        return original(side_inputs, window, *args)

    with mock.patch.object(batched_side_inputs, "side_input_arguments", counted):
        _run(spec, bundles=3)
    batched = stage_worker(spec).batched
    assert batched is not None
    steps = [s for s in batched._steps if s.reads_window_sides]
    assert len(steps) == 4 and all(s.call is None and not s.window_calls for s in steps)
    # The source's 40 elements span 7 windows of 10 s: 4 steps bind each once per batch.
    assert len(windows) == 3 * 4 * 7
    assert len({bi.window_key(w) for w in windows}) == 7
    tear_down_stage_workers()


class _Mean(beam.combiners.MeanCombineFn):  # type: ignore[misc]
    """Beam's mean, counting its setups, merges and extractions in user metrics."""

    def setup(self) -> None:
        Metrics.counter("test", "combine_setup").inc()

    def merge_accumulators(self, accumulators: Any) -> Any:
        Metrics.counter("test", "merged").inc()
        return super().merge_accumulators(accumulators)

    def extract_output(self, accumulator: Any) -> Any:
        Metrics.counter("test", "extracted").inc()
        return super().extract_output(accumulator)


def _after_combine_stage(run_id: str, batched: bool) -> tuple[StageSpec, Any]:
    """The stage after a lifted combine's GroupByKey (merge, extract, a Map, a write) and
    the coder of its input (the combine's groups of accumulators)."""
    p = beam.Pipeline()
    _ = (
        p
        | beam.Impulse()
        | "Source" >> beam.ParDo(Source())
        | beam.WindowInto(window.FixedWindows(10))
        | "Pair" >> beam.Map(lambda x: (x % 7, x))
        | beam.CombinePerKey(_Mean())
        | "Format" >> beam.Map(lambda kv: (kv[0] % 2, f"{kv[0]}:{kv[1]}"))
        | "Regroup" >> beam.GroupByKey()
    )
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()))
    (stage,) = [s for s in plan.stages if any(n.endswith("/Merge") for n in s.user_transform_names)]
    coder = bi.PipelineContext(plan.components).coders[stage.input_coder_id]
    spec = stage_spec(plan, stage, run_id, keyed=False)
    return dataclasses.replace(spec, batched_steps=batched), coder


def test_a_combines_merge_and_extract_run_batched_with_the_bundle_processors_bytes() -> None:
    """A lifted combine's merge and extract phases (Beam's CombineOperation) run batched:
    the same bytes (timestamps, windows and panes kept), element counts and user metrics
    as the bundle processor, the CombineFn set up once."""
    run = next(_RUNS)
    results = []
    for batched in (True, False):
        spec, coder = _after_combine_stage(f"combine-phases-{batched}-{run}", batched)
        groups = [
            WindowedValue(
                (key, [(key * 10 + i, i + 1) for i in range(key % 3 + 1)]),
                Timestamp(micros=key * 1_000_000 + 999),
                [window.IntervalWindow(key * 10, key * 10 + 10)],
                PaneInfo(True, key % 2 == 0, PaneInfoTiming.ON_TIME, 0, 0),
            )
            for key in range(12)
        ]
        data = b"".join(coder.get_impl().encode_nested(g) for g in groups)
        worker = stage_worker(spec)
        assert (worker.batched is not None) is batched
        if batched:
            assert worker.batched.plan.remainder is None
            assert any(n.endswith("/Merge") for n in worker.batched.step_names)
            assert any(n.endswith("/ExtractOutputs") for n in worker.batched.step_names)
        results.append(_run_input(spec, data))
    (on_elements, on_metrics), (off_elements, off_metrics) = results
    assert on_elements == off_elements and len(on_elements) == 2 * 12
    assert on_metrics == off_metrics
    user = {key[1:]: value for key, value in on_metrics.items() if key[0] != "count"}
    assert [v for k, v in user.items() if k[-1] == "merged"] == [24]
    assert [v for k, v in user.items() if k[-1] == "extracted"] == [24]
    tear_down_stage_workers()


def test_sizes_are_sampled_at_beams_decaying_rate_over_the_steps_life() -> None:
    """The first ten elements, then about 10/N after the N-th: ~10 ln 2 per doubling."""
    random.seed(7)
    sampler = SizeSampler()
    first = sampler.pick(_CHUNK)
    assert first[:10] == list(range(10))
    picked = len(first)
    total = _CHUNK
    while total < 1_000_000:
        indexes = sampler.pick(_CHUNK)
        assert all(0 <= i < _CHUNK for i in indexes) and indexes == sorted(set(indexes))
        picked += len(indexes)
        total += _CHUNK
    expected = 10 + 10 * math.log(total / 10)  # Beam's rate, integrated
    assert 0.7 * expected < picked < 1.3 * expected, (picked, expected)
    # Not per batch: a sampler that has seen a million elements samples few more.
    assert len(sampler.pick(_CHUNK)) <= 2


def _keyword_only(element: int, *, k: int) -> tuple[int, int]:
    return element, k


def _catch_all(
    element: int, *rest: int, **named: int
) -> tuple[int, tuple[int, ...], dict[str, int]]:
    return element, rest, named


def _defaults(element: int, a: int = 1, b: int = 2, c: int = 3) -> tuple[int, int, int, int]:
    return element, a, b, c


class _Callable:
    __hash__ = None  # type: ignore[assignment]

    def __call__(self, element: int, a: int, b: int) -> tuple[int, int, int]:
        return element, a, b


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (_defaults, (), {}),
        (_defaults, (5,), {}),
        (_defaults, (5, 6), {}),
        (_defaults, (5, 6, 7), {}),
        (_defaults, (), {"b": 8, "a": 9}),
        (_defaults, (5,), {"c": 8}),  # b left at its default: passed by keyword
        (_defaults, (), {"a": 4, "b": 5, "c": 6}),
        (_keyword_only, (), {"k": 3}),
        (_catch_all, (1, 2), {"x": 3}),
        (_catch_all, (1, 2, 3), {}),
        (_Callable(), (), {"b": 2, "a": 1}),
        (len, (), {}),
    ],
)
def test_extra_arguments_reach_the_function_as_beams_call_passes_them(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    orders: dict[Any, Any] = {}
    element: Any = [1, 2] if fn is len else 0
    expected = fn(element, *args, **kwargs)
    assert _with_arguments(fn, args, kwargs, orders)(element) == expected
    assert _with_arguments(fn, args, kwargs, orders)(element) == expected  # remembered


def test_a_call_that_fails_fails_as_beams_call_does() -> None:
    for args, kwargs in (((1, 2, 3, 4), {}), ((), {"d": 1}), ((1,), {"a": 2})):
        with pytest.raises(TypeError) as beams:
            _defaults(0, *args, **kwargs)
        with pytest.raises(TypeError) as ours:
            _with_arguments(_defaults, args, kwargs)(0)
        assert str(ours.value) == str(beams.value)


class _NoProcess:
    """A step's DoFnRunner that fails if an element is processed through it."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def process(self, windowed_value: Any) -> None:
        raise AssertionError(f"called per element: {windowed_value}")


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("map_params", [("timestamp",)]),
        ("dofn_params", [("timestamp", "window")]),
        ("sliding_windows", [("timestamp", "window")]),
    ],
)
def test_dofns_taking_their_timestamp_or_window_are_called_directly(
    kind: str, expected: list[tuple[str, ...]]
) -> None:
    """Not through Beam's DoFnRunner per element (``runner.process`` is never called); a
    DoFn taking its window is called once per window of the element (``per_window``)."""
    spec = _stage(STEPS[kind], f"params-{kind}-{next(_RUNS)}", True)
    first, _ = _run(spec)  # sets the steps up (kept between batches)
    batched = stage_worker(spec).batched
    assert batched is not None
    direct = [s for s in batched._steps if s.params_of is not None]
    assert [s.per_window for s in direct] == ["window" in names for names in expected]
    for step in direct:
        step.runner = _NoProcess(step.runner)
    again, _ = _run(spec)
    assert again == first and first
    tear_down_stage_workers()


def test_a_dofn_taking_its_window_passes_on_each_window_without_a_pane_as_beam_does() -> None:
    """Beam's invoker calls it per window with a new windowed value of no pane, whose
    outputs keep none: a pane reader after it (run by the bundle processor) sees that."""
    elements, _, spec = _compare_with(
        lambda pc: (
            _three_maps(pc)
            | beam.ParDo(InTwoWindows())
            | beam.ParDo(WithParams())
            | beam.ParDo(PaneReader())
        ),
        "windows-then-pane",
    )
    assert len(elements) == 2 * 2 * ELEMENTS  # two bundles, two windows
    worker = stage_worker(spec)
    assert worker.batched is not None and worker.batched.plan.remainder is not None
    tear_down_stage_workers()


@pytest.mark.parametrize(
    "params",
    [
        ("timestamp",),
        ("window",),
        ("timestamp", "window"),
        ("window", "timestamp"),
        ("window", "timestamp", "window"),  # no direct getter: names compared
    ],
)
def test_a_dofns_timestamp_and_window_are_passed_in_its_order(params: tuple[str, ...]) -> None:
    from beam_spark_runner.execution.batched_calls import params_of as _params_of

    windowed_value = WindowedValue(7, Timestamp(micros=5), [window.IntervalWindow(0, 10)])
    expected = {"timestamp": Timestamp(micros=5), "window": window.IntervalWindow(0, 10)}
    assert _params_of(params)(windowed_value) == tuple(expected[name] for name in params)


def _timestamps_at_precisions() -> list[Any]:
    made = [Timestamp.of(2.5), Timestamp(micros=-1)]
    try:  # Beam 2.7x: a Timestamp has a precision; milliseconds here
        made.append(Timestamp(seconds=3, subseconds=7, precision=3))  # type: ignore[call-arg]
    except TypeError:  # before: microseconds only
        pass
    return made


@pytest.mark.parametrize("timestamp", _timestamps_at_precisions())
def test_a_dofns_timestamp_is_the_values_own_at_its_precision(timestamp: Any) -> None:
    """As Beam's invoker passes it: a ``Timestamp`` made again from the value's microseconds
    would be equal, but would print a millisecond one as microseconds."""
    from beam_spark_runner.execution.batched_calls import params_of as _params_of

    windowed_value = WindowedValue(7, timestamp, [window.GlobalWindow()])
    (made,) = _params_of(("timestamp",))(windowed_value)
    assert made == timestamp and made.micros == timestamp.micros
    assert repr(made) == repr(timestamp)
