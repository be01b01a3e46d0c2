"""GroupByKey over key-sorted partitions, without Spark: runs spanning batches, windows."""

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import decode_column
from beam_spark_runner.execution.beam_globals import TaskEnvironment
from beam_spark_runner.execution.grouping import GroupSpec, group_sorted
from beam_spark_runner.planning import build_plan
from tests.group_by_key_plans import plan_group_by_key


def _grouping_setup(windowing: beam.WindowInto | None):
    plan, input_pcoll, output_pcoll, components, buffer_id = plan_group_by_key(windowing=windowing)
    # What the writers write: value-only under default windowing (planning).
    writer_coder_id = plan.group_input_coders.get(buffer_id, plan.data_channel_coders[input_pcoll])
    spec = GroupSpec(
        TaskEnvironment("run"),
        "gbk",
        components,
        writer_coder_id,
        plan.data_channel_coders[output_pcoll],
        plan.components.pcollections[input_pcoll].windowing_strategy_id,
    )
    context = bi.PipelineContext(plan.components)
    pre = context.coders[writer_coder_id]
    safe = context.coders[plan.safe_coders[writer_coder_id]]
    post = context.coders[plan.data_channel_coders[output_pcoll]]
    return spec, pre, safe, post


def _sorted_batches(elements, pre, safe, rows_per_batch):
    key_coder = safe.wrapped_value_coder.key_coder()
    rows = sorted(
        (key_coder.encode(wv.value[0]), pre.get_impl().encode_nested(wv)) for wv in elements
    )
    return [
        pa.RecordBatch.from_pydict(
            {
                "key": pa.array([k for k, _ in rows[i : i + rows_per_batch]], pa.binary()),
                "element": pa.array([e for _, e in rows[i : i + rows_per_batch]], pa.binary()),
            }
        )
        for i in range(0, len(rows), rows_per_batch)
    ]


@pytest.mark.parametrize("rows_per_batch", [1, 3, 4, 100])
def test_groups_runs_of_one_key_across_batch_boundaries(rows_per_batch):
    spec, pre, safe, post = _grouping_setup(None)
    elements = [
        WindowedValue((k, v), 0, [window.GlobalWindow()]) for k in range(5) for v in range(k + 1)
    ]
    batches = _sorted_batches(elements, pre, safe, rows_per_batch)
    grouped = []
    input_keys = {key for b in batches for key in b.column("key").to_pylist()}
    output_keys = []
    for batch in group_sorted(spec, batches):
        # Each group keeps its key: a stateful stage reading the group shuffles on it.
        output_keys += batch.column("key").to_pylist()
        grouped += decode_column(batch.column("element"), post)
    assert sorted(output_keys) == sorted(input_keys)
    assert sorted((wv.value[0], sorted(wv.value[1])) for wv in grouped) == [
        (k, list(range(k + 1))) for k in range(5)
    ]


def test_fixed_windows_group_per_window():
    spec, pre, safe, post = _grouping_setup(beam.WindowInto(window.FixedWindows(10)))
    elements = [
        WindowedValue((7, t), t, [window.IntervalWindow((t // 10) * 10, (t // 10) * 10 + 10)])
        for t in (1, 2, 15)
    ]
    out = []
    for batch in group_sorted(spec, _sorted_batches(elements, pre, safe, 2)):
        out += decode_column(batch.column("element"), post)
    assert sorted((wv.windows[0].start.micros, sorted(wv.value[1])) for wv in out) == [
        (0, [1, 2]),
        (10_000_000, [15]),
    ]


def test_empty_partition_yields_nothing():
    spec, *_ = _grouping_setup(None)
    assert list(group_sorted(spec, [])) == []


class _UserValue:
    """A value Beam can only pickle: its coder is unknown to the runner."""

    def __init__(self, value):
        self.value = value


def test_grouping_decodes_user_values_as_opaque_bytes():
    from beam_spark_runner.translators.group_by_key import grouping_coder_id

    p = beam.Pipeline()
    _ = p | beam.Create([("k", _UserValue(1))]) | beam.GroupByKey()
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    plan = build_plan(proto)
    (buffer,) = [b for b in plan.buffers.values() if b.kind == "group"]
    (input_pcoll,) = plan.components.transforms[buffer.name].inputs.values()
    sdk_id = plan.data_channel_coders[input_pcoll]
    context = bi.PipelineContext(plan.components)
    element = (
        context.coders[sdk_id]
        .get_impl()
        .encode_nested(WindowedValue(("k", _UserValue(1)), 0, [window.GlobalWindow()]))
    )
    grouping = context.coders[grouping_coder_id(plan, sdk_id)]
    decoded = grouping.get_impl().decode_nested(element)
    assert isinstance(decoded.value[1], bytes), "user value was unpickled for grouping"
    assert isinstance(context.coders[sdk_id].get_impl().decode_nested(element).value[1], _UserValue)


def test_reshuffle_keeps_the_group_by_key_input_coder():
    """A Reshuffle feeding a GroupByKey must not replace the GBK's deterministic key coder.

    Grouping passes keys through as bytes, so the keys written before the shuffle must be
    encoded with the same key coder the GroupByKey's output declares.
    """
    from apache_beam.coders import coders_test_common

    p = beam.Pipeline()
    _ = (
        p
        | beam.Create([1])
        | beam.Map(lambda _: (coders_test_common.MyTypedNamedTuple(1, "a"), 1))
        | beam.Reshuffle()
        | beam.GroupByKey()
    )
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    plan = build_plan(proto)
    (buffer,) = [b for b in plan.buffers.values() if b.kind == "group"]
    transform = plan.components.transforms[buffer.name]
    context = bi.PipelineContext(plan.components)

    def key_coder(pcoll):
        return context.coders[plan.data_channel_coders[pcoll]].wrapped_value_coder.key_coder()

    (input_pcoll,) = transform.inputs.values()
    (output_pcoll,) = transform.outputs.values()
    assert key_coder(input_pcoll) == key_coder(output_pcoll)
