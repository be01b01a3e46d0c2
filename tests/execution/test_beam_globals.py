"""Beam's per-pipeline process globals (pickler, pickled-type caches) across pipeline runs.

Spark's Python workers and the driver run one pipeline after another. Each run must see
Beam's globals as a fresh process would with its own options: before ``beam_globals``, a
pipeline with ``--update_compatibility_version=2.66.0`` (keys pickle their types with dill)
run after a default one (cloudpickle) wrote cloudpickle's bytes for a key type in worker
processes that had encoded it before and dill's elsewhere, so GroupByKey split one key in
two or failed to decode it (Beam's ``test_group_by_key_importable_special_types_1`` in the
validates-runner suite); and workers unpickled a ``--pickle_library=dill`` pipeline's
functions with cloudpickle.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any, NamedTuple

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.coders import coders
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions, StreamingOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import beam_globals
from beam_spark_runner.execution.stage_worker import (
    ELEMENT,
    KEY,
    TAG,
    StageSpec,
    run_stage,
)
from beam_spark_runner.planning import build_plan
from tests.stage_specs import stage_spec

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]
# Beam's last release whose deterministic key coder pickles types with dill.
DILL_COMPAT_VERSION = "2.66.0"

needs_dill = pytest.mark.skipif(
    importlib.util.find_spec("dill") is None,
    reason=(
        "dill is not installed: --update_compatibility_version<=2.67.0 and "
        "--pickle_library=dill need it (pip install 'dill>=0.3.1.1,<0.3.2', Beam's [dill] extra)"
    ),
)

try:  # Beam 2.69+: a pipeline's options choose how its keys pickle special types
    from apache_beam.options.pipeline_options_context import scoped_pipeline_options
except ImportError:  # pragma: no cover - Beam 2.68, the oldest line of the matrix
    scoped_pipeline_options = None
needs_key_type_pickler = pytest.mark.skipif(
    scoped_pipeline_options is None,
    reason="needs Beam 2.69+: older Beam pickles key types one way whatever the pipeline "
    "(apache_beam.options.pipeline_options_context is missing)",
)


class SpecialKey(NamedTuple):
    """A "special type" key: deterministic key coders pickle its type into the key."""

    f1: int
    f2: str


KEY_VALUE = SpecialKey(1, "a")


@pytest.fixture(autouse=True)
def _restore_pickler() -> Iterator[None]:
    yield
    pickler.set_library(pickler.DEFAULT_PICKLE_LIB)


def cloudpickle_key_coder() -> coders.Coder:
    """The deterministic key coder of a default pipeline (types pickled by cloudpickle)."""
    return coders.DeterministicFastPrimitivesCoderV2(coders.FastPrimitivesCoder(), "GBK")


def test_type_pickle_caches_are_found() -> None:
    assert bi.type_pickle_caches() is not None


def test_a_new_run_empties_the_pickled_type_caches() -> None:
    caches = bi.type_pickle_caches()
    assert caches is not None
    pickled, unpickled = caches
    beam_globals.enter_run("caches-run-1", "default")
    coder = cloudpickle_key_coder()
    coder.decode(coder.encode(KEY_VALUE))
    assert SpecialKey in pickled
    assert SpecialKey in unpickled.values()

    beam_globals.enter_run("caches-run-1", "default")  # same run: caches kept
    assert SpecialKey in pickled

    beam_globals.enter_run("caches-run-2", "default")
    assert not pickled
    assert not unpickled


@needs_dill
def _current_pickler() -> str:
    # pickler.is_currently_dill() is newer than Beam 2.68; this attribute is in both.
    return str(pickler.desired_pickle_lib.__name__.rsplit(".", 1)[-1])


def test_a_run_uses_its_pipelines_pickle_library() -> None:
    beam_globals.enter_run("pickler-run-1", "dill")
    assert _current_pickler() == "dill_pickler"
    beam_globals.enter_run("pickler-run-2", "default")
    assert _current_pickler() == "cloudpickle_pickler"
    beam_globals.apply("dill")
    assert _current_pickler() == "dill_pickler"


def one_special_type_key(_: bytes) -> Iterator[Any]:
    yield SpecialKey(1, "a"), 1


def _key_stage(run_id: str) -> StageSpec:
    """The stage writing a GroupByKey's input keyed by SpecialKey, in a pipeline
    with --update_compatibility_version=2.66.0 (its key coder pickles types with dill)."""
    options = PipelineOptions(update_compatibility_version=DILL_COMPAT_VERSION)
    with scoped_pipeline_options(options):
        p = beam.Pipeline(options=options)
        _ = p | beam.Impulse() | beam.ParDo(one_special_type_key) | beam.GroupByKey()
        proto = p.to_runner_api()
    plan = build_plan(bi.prepare_pipeline_proto(proto))
    (stage,) = [s for s in plan.stages if any(plan.is_keyed(o.buffer_id) for o in s.outputs)]
    return stage_spec(plan, stage, run_id)


@needs_dill
@needs_key_type_pickler
def test_a_worker_encodes_keys_as_a_fresh_process_after_another_pipeline() -> None:
    # A previous run in this worker process encoded the key type with cloudpickle.
    beam_globals.enter_run("previous-run", "default")
    cloudpickled = cloudpickle_key_coder().encode(KEY_VALUE)

    impulse = pa.RecordBatch.from_arrays(
        [pa.array([bi.ENCODED_IMPULSE_VALUE], type=pa.binary())], names=[ELEMENT]
    )
    (batch,) = list(run_stage(_key_stage("dill-compat-run"), [impulse]))
    (key,) = batch.filter(pa.compute.is_valid(batch.column(KEY))).column(KEY).to_pylist()
    assert batch.column(TAG).to_pylist() == [0]
    # The key holds the type pickled by dill, as in a process that never saw the type;
    # before, it held the cloudpickle bytes the previous run had cached.
    assert b"dill._dill" in key
    assert cloudpickled[1:] not in key


def group_special_type_keys(p: beam.Pipeline) -> None:
    """Beam's test_group_by_key_importable_special_types: one key, 10000 values."""

    def generate(_: int) -> Iterator[Any]:
        for _ in range(100):
            yield SpecialKey(1, "a"), 1

    result = (
        p
        | "Create" >> beam.Create(range(100))
        | "Generate" >> beam.ParDo(generate)
        | "Reshuffle" >> beam.Reshuffle()
        | "GBK" >> beam.GroupByKey()
        | "Sizes" >> beam.MapTuple(lambda key, values: (key, len(list(values))))
    )
    assert_that(result, equal_to([(KEY_VALUE, 10000)]))


class CheckKeyEncoding(beam.DoFn):
    """Fails where this worker process would encode the key type other than with dill."""

    def process(self, element: int) -> Iterator[int]:
        coder = coders.DeterministicFastPrimitivesCoder(coders.FastPrimitivesCoder(), "check")
        encoded = coder.encode(KEY_VALUE)
        if b"dill._dill" not in encoded:
            raise AssertionError(f"the key type is not pickled by dill here: {encoded[:40]!r}")
        yield element


def compat_options(*extra: str) -> PipelineOptions:
    options = PipelineOptions([*SPARK_ARGS, *extra])
    options.view_as(StreamingOptions).update_compatibility_version = DILL_COMPAT_VERSION
    return options


@pytest.mark.spark
@needs_dill
@needs_key_type_pickler
def test_pipelines_with_different_key_type_picklers_in_one_session() -> None:
    # 1. A default pipeline: workers pickle the key type with cloudpickle.
    with beam.Pipeline(options=PipelineOptions(SPARK_ARGS)) as p:
        group_special_type_keys(p)

    # 2. The same grouping with dill-pickled key types, in the same worker processes.
    with beam.Pipeline(options=compat_options()) as p:
        group_special_type_keys(p)
        _ = (
            p
            | "Many" >> beam.Create(range(16))
            | "Spread" >> beam.Reshuffle()
            | "Check" >> beam.ParDo(CheckKeyEncoding())
        )


# Run as __main__ in a fresh interpreter: dill pickles __main__'s lambdas in a form only
# dill loads (cloudpickle fails with "No module named '__builtin__'").
PICKLE_LIBRARY_SCRIPT = """
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]

# Workers unpickle a --pickle_library=dill pipeline with dill.
with beam.Pipeline(options=PipelineOptions([*ARGS, "--pickle_library=dill"])) as p:
    assert_that(p | beam.Create([1, 2]) | beam.Map(lambda v: v + 1), equal_to([2, 3]))
print("dill pipeline ran")

# The driver pickles a default pipeline with cloudpickle, though a dill pipeline was
# constructed (and set Beam's process-wide pickler) after it.
p = beam.Pipeline(options=PipelineOptions(ARGS))
assert_that(p | beam.Create([1, 2]) | beam.Map(lambda v: v * 10), equal_to([10, 20]))
beam.Pipeline(options=PipelineOptions([*ARGS, "--pickle_library=dill"]))
p.run().wait_until_finish()
print("default pipeline ran")
"""


@pytest.mark.spark
@needs_dill
def test_each_pipeline_pickles_and_unpickles_with_its_pickle_library(
    run_python: Any, tmp_path: Any
) -> None:
    script = tmp_path / "pickle_libraries.py"
    script.write_text(PICKLE_LIBRARY_SCRIPT)
    result = run_python([str(script)], timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dill pipeline ran" in result.stdout
    assert "default pipeline ran" in result.stdout
