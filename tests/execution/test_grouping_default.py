"""Grouping without a GroupingBuffer per key (default windowing): Beam's output, byte for byte."""

import dataclasses
import itertools
import typing
from collections.abc import Callable

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.coders import coders
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import KeyExtractor
from beam_spark_runner.execution import grouping
from beam_spark_runner.execution.beam_globals import TaskEnvironment
from beam_spark_runner.execution.grouping import GroupSpec, group_sorted, group_sorted_values
from beam_spark_runner.translators.group_by_key import grouping_coder_id
from tests.group_by_key_plans import plan_group_by_key

GLOBAL = (window.GlobalWindow(),)
TIMESTAMPS = [MIN_TIMESTAMP, Timestamp(0), Timestamp(-3), Timestamp(12), MAX_TIMESTAMP]
ONE_BYTE_PANES = [
    PaneInfo(True, True, PaneInfoTiming.UNKNOWN, 0, 0),  # NO_FIRING, before any GroupByKey
    PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0),
    PaneInfo(True, False, PaneInfoTiming.EARLY, 0, 0),
]
LONGER_PANES = [
    PaneInfo(False, False, PaneInfoTiming.EARLY, 2, -1),
    PaneInfo(False, True, PaneInfoTiming.LATE, 300, 1),
]


@dataclasses.dataclass(frozen=True)
class _UserKey:
    """Only pickled: the runner-safe coder makes it opaque bytes."""

    name: str


class _UserValue:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _UserValue) and other.value == self.value

    def __hash__(self):
        return hash(self.value)


class Setup(typing.NamedTuple):
    spec: GroupSpec
    sdk: typing.Any  # the writers' (data channel) coder
    pre: typing.Any  # what grouping decodes with
    post: typing.Any
    windowing: typing.Any
    key_extractor: KeyExtractor


def setup(kv_type=tuple[int, int], windowing=None, layout="as planned"):
    """The GroupSpec and coders of a planned GroupByKey.

    ``layout``: the writers' coder as planned (value-only under default windowing), or
    ``"windowed"``: Beam's windowed-value coder, which writers keep when they do not all use
    the GroupByKey input's coder.
    """
    plan, input_pcoll, output_pcoll, components, buffer_id = plan_group_by_key(kv_type, windowing)
    sdk_id = plan.data_channel_coders[input_pcoll]
    if layout == "as planned":
        sdk_id = plan.group_input_coders.get(buffer_id, sdk_id)
    spec = GroupSpec(
        TaskEnvironment("run"),
        f"gbk-{kv_type}-{windowing}",
        components,
        grouping_coder_id(plan, sdk_id),
        grouping_coder_id(plan, plan.data_channel_coders[output_pcoll]),
        plan.components.pcollections[input_pcoll].windowing_strategy_id,
    )
    context = bi.PipelineContext(plan.components)
    return Setup(
        spec,
        context.coders[sdk_id],
        context.coders[spec.pre_grouping_coder_id],
        context.coders[spec.post_grouping_coder_id],
        context.windowing_strategies[spec.windowing_strategy_id],
        KeyExtractor(context.coders[plan.safe_coders[sdk_id]]),
    )


def encode_all(coder, elements):
    impl = coder.get_impl()
    out = bi.create_OutputStream()
    for element in elements:
        impl.encode_to_stream(element, out, True)
    return out.get()


def beam_grouped(s: Setup, data: bytes) -> bytes:
    buffer = bi.GroupingBuffer(s.pre, s.post, s.windowing)
    buffer.append(data)
    return b"".join(buffer.partition(1)[0])


KV_CASES = {
    "int, int": (tuple[int, int], [(k, v) for k in (0, 7, -1, 2**40) for v in range(4)]),
    "str, bytes": (
        tuple[str, bytes],
        [(k, b"v%d" % v) for k in ("", "k", "ü" * 100) for v in range(3)],
    ),
    "kv key, str": (
        tuple[tuple[str, int], str],
        [((k, i), "v" * v) for k in ("a", "") for i in (0, -5) for v in (0, 1, 200)],
    ),
    "user key, user value": (
        tuple[_UserKey, _UserValue],
        [(_UserKey(k), _UserValue(v)) for k in ("a", "b") for v in range(3)],
    ),
    "any": (typing.Any, [(k, v) for k in ("k", 1, ("t", 2.5)) for v in (None, 1, "s", [1, 2])]),
}


def runs_by_key(s: Setup, kvs, panes=ONE_BYTE_PANES):
    """Each key's run of encoded elements, as the shuffle hands them to grouping."""
    # Window counts other than one, too: GroupingBuffer ignores windows here.
    windows = [GLOBAL, GLOBAL, GLOBAL * 2, ()]
    elements = [
        WindowedValue(kv, TIMESTAMPS[i % len(TIMESTAMPS)], windows[i % 4], panes[i % len(panes)])
        for i, kv in enumerate(kvs)
    ]
    data = encode_all(s.sdk, elements)
    keys = s.key_extractor.keys(data, _ends(s.sdk, elements))
    runs: dict[bytes, list[WindowedValue]] = {}
    for key, element in zip(keys, elements, strict=True):
        runs.setdefault(key, []).append(element)
    return {key: encode_all(s.sdk, run) for key, run in runs.items()}


def _ends(coder, elements):
    impl, ends, total = coder.get_impl(), [], 0
    for element in elements:
        total += len(impl.encode_nested(element))
        ends.append(total)
    return ends


def test_default_windowing_writers_send_values_only():
    s = setup(tuple[str, int])
    assert type(s.sdk) is coders.ParamWindowedValueCoder
    assert type(s.pre) is coders.ParamWindowedValueCoder
    element = WindowedValue(("key", 7), Timestamp(12), GLOBAL, ONE_BYTE_PANES[1])
    assert s.sdk.encode_nested(element) == b"\x03key\x07"
    windowed = setup(tuple[str, int], layout="windowed")
    assert len(windowed.sdk.encode_nested(element)) == 13 + 5


@pytest.mark.parametrize("windowing", ["fixed", "sessions", "global, AfterCount"])
def test_other_windowings_keep_timestamps_windows_and_panes(windowing):
    s = setup(tuple[str, int], WINDOWINGS[windowing])
    assert type(s.sdk) is coders.WindowedValueCoder


def test_a_global_window_with_another_timestamp_combiner_keeps_timestamps():
    """Output at the earliest input timestamp: the inputs' timestamps reach the output."""
    s = setup(
        tuple[str, int],
        beam.WindowInto(
            window.GlobalWindows(), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST
        ),
    )
    assert not s.windowing.is_default()
    assert type(s.sdk) is coders.WindowedValueCoder


@pytest.mark.parametrize("layout", ["as planned", "windowed"])
@pytest.mark.parametrize("case", sorted(KV_CASES))
def test_default_windowing_groups_as_beam_without_a_buffer(case, layout, monkeypatch):
    kv_type, kvs = KV_CASES[case]
    s = setup(kv_type, layout=layout)
    assert s.windowing.is_default()
    runs = runs_by_key(s, kvs)
    expected = {key: beam_grouped(s, data) for key, data in runs.items()}
    grouper = grouping._Grouper(s.spec)
    monkeypatch.setattr(bi, "GroupingBuffer", lambda *_: pytest.fail("used a GroupingBuffer"))
    assert {key: grouper.group(data) for key, data in runs.items()} == expected


def test_keys_whose_panes_take_more_than_a_byte_go_to_the_grouping_buffer():
    s = setup(tuple[str, int], layout="windowed")
    kvs = [(k, v) for k in ("a", "b") for v in range(5)]
    runs = runs_by_key(s, kvs, panes=ONE_BYTE_PANES + LONGER_PANES)
    grouper = grouping._Grouper(s.spec)
    for data in runs.values():
        assert grouper._group_default(data) is None
        assert grouper.group(data) == beam_grouped(s, data)


@pytest.mark.parametrize("layout", ["as planned", "windowed"])
def test_a_run_must_hold_one_key_for_the_default_path(layout):
    """Elements of two keys in one run (never from the shuffle): not grouped as one key."""
    s = setup(tuple[str, int], layout=layout)
    data = encode_all(s.sdk, [WindowedValue((k, 1), 0, GLOBAL) for k in ("a", "b", "a")])
    grouper = grouping._Grouper(s.spec)
    fast_path = grouper._group_values if layout == "as planned" else grouper._group_default
    assert fast_path(data) is None
    assert grouper.group(data) == beam_grouped(s, data)
    # A key whose encoding is a prefix of the next one's.
    data = encode_all(s.sdk, [WindowedValue((k, 1), 0, GLOBAL) for k in ("a", "ab")])
    assert fast_path(data) is None
    assert grouper.group(data) == beam_grouped(s, data)


# group_sorted against the grouping it replaced: Beam's GroupingBuffer for each key's run.


def sorted_batches(s: Setup, elements, rows_per_batch, per_row=1):
    """Key-sorted batches; a row holds ``per_row`` elements of one key (packed cells)."""
    keys = s.key_extractor.keys(encode_all(s.sdk, elements), _ends(s.sdk, elements))
    rows = []
    for key, group in itertools.groupby(
        sorted(zip(keys, elements, strict=True), key=lambda r: r[0]), key=lambda r: r[0]
    ):
        group_elements = [element for _, element in group]
        for i in range(0, len(group_elements), per_row):
            rows.append((key, encode_all(s.sdk, group_elements[i : i + per_row])))
    return [
        pa.RecordBatch.from_pydict(
            {
                "key": pa.array([k for k, _ in rows[i : i + rows_per_batch]], pa.binary()),
                "element": pa.array([e for _, e in rows[i : i + rows_per_batch]], pa.binary()),
            }
        )
        for i in range(0, len(rows), rows_per_batch)
    ]


def reference_grouped(s: Setup, batches):
    rows = [
        (key, element)
        for batch in batches
        for key, element in zip(
            batch.column("key").to_pylist(), batch.column("element").to_pylist(), strict=True
        )
    ]
    out = []
    for key, group in itertools.groupby(rows, key=lambda r: r[0]):
        grouped = beam_grouped(s, b"".join(element for _, element in group))
        if grouped:
            out.append((key, grouped))
    return out


def actual_grouped(s: Setup, batches):
    out = []
    for batch in group_sorted(s.spec, batches):
        assert batch.schema == grouping.GROUPED_SCHEMA
        out += zip(
            batch.column("key").to_pylist(), batch.column("element").to_pylist(), strict=True
        )
    return out


WINDOWINGS = {
    "default": None,
    "fixed": beam.WindowInto(window.FixedWindows(10)),
    "sessions": beam.WindowInto(window.Sessions(5)),
    "global, AfterCount": beam.WindowInto(
        window.GlobalWindows(),
        trigger=trigger.Repeatedly(trigger.AfterCount(2)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    ),
}


@pytest.mark.parametrize("per_row", [1, 3])
@pytest.mark.parametrize("rows_per_batch", [1, 4, 1000])
@pytest.mark.parametrize("windowing", sorted(WINDOWINGS))
def test_group_sorted_gives_beams_bytes(windowing, rows_per_batch, per_row):
    s = setup(tuple[str, int], WINDOWINGS[windowing])
    window_fn = s.windowing.windowfn
    elements = []
    for i in range(60):
        timestamp = Timestamp(i % 23)
        elements.append(
            WindowedValue(
                (f"k{i % 7}", i),
                timestamp,
                window_fn.assign(window_fn.AssignContext(timestamp, element=None)),
            )
        )
    batches = sorted_batches(s, elements, rows_per_batch, per_row)
    expected = reference_grouped(s, batches)
    assert len(expected) == 7
    assert actual_grouped(s, batches) == expected
    # As windowed values (the grouped stage's input), bundles of at most 3 keys: the same
    # elements, encoded by the bundles themselves or by the output's coder.
    bundles = list(group_sorted_values(s.spec, batches, batch_keys=3))
    assert len(bundles) == 3
    encoded = b"".join(grouped for _, grouped in expected)
    assert b"".join(chunk for bundle in bundles for chunk in bundle) == encoded
    values = [value for bundle in bundles for value in bundle.windowed_values()]
    assert encode_all(grouping._Grouper(s.spec).post_coder, values) == encoded


def test_group_sorted_values_cuts_bundles_by_input_size():
    s = setup(tuple[str, bytes])
    elements = [WindowedValue((f"k{i}", bytes(100)), 0, GLOBAL) for i in range(10)]
    batches = sorted_batches(s, elements, rows_per_batch=4)
    # Each key's run is ~110 bytes: a bundle is cut once 250 bytes were read (3 keys).
    bundles = list(group_sorted_values(s.spec, batches, batch_keys=100, batch_bytes=250))
    assert [len(bundle.values) for bundle in bundles] == [3, 3, 3, 1]
    assert [kv.value[0] for bundle in bundles for kv in bundle.values] == [
        f"k{i}" for i in sorted(range(10), key=lambda i: f"k{i}")
    ]


def test_group_sorted_cuts_output_batches_by_size(monkeypatch):
    s = setup(tuple[str, bytes])
    elements = [WindowedValue((f"k{i % 10}", b"x" * 1000), 0, GLOBAL) for i in range(100)]
    batches = sorted_batches(s, elements, 1000)
    expected = reference_grouped(s, batches)
    monkeypatch.setattr(grouping, "_OUTPUT_BATCH_BYTES", 25_000)
    output = list(group_sorted(s.spec, batches))
    assert len(output) == 4  # 10 keys of ~10 kB, cut after each third key
    assert [
        pair
        for batch in output
        for pair in zip(
            batch.column("key").to_pylist(), batch.column("element").to_pylist(), strict=True
        )
    ] == expected


def test_group_sorted_many_keys_one_batch_of_output_per_1024():
    s = setup(tuple[int, int])
    elements = [WindowedValue((i % 3000, i), 0, GLOBAL) for i in range(6000)]
    batches = sorted_batches(s, elements, 500, per_row=2)
    output = list(group_sorted(s.spec, batches))
    assert [b.num_rows for b in output] == [1024, 1024, 952]
    assert actual_grouped(s, batches) == reference_grouped(s, batches)


def test_writers_descriptors_encode_values_only():
    """The producing stage's data output (what its bundle processor encodes with) is value-only."""
    plan, _, _, _, buffer_id = plan_group_by_key(tuple[str, int])
    (writer_name, index), *others = plan.buffers[buffer_id].writers
    assert not others
    stage = plan.stage(writer_name)
    output = stage.outputs[index]
    port = bi.beam_fn_api_pb2.RemoteGrpcPort.FromString(
        stage.descriptor.transforms[output.transform_id].spec.payload
    )
    assert port.coder_id == output.coder_id == plan.group_input_coders[buffer_id]
    coder = stage.descriptor.coders[port.coder_id]
    assert coder.spec.urn == bi.PARAM_WINDOWED_VALUE_CODER_URN


def _grouped_both_ways(
    s: Setup, count: int, timestamp: Callable[[int], Timestamp]
) -> tuple[dict[str, list[WindowedValue]], dict[str, bytes]]:
    """Groups runs of three keys' elements (and one run holding two keys: GroupingBuffer
    keeps them apart, so must grouping) as Beam's GroupingBuffer does and as the runner
    does, with no GroupingBuffer; requires the same bytes. Returns the runs and the bytes."""
    window_fn = s.windowing.windowfn
    runs: dict[str, list[WindowedValue]] = {}
    for i in range(count):
        at = timestamp(i)
        windows = window_fn.assign(window_fn.AssignContext(at, element=None))
        element = WindowedValue((f"k{i % 3}", i), at, windows, ONE_BYTE_PANES[i % 3])
        runs.setdefault(element.value[0], []).append(element)
    runs["both"] = runs["k0"] + runs["k1"]
    expected = {key: beam_grouped(s, encode_all(s.sdk, run)) for key, run in runs.items()}
    grouper = grouping._Grouper(s.spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bi, "GroupingBuffer", lambda *_: pytest.fail("used a GroupingBuffer"))
        actual = {key: grouper.group(encode_all(s.sdk, run)) for key, run in runs.items()}
    assert actual == expected
    return runs, actual


PER_WINDOW_WINDOWINGS = {
    "fixed": beam.WindowInto(window.FixedWindows(10)),
    "sliding": beam.WindowInto(window.SlidingWindows(10, 5)),
    "sliding, offset": beam.WindowInto(window.SlidingWindows(10, 3, offset=1)),
    "fixed, earliest": beam.WindowInto(
        window.FixedWindows(10), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST
    ),
    "sliding, latest": beam.WindowInto(
        window.SlidingWindows(10, 5), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_LATEST
    ),
    "fixed, accumulating, lateness": beam.WindowInto(
        window.FixedWindows(10),
        accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
        allowed_lateness=30,
    ),
    "global, earliest": beam.WindowInto(
        window.GlobalWindows(), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST
    ),
}


@pytest.mark.parametrize("windowing", sorted(PER_WINDOW_WINDOWINGS))
def test_default_trigger_over_windows_that_do_not_merge_gives_beams_bytes(windowing):
    """Beam's GeneralTriggerDriver's panes, without it: windows in order of appearance."""
    s = setup(tuple[str, int], PER_WINDOW_WINDOWINGS[windowing])
    assert not s.windowing.is_default()
    # Timestamps out of order, so windows first appear out of order too.
    runs, actual = _grouped_both_ways(s, 80, lambda i: Timestamp((i * 37) % 61, micros=i % 3))
    outputs = list(s.post.get_impl().decode_all(actual["k0"]))
    assert {o.pane_info.timing for o in outputs} == {PaneInfoTiming.ON_TIME}
    assert len(outputs) == len({w for e in runs["k0"] for w in e.windows})


SESSION_WINDOWINGS = {
    "sessions": beam.WindowInto(window.Sessions(5)),
    "sessions, earliest, accumulating": beam.WindowInto(
        window.Sessions(4),
        timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST,
        accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
    ),
    "sessions, latest": beam.WindowInto(
        window.Sessions(7), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_LATEST
    ),
    # Nexmark q11's windowing: early panes after a count, the on-time pane the last.
    "sessions, early count": beam.WindowInto(
        window.Sessions(5),
        trigger=trigger.AfterWatermark(early=trigger.AfterCount(3)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    ),
    "sessions, after watermark": beam.WindowInto(
        window.Sessions(6),
        trigger=trigger.AfterWatermark(),
        accumulation_mode=trigger.AccumulationMode.DISCARDING,
    ),
    "sessions, early count, accumulating": beam.WindowInto(
        window.Sessions(5),
        trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
        accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
    ),
}


@pytest.mark.parametrize("windowing", sorted(SESSION_WINDOWINGS))
def test_sessions_give_beams_bytes_without_its_trigger_driver(windowing):
    """Beam's GeneralTriggerDriver's batch panes (process_entire_key), without it."""
    s = setup(tuple[str, int], SESSION_WINDOWINGS[windowing])
    assert grouping._Grouper(s.spec)._sessions is not None
    # Out of order, close enough that sessions merge, with gaps that keep some apart.
    _, actual = _grouped_both_ways(
        s, 90, lambda i: Timestamp((i * 37) % 71 + (i % 5) * 20, micros=i % 3)
    )
    window_fn = s.windowing.windowfn
    outputs = list(s.post.get_impl().decode_all(actual["k0"]))
    merged = [o for o in outputs if o.windows[0].end - o.windows[0].start > window_fn.gap_size]
    assert merged, "no session merged"
    if "early" in windowing:
        assert PaneInfoTiming.EARLY in {o.pane_info.timing for o in outputs}


@pytest.mark.parametrize(
    "windowing",
    [
        beam.WindowInto(
            window.Sessions(5),
            trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        ),
        beam.WindowInto(
            window.FixedWindows(10),
            trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING,
        ),
    ],
    ids=["sessions, late firings", "early firings"],
)
def test_other_merging_windows_and_triggers_keep_beams_trigger_driver(windowing):
    s = setup(tuple[str, int], windowing)
    grouper = grouping._Grouper(s.spec)
    assert not grouper._per_window and grouper._sessions is None
