"""KeyExtractor's sliced keys: equal to decoding each element and re-encoding its key."""

import dataclasses
import typing

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders import KeyExtractor
from beam_spark_runner.coders.keys import sliceable_key_parts
from beam_spark_runner.planning import build_plan

GLOBAL = (GlobalWindow(),)
STR = coders.StrUtf8Coder()
BYTES = coders.BytesCoder()
INT = coders.VarIntCoder()
OPAQUE = coders.LengthPrefixCoder(coders.BytesCoder())

INTS = [0, 1, 63, 64, 127, 128, 300, 16_383, 16_384, 2**31, 2**63 - 1, -1, -300, -(2**63)]
STRS = ["", "a", "ab", "ünïcødé ✓", "x" * 127, "x" * 128, "y" * 20_000]
BYTESES = [b"", b"\x00", b"\xff\x80\x00", bytes(range(256)), b"z" * 70_000]

KEY_CASES = {
    "varint": (INT, INTS),
    "str": (STR, STRS),
    "bytes": (BYTES, BYTESES),
    "opaque user key": (OPAQUE, [b"\x80\x04pickled", b"", b"p" * 300]),
    "kv(str, int)": (coders.TupleCoder([STR, INT]), [(s, i) for s in STRS for i in INTS[:4]]),
    "kv(int, str)": (coders.TupleCoder([INT, STR]), [(i, s) for i in INTS[:5] for s in STRS]),
    "kv(str, str)": (coders.TupleCoder([STR, STR]), [("ab", "c"), ("a", "bc"), ("", "abc")]),
    "tuple(str, int, bytes)": (
        coders.TupleCoder([STR, INT, BYTES]),
        [(s, i, b) for s in STRS[:3] for i in INTS[:3] for b in BYTESES],
    ),
    "kv(kv(str, bytes), int)": (
        coders.TupleCoder([coders.TupleCoder([STR, BYTES]), INT]),
        [((s, b), i) for s in STRS[:3] for b in BYTESES[:3] for i in INTS[:3]],
    ),
    "kv(int, kv(opaque, str))": (
        coders.TupleCoder([INT, coders.TupleCoder([OPAQUE, STR])]),
        [(i, (b, s)) for i in INTS[:3] for b in [b"", b"q" * 200] for s in STRS[:4]],
    ),
}

VALUE_CODERS = {
    "varint": (INT, 7),
    "str": (STR, "value"),
    "opaque": (OPAQUE, b"\x80\x04v"),
    "kv": (coders.TupleCoder([STR, INT]), ("v", -5)),
}


def windowed_coder(key_coder, value_coder=INT, window_coder=None):
    return coders.WindowedValueCoder(
        coders.TupleCoder([key_coder, value_coder]), window_coder or coders.GlobalWindowCoder()
    )


def encode(coder, elements):
    impl = coder.get_impl()
    out = bi.create_OutputStream()
    ends = []
    for element in elements:
        impl.encode_to_stream(element, out, True)
        ends.append(out.size())
    return out.get(), ends


def both_ways(coder, elements):
    data, ends = encode(coder, elements)
    extractor = KeyExtractor(coder)
    return extractor.keys(data, ends), extractor.decoded_keys(data, ends)


def count_decodes(extractor, monkeypatch):
    """The sizes of the decoded_keys calls ``extractor`` makes from now (until undone)."""
    decoded_elements = []
    original = extractor.decoded_keys

    def counting(data, ends):
        decoded_elements.append(len(ends))
        return original(data, ends)

    monkeypatch.setattr(extractor, "decoded_keys", counting)
    return decoded_elements


@pytest.mark.parametrize("value_case", sorted(VALUE_CODERS))
@pytest.mark.parametrize("key_case", sorted(KEY_CASES))
def test_sliced_keys_equal_decoded_keys(key_case, value_case):
    key_coder, keys = KEY_CASES[key_case]
    value_coder, value = VALUE_CODERS[value_case]
    coder = windowed_coder(key_coder, value_coder)
    assert sliceable_key_parts(coder) is not None, "expected the sliced path"
    timestamps = [MIN_TIMESTAMP, Timestamp(0), Timestamp(-7), Timestamp(10**6), MAX_TIMESTAMP]
    elements = [
        WindowedValue((key, value), timestamps[i % len(timestamps)], GLOBAL)
        for i, key in enumerate(keys)
    ]
    sliced, decoded = both_ways(coder, elements)
    assert sliced == decoded
    assert decoded == [key_coder.encode(key) for key in keys]


PARAM_PAYLOAD = bi.global_window_param_payload()


def value_only_coder(key_coder, value_coder=INT):
    return coders.ParamWindowedValueCoder(
        PARAM_PAYLOAD, [coders.TupleCoder([key_coder, value_coder]), coders.GlobalWindowCoder()]
    )


@pytest.mark.parametrize("value_case", sorted(VALUE_CODERS))
@pytest.mark.parametrize("key_case", sorted(KEY_CASES))
def test_value_only_elements_have_their_keys_sliced(key_case, value_case, monkeypatch):
    """Value-only elements (no header, see planning.value_only_group_coders) slice too."""
    key_coder, keys = KEY_CASES[key_case]
    value_coder, value = VALUE_CODERS[value_case]
    coder = value_only_coder(key_coder, value_coder)
    elements = [WindowedValue((key, value), Timestamp(i), GLOBAL) for i, key in enumerate(keys)]
    data, ends = encode(coder, elements)
    assert len(data) == sum(
        len(coders.TupleCoder([key_coder, value_coder]).get_impl().encode_nested((key, value)))
        for key in keys
    )
    extractor = KeyExtractor(coder)
    decoded = extractor.decoded_keys(data, ends)
    monkeypatch.setattr(extractor, "decoded_keys", lambda *_: pytest.fail("decoded"))
    assert extractor.keys(data, ends) == decoded == [key_coder.encode(key) for key in keys]


def test_sliced_keys_do_not_decode_regular_elements(monkeypatch):
    coder = windowed_coder(STR)
    data, ends = encode(coder, [WindowedValue((s, 1), Timestamp(0), GLOBAL) for s in STRS])
    extractor = KeyExtractor(coder)
    monkeypatch.setattr(extractor, "decoded_keys", lambda *_: pytest.fail("decoded"))
    assert extractor.keys(data, ends) == [s.encode() for s in STRS]


def test_elements_with_longer_panes_or_other_window_counts_are_decoded(monkeypatch):
    """Panes with indexes take more than one byte; those elements fall back to decoding."""
    coder = windowed_coder(coders.TupleCoder([STR, INT]), STR)
    panes = [
        PaneInfo(True, False, PaneInfoTiming.ON_TIME, 0, 0),  # one byte
        PaneInfo(False, False, PaneInfoTiming.EARLY, 3, -1),  # one index
        PaneInfo(False, True, PaneInfoTiming.LATE, 300, 2),  # two indexes
        PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0),
    ]
    windows = [GLOBAL, (), GLOBAL * 2, GLOBAL]
    elements = [
        WindowedValue(((s, i), "v"), Timestamp(i), windows[i % 4], panes[(i + j) % 4])
        for i, s in enumerate(STRS)
        for j in range(4)
    ]
    extractor = KeyExtractor(coder)
    data, ends = encode(coder, elements)
    decoded_elements = count_decodes(extractor, monkeypatch)
    sliced = extractor.keys(data, ends)
    monkeypatch.undo()
    assert sliced == extractor.decoded_keys(data, ends)
    # Only the elements whose panes have indexes were decoded, one at a time.
    assert decoded_elements == [1] * (len(elements) // 2)


@pytest.mark.parametrize(
    "coder",
    [
        # Key coders whose slice is not proven equal to their re-encoding.
        windowed_coder(coders.FloatCoder()),
        windowed_coder(coders.BooleanCoder()),
        windowed_coder(coders.FastPrimitivesCoder()),
        windowed_coder(coders.LengthPrefixCoder(STR)),
        windowed_coder(coders.TupleCoder([STR, coders.FloatCoder()])),
        windowed_coder(coders.NullableCoder(STR)),
        windowed_coder(coders.IterableCoder(STR)),
        # Not a windowed KV.
        coders.WindowedValueCoder(coders.TupleCoder([STR]), coders.GlobalWindowCoder()),
        # Value-only, but in a window whose encoding has a size of its own.
        coders.ParamWindowedValueCoder(
            PARAM_PAYLOAD, [coders.TupleCoder([STR, INT]), coders.IntervalWindowCoder()]
        ),
    ],
    # Some of these coders' str() raises on older Beam (a 1-tuple's, on 2.68).
    ids=[
        "float",
        "bool",
        "fast-primitives",
        "prefixed-str",
        "str-float",
        "nullable",
        "iterable",
        "not-kv",
        "param-interval-window",
    ],
)
def test_other_coders_take_the_decoding_path(coder):
    assert sliceable_key_parts(coder) is None


# Interval windows whose spans take 1, 2, 3 and 10 varint bytes (a negative span), at the
# ends of time and around zero.
INTERVAL_WINDOWS = [
    IntervalWindow(0, 10),
    IntervalWindow(-7, 3),
    IntervalWindow(Timestamp(micros=-1_500), Timestamp(micros=2_500)),
    IntervalWindow(100, 100 + 60),
    IntervalWindow(0, 3_600),
    IntervalWindow(5, 4),
    IntervalWindow(MIN_TIMESTAMP, Timestamp(0)),
    IntervalWindow(Timestamp(0), MAX_TIMESTAMP),
]


@pytest.mark.parametrize("value_case", sorted(VALUE_CODERS))
@pytest.mark.parametrize("key_case", sorted(KEY_CASES))
def test_keys_of_elements_in_one_interval_window_are_sliced(key_case, value_case, monkeypatch):
    key_coder, keys = KEY_CASES[key_case]
    value_coder, value = VALUE_CODERS[value_case]
    coder = windowed_coder(key_coder, value_coder, window_coder=coders.IntervalWindowCoder())
    assert sliceable_key_parts(coder) is not None, "expected the sliced path"
    elements = [
        WindowedValue((key, value), Timestamp(i), (INTERVAL_WINDOWS[i % len(INTERVAL_WINDOWS)],))
        for i, key in enumerate(keys)
    ]
    data, ends = encode(coder, elements)
    extractor = KeyExtractor(coder)
    decoded = extractor.decoded_keys(data, ends)
    monkeypatch.setattr(extractor, "decoded_keys", lambda *_: pytest.fail("decoded"))
    assert extractor.keys(data, ends) == decoded == [key_coder.encode(key) for key in keys]


def test_interval_windowed_elements_in_other_than_one_window_or_long_panes_are_decoded(
    monkeypatch,
):
    coder = windowed_coder(coders.TupleCoder([STR, INT]), STR, coders.IntervalWindowCoder())
    early = PaneInfo(False, False, PaneInfoTiming.EARLY, 3, -1)  # a pane with an index
    odd = [
        ((), PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0)),
        (
            (IntervalWindow(0, 10), IntervalWindow(5, 15)),
            PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0),
        ),
        ((IntervalWindow(0, 10),), early),
    ]
    elements = []
    for i, s in enumerate(STRS):
        windows, pane = odd[i % len(odd)]
        elements.append(WindowedValue(((s, i), "v"), Timestamp(i), windows, pane))
        elements.append(WindowedValue(((s, -i), "w"), Timestamp(i), (IntervalWindow(i, i + 60),)))
    extractor = KeyExtractor(coder)
    data, ends = encode(coder, elements)
    decoded_elements = count_decodes(extractor, monkeypatch)
    sliced = extractor.keys(data, ends)
    array, value_starts, decoded_indexes = extractor.key_array_and_value_starts(data, ends)
    monkeypatch.undo()
    assert sliced == array.to_pylist() == extractor.decoded_keys(data, ends)
    # Every other element, the odd ones, was decoded, one at a time, by each method.
    assert decoded_elements == [1] * len(elements)
    assert decoded_indexes.tolist() == list(range(0, len(elements), 2))
    # A sliced element's value starts where its key ends.
    value_impl = STR.get_impl()
    for index in range(1, len(elements), 2):
        end = ends[index]
        assert (
            value_impl.decode_from_stream(
                bi.create_InputStream(data[value_starts[index] : end]), True
            )
            == elements[index].value[1]
        )


@dataclasses.dataclass(frozen=True)
class _UserKey:
    """A key Beam can only pickle: the runner-safe coder makes it opaque bytes."""

    name: str


@pytest.mark.parametrize(
    "kv_type",
    [
        tuple[int, int],
        tuple[str, bytes],
        tuple[tuple[str, int], int],
        tuple[_UserKey, int],
        typing.Any,
    ],
    ids=["int", "str", "kv", "user type", "any"],
)
def test_the_runner_safe_coders_of_common_keys_are_sliced(kv_type):
    """The coders the planner gives a GroupByKey's writers take the sliced path."""
    p = beam.Pipeline()
    _ = p | beam.Create([1]) | beam.Map(lambda x: (x, x)).with_output_types(kv_type)
    _ = _ | beam.GroupByKey()
    proto = bi.prepare_pipeline_proto(p.to_runner_api(default_environment=bi.default_environment()))
    plan = build_plan(proto)
    (buffer,) = [b for b in plan.buffers.values() if b.kind == "group"]
    (input_pcoll,) = plan.components.transforms[buffer.name].inputs.values()
    context = bi.PipelineContext(plan.components)
    sdk_coder_id = plan.data_channel_coders[input_pcoll]
    safe = context.coders[plan.safe_coders[sdk_coder_id]]
    assert sliceable_key_parts(safe) is not None, safe
    sample = {
        tuple[int, int]: [(5, 1), (-5, 2), (5, 3)],
        tuple[str, bytes]: [("k", b"1"), ("", b"2"), ("k", b"3")],
        tuple[tuple[str, int], int]: [(("k", 1), 1), (("k", 2), 2), (("k", 1), 3)],
        tuple[_UserKey, int]: [(_UserKey("a"), 1), (_UserKey("b"), 2), (_UserKey("a"), 3)],
        typing.Any: [("k", 1), (1, 2), (("k", 1.5), 3), ("k", 4)],
    }[kv_type]
    # Elements are written by the SDK coder and read by the runner-safe one.
    data, ends = encode(
        context.coders[sdk_coder_id], [WindowedValue(kv, Timestamp(0), GLOBAL) for kv in sample]
    )
    extractor = KeyExtractor(safe)
    keys = extractor.keys(data, ends)
    assert keys == extractor.decoded_keys(data, ends)
    for i, (key, _) in enumerate(sample):
        for j, (other, _) in enumerate(sample):
            assert (keys[i] == keys[j]) == (key == other)
