"""The runner's graph phases: Reshuffles as the runner's repartition or as Beam expands them."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindows

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import PipelineExecutionError
from beam_spark_runner.planning import RESHUFFLE_BUFFER_KIND, build_plan
from tests.conftest import SPARK_TEST_MASTER

# The last Beam release whose Reshuffle expansion pickles its elements.
_PICKLING_RELEASE = "2.63.0"


class _Unpicklable:
    """As Beam's util_test: a value with a coder of its own that refuses pickling."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __getstate__(self) -> Any:
        raise NotImplementedError("not picklable")

    def __setstate__(self, state: Any) -> None:
        raise NotImplementedError("not picklable")


class _UnpicklableCoder(beam.coders.Coder):  # type: ignore[misc]
    def encode(self, value: _Unpicklable) -> bytes:
        return str(value.value).encode()

    def decode(self, encoded: bytes) -> _Unpicklable:
        return _Unpicklable(int(encoded.decode()))

    def to_type_hint(self) -> type:
        return _Unpicklable

    def is_deterministic(self) -> bool:
        return True


beam.coders.registry.register_coder(_Unpicklable, _UnpicklableCoder)


def _reshuffled(pipeline: beam.Pipeline) -> Any:
    return (
        pipeline
        | beam.Create([_Unpicklable(i) for i in range(5)])
        | beam.WindowInto(GlobalWindows())
        | beam.Reshuffle()
        | beam.Map(lambda u: u.value * 10)
    )


def _reshuffle_buffers(options: PipelineOptions) -> list[bytes]:
    pipeline = beam.Pipeline(options=options)
    _ = _reshuffled(pipeline)
    plan = build_plan(
        pipeline.to_runner_api(default_environment=bi.default_environment()),
        beam_reshuffles=bi.reshuffles_expand_as_older_beam(options),
    )
    return [
        stage.input_buffer_id
        for stage in plan.stages
        if stage.input_buffer_id.startswith(f"{RESHUFFLE_BUFFER_KIND}:".encode())
    ]


def test_a_reshuffle_runs_as_beam_expands_it_for_an_update_of_an_older_beam() -> None:
    assert _reshuffle_buffers(PipelineOptions([]))
    assert _reshuffle_buffers(PipelineOptions(["--update_compatibility_version=2.65.0"]))
    # Before 2.65 Beam's expansion resets panes; before 2.64 it also pickles the elements.
    for older in ("2.64.0", _PICKLING_RELEASE):
        options = PipelineOptions([f"--update_compatibility_version={older}"])
        assert not _reshuffle_buffers(options), older


def _options(streaming: bool, *extra: str) -> PipelineOptions:
    return PipelineOptions(
        [
            "--runner=SparkStructuredRunner",
            f"--spark_master={SPARK_TEST_MASTER}",
            *(["--streaming"] if streaming else []),
            *extra,
        ]
    )


@pytest.mark.spark
@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "streaming"])
def test_unpicklable_elements_fail_a_reshuffle_where_beams_fails(streaming: bool) -> None:
    # Beam's own runners raise a RuntimeError naming the pickling step (util_test's
    # test_reshuffle_unpicklable_in_global_window).
    older = _options(streaming, f"--update_compatibility_version={_PICKLING_RELEASE}")
    with pytest.raises(RuntimeError, match="reify_timestamps") as raised:
        with beam.Pipeline(options=older) as pipeline:
            _ = _reshuffled(pipeline)
    assert isinstance(raised.value, PipelineExecutionError)
    assert "NotImplementedError" in str(raised.value)


@pytest.mark.spark
def test_the_typed_reshuffle_carries_unpicklable_elements() -> None:
    pipeline = beam.Pipeline(options=_options(False))
    assert_that(_reshuffled(pipeline), equal_to([0, 10, 20, 30, 40]))
    assert pipeline.run().wait_until_finish() == PipelineState.DONE
