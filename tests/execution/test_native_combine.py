"""Native combines: Beam's sum, min, max, count and mean as Spark aggregations.

What is planned natively and what keeps Beam's lifted combine; the typed values read from
encoded elements equal their decoding; the output values are Beam's CombineFns' on the
edge cases (big integers, negative numbers, NaN, infinities, ``None`` keys, empty inputs);
and whole pipelines on Spark give what FnApiRunner gives, with the path on and off.
"""

from __future__ import annotations

import decimal
import logging
import math

import apache_beam as beam
import pytest
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import combiners, window
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.typed_values import TypedValueReader
from beam_spark_runner.execution.native_combine import output_value
from beam_spark_runner.execution.partial_aggregation import NativeOutput, PartialAggregator
from beam_spark_runner.planning import (
    NATIVE_COMBINE_BUFFER_KIND,
    NativeAggregation,
    build_plan,
)
from tests.coders.test_keys import encode as _encoded

INT = coders.VarIntCoder()
FLOAT = coders.FloatCoder()
STR = coders.StrUtf8Coder()
PICKLED = coders.FastPrimitivesCoder()
BIG = 2**62


def _native(plan) -> dict[str, NativeAggregation]:
    """The native combines of a plan, by the user's transform name."""
    found = {}
    for buffer in plan.buffers.values():
        if buffer.kind == NATIVE_COMBINE_BUFFER_KIND:
            transform = plan.components.transforms[buffer.name]
            found[transform.unique_name] = NativeAggregation.from_payload(transform.spec.payload)
    return found


def _plan(build, native_combines: bool):
    pipeline = beam.Pipeline()
    build(pipeline)
    return build_plan(pipeline.to_runner_api(), native_combines=native_combines)


def _combines(pipeline: beam.Pipeline) -> None:
    ints = pipeline | "Ints" >> beam.Create([("a", 1), ("b", 2)])
    floats = pipeline | "Floats" >> beam.Create([("a", 1.5), ("b", 2.5)])
    strs = pipeline | "Strs" >> beam.Create([("a", "x"), ("b", "y")])
    _ = ints | "Sum" >> beam.CombinePerKey(sum)
    _ = ints | "Min" >> beam.CombinePerKey(min)
    _ = floats | "Max" >> beam.CombinePerKey(max)
    _ = floats | "Mean" >> combiners.Mean.PerKey()
    _ = strs | "Count" >> combiners.Count.PerKey()
    _ = strs | "Chars" >> beam.Values() | "PerElement" >> combiners.Count.PerElement()
    _ = ints | "Values" >> beam.Values() | "Total" >> beam.CombineGlobally(sum)
    # Not Beam's built-ins, or not over numbers, or not under default windowing:
    _ = ints | "ToList" >> beam.CombinePerKey(combiners.ToListCombineFn())
    _ = ints | "Lambda" >> beam.CombinePerKey(lambda values: sum(values))
    _ = strs | "StrMax" >> beam.CombinePerKey(max)
    _ = (
        ints
        | "Stamp" >> beam.Map(lambda kv: window.TimestampedValue(kv, kv[1]))
        | "Fixed" >> beam.WindowInto(window.FixedWindows(10))
        | "WindowedSum" >> beam.CombinePerKey(sum)
    )


def test_builtin_combines_over_numbers_are_planned_natively():
    native = _native(_plan(_combines, native_combines=True))
    assert native == {
        "Sum": NativeAggregation("sum", "int"),
        "Min": NativeAggregation("min", "int"),
        "Max": NativeAggregation("max", "float"),
        "Mean/CombinePerKey(MeanCombineFn)": NativeAggregation("mean", "float"),
        "Count/CombinePerKey(CountCombineFn)": NativeAggregation("count", "none"),
        "PerElement/CombinePerKey(CountCombineFn)": NativeAggregation("count", "none"),
        "Total/CombinePerKey": NativeAggregation("sum", "int"),
    }


def test_the_option_off_keeps_every_combine_on_beams_path():
    assert _native(_plan(_combines, native_combines=False)) == {}


def test_the_option_is_off_by_default(monkeypatch):
    from beam_spark_runner.options import NATIVE_COMBINES_ENV, spark_settings

    monkeypatch.delenv(NATIVE_COMBINES_ENV, raising=False)
    assert not spark_settings(PipelineOptions([])).native_combines
    assert spark_settings(PipelineOptions(["--spark_native_combines=on"])).native_combines


def test_bundle_processor_coders_of_the_writers_are_value_only():
    """A native combine's writers send values only, as into a default-windowed GroupByKey."""
    plan = _plan(_combines, native_combines=True)
    native_buffers = [b for b in plan.buffers.values() if b.kind == NATIVE_COMBINE_BUFFER_KIND]
    assert native_buffers
    for buffer in native_buffers:
        coder = plan.components.coders[plan.group_input_coders[buffer.buffer_id]]
        assert coder.spec.urn == bi.PARAM_WINDOWED_VALUE_CODER_URN
        assert plan.is_keyed(buffer.buffer_id)


# --- typed values read from encoded elements ------------------------------------------------

INTS = [0, 1, 63, 64, 127, 128, 300, 2**31, 2**63 - 1, -1, -300, -(2**63)]
FLOATS = [0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, math.inf, -math.inf, math.nan]


def _coder(key_coder, value_coder, value_only: bool):
    kv = coders.TupleCoder([key_coder, value_coder])
    if value_only:
        return coders.ParamWindowedValueCoder(
            bi.global_window_param_payload(), [kv, coders.GlobalWindowCoder()]
        )
    return coders.WindowedValueCoder(kv, coders.GlobalWindowCoder())


@pytest.mark.parametrize("value_only", [True, False], ids=["value-only", "windowed"])
@pytest.mark.parametrize("prefixed", [False, True], ids=["plain", "length-prefixed"])
@pytest.mark.parametrize(
    "key_coder, keys",
    [(STR, ["", "k", "ü" * 70]), (INT, [0, -1, 300]), (PICKLED, [None, ("t", 1), 2.5])],
    ids=["str keys", "int keys", "pickled keys (decoded)"],
)
@pytest.mark.parametrize("value_type", ["int", "float"])
def test_typed_values_equal_the_decoded_values(value_type, key_coder, keys, prefixed, value_only):
    values = INTS if value_type == "int" else FLOATS
    value_coder = INT if value_type == "int" else FLOAT
    if prefixed:
        value_coder = coders.LengthPrefixCoder(value_coder)
    coder = _coder(key_coder, value_coder, value_only)
    elements = [
        WindowedValue((keys[i % len(keys)], value), 0, (window.GlobalWindow(),))
        for i, value in enumerate(values)
    ]
    data, ends = _encoded(coder, elements)
    keys_read, read = TypedValueReader(coder, coder, value_type).read(data, ends)
    assert keys_read.to_pylist() == [key_coder.encode(e.value[0]) for e in elements]
    for got, element in zip(read.tolist(), elements, strict=True):
        expected = element.value[1]
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(got)
        else:
            assert got == expected and type(got) is type(expected)
            if isinstance(expected, float):
                assert math.copysign(1.0, got) == math.copysign(1.0, expected)


def test_the_reader_reads_values_with_the_streams_own_coder():
    """The runner-safe coder may see a length-prefixed value as opaque bytes; the reader
    reads it as the data channel's coder writes it."""
    safe = _coder(STR, coders.LengthPrefixCoder(coders.BytesCoder()), True)
    sdk = _coder(STR, coders.LengthPrefixCoder(INT), True)
    elements = [WindowedValue(("k", v), 0, (window.GlobalWindow(),)) for v in INTS]
    data, ends = _encoded(sdk, elements)
    _, read = TypedValueReader(safe, sdk, "int").read(data, ends)
    assert read.tolist() == INTS


@pytest.mark.parametrize(
    "function, value_type, values, expected",
    [
        ("count", "none", None, {"a": (None, 3), "b": (None, 1)}),
        ("sum", "int", [1, 2, 3, 4], {"a": (6, None), "b": (4, None)}),
        ("mean", "int", [1, 2, 3, 4], {"a": (6, 3), "b": (4, 1)}),
        ("min", "int", [5, -2, 3, 4], {"a": (-2, None), "b": (4, None)}),
        ("max", "float", [0.5, 2.5, -1.0, 4.0], {"a": (2.5, None), "b": (4.0, None)}),
        # Could overflow when added: one row per element, Spark adds them as decimals.
        ("sum", "int", [2**62, 2**62, 1, 1], None),
    ],
)
def test_partial_aggregates_per_key_and_bundle(function, value_type, values, expected):
    value_coder = FLOAT if value_type == "float" else INT
    coder = _coder(STR, value_coder, True)
    keys = ["a", "a", "a", "b"]
    elements = [
        WindowedValue((k, (values or [0] * 4)[i]), 0, (window.GlobalWindow(),))
        for i, k in enumerate(keys)
    ]
    data, ends = _encoded(coder, elements)
    native = NativeOutput(function, value_type, "unused")
    batch = PartialAggregator(native, coder, coder).record_batch(3, data, ends)
    rows = batch.to_pylist()
    assert {row["tag"] for row in rows} == {3}
    assert all(row["element"] is None for row in rows)
    column = {"int": "int_value", "float": "float_value"}.get(value_type)
    got = {
        row["key"].decode(): (row[column] if column else None, row["value_count"]) for row in rows
    }
    if expected is None:  # per element
        assert len(rows) == 4
        assert sorted(row["int_value"] for row in rows) == sorted(values)
    else:
        assert got == expected


# --- output values ----------------------------------------------------------------------


def _beam(combine_fn, values):
    """What Beam's CombineFn gives for these values, in two accumulators merged."""
    fn = beam.core.CombineFn.maybe_from_callable(combine_fn)
    half = len(values) // 2
    accumulators = []
    for part in (values[:half], values[half:]):
        accumulator = fn.create_accumulator()
        for value in part:
            accumulator = fn.add_input(accumulator, value)
        accumulators.append(accumulator)
    return fn.extract_output(fn.merge_accumulators(accumulators))


def _spark_like(function, value_type, values):
    """The aggregate Spark computes (decimal sums of integers), then output_value."""
    if function == "count":
        return output_value(function, value_type, len(values))
    if function in ("sum", "mean"):
        total = decimal.Decimal(sum(values)) if value_type == "int" else float(sum(values))
        return output_value(function, value_type, total, len(values))
    return output_value(function, value_type, (min if function == "min" else max)(values))


@pytest.mark.parametrize(
    "values",
    [
        [2**63 - 1, 2**63 - 1, 5],
        [-(2**63), -(2**63)],
        [BIG, BIG, BIG, -7],
        [3],
        [-1, 0, 1],
    ],
    ids=["over int64", "under int64", "big", "one", "mixed signs"],
)
@pytest.mark.parametrize(
    "function, combine_fn",
    [
        ("sum", sum),
        ("min", min),
        ("max", max),
        ("count", combiners.CountCombineFn()),
        ("mean", combiners.MeanCombineFn()),
    ],
    ids=["sum", "min", "max", "count", "mean"],
)
def test_integer_outputs_are_beams(function, combine_fn, values):
    expected = _beam(combine_fn, values)
    got = _spark_like(function, "int", values)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "values",
    [[1.5, 2.25], [math.inf, 1.0], [math.inf, -math.inf], [math.nan, 1.0], [-0.0]],
    ids=["plain", "inf", "inf-inf", "nan", "negative zero"],
)
@pytest.mark.parametrize(
    "function, combine_fn",
    [("sum", sum), ("mean", combiners.MeanCombineFn()), ("count", combiners.CountCombineFn())],
    ids=["sum", "mean", "count"],
)
def test_float_outputs_are_beams(function, combine_fn, values):
    expected = _beam(combine_fn, values)
    got = _spark_like(function, "float", values)
    if isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == expected and type(got) is type(expected)


def test_an_integer_mean_converts_the_sum_to_a_float_first():
    """``MeanCombineFn`` computes ``sum / float(count)``: the sum is rounded to a float."""
    values = [2**53 + 1, 2**53 + 1, 2**53 + 1]
    assert output_value("mean", "int", decimal.Decimal(sum(values)), 3) == _beam(
        combiners.MeanCombineFn(), values
    )


# --- whole pipelines ------------------------------------------------------------------------

INT_PAIRS = [("a", 1), ("b", 2), ("a", 3), ("c", -5), ("c", BIG), ("c", BIG), ("c", BIG)]
FLOAT_PAIRS = [("a", 1.5), ("b", math.inf), ("a", 2.25), ("b", 1.0), ("z", -0.0)]


def _edge_cases(pipeline: beam.Pipeline) -> dict[str, beam.PCollection]:
    ints = pipeline | "Ints" >> beam.Create(INT_PAIRS)
    floats = pipeline | "Floats" >> beam.Create(FLOAT_PAIRS)
    words = pipeline | "Words" >> beam.Create(["x", "y", "x", None, "x"])
    empty = pipeline | "Empty" >> beam.Create([]).with_output_types(int)
    values = ints | "IntValues" >> beam.Values()
    return {
        "sum": ints | "Sum" >> beam.CombinePerKey(sum),
        "min": ints | "Min" >> beam.CombinePerKey(min),
        "max": ints | "Max" >> beam.CombinePerKey(max),
        "mean": ints | "Mean" >> combiners.Mean.PerKey(),
        "count": ints | "Count" >> combiners.Count.PerKey(),
        "float sum": floats | "FloatSum" >> beam.CombinePerKey(sum),
        "float mean": floats | "FloatMean" >> combiners.Mean.PerKey(),
        "float max": floats | "FloatMax" >> beam.CombinePerKey(max),
        "per element (None included)": words | combiners.Count.PerElement(),
        "sum globally (over int64)": values | "Total" >> beam.CombineGlobally(sum),
        "count globally": values | "CountAll" >> combiners.Count.Globally(),
        "mean globally": values | "MeanAll" >> combiners.Mean.Globally(),
        "empty sum globally": empty | "EmptySum" >> beam.CombineGlobally(sum),
        "empty count globally": empty | "EmptyCount" >> combiners.Count.Globally(),
        "empty per key": empty
        | "Pair" >> beam.Map(lambda v: ("k", v))
        | "EmptyPerKey" >> beam.CombinePerKey(sum),
        # Falls back to Beam's lifted combine:
        "to list": ints | "ToList" >> beam.CombinePerKey(combiners.ToListCombineFn()),
    }


def _canonical(value):
    """A comparable form: sorted lists, NaN as a string, floats tagged with their sign."""
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else repr(value))
    if isinstance(value, (list, tuple)):
        items = [_canonical(v) for v in value]
        return tuple(sorted(items, key=repr)) if isinstance(value, list) else tuple(items)
    return value


_KEPT: dict[str, list] = {}


def _keep(value: list, name: str) -> None:
    _KEPT[name] = value


def _fn_api_runner_results() -> dict[str, list]:
    """Each output of the edge cases, as FnApiRunner gives it (it runs in this process)."""
    _KEPT.clear()
    pipeline = beam.Pipeline(runner=FnApiRunner())
    for name, pcoll in _edge_cases(pipeline).items():
        _ = (
            pcoll
            | f"Collect {name}" >> combiners.ToList()
            | f"Keep {name}" >> beam.Map(_keep, name)
        )
    pipeline.run().wait_until_finish()
    return dict(_KEPT)


@pytest.mark.parametrize("native", ["on", pytest.param("off", marks=pytest.mark.slow)])
def test_pipelines_give_what_fn_api_runner_gives(beam_options, native, caplog):
    expected = _fn_api_runner_results()
    assert sum(v for _, v in INT_PAIRS) > 2**63 - 1
    assert expected["sum globally (over int64)"] == [sum(v for _, v in INT_PAIRS)]
    assert expected["empty sum globally"] == [0]
    assert expected["empty per key"] == []
    pipeline = beam.Pipeline(
        options=PipelineOptions([*beam_options, f"--spark_native_combines={native}"])
    )
    for name, pcoll in _edge_cases(pipeline).items():
        assert_that(
            pcoll
            | f"Collect {name}" >> combiners.ToList()
            | f"Canonical {name}" >> beam.Map(_canonical),
            equal_to([_canonical(expected[name])]),
            label=f"Check {name}",
        )
    with caplog.at_level(logging.INFO, logger="beam_spark_runner.planning"):
        pipeline.run().wait_until_finish()
    aggregated = [r.getMessage() for r in caplog.records if "as a Spark aggregation" in r.message]
    assert len(aggregated) == (15 if native == "on" else 0), aggregated
