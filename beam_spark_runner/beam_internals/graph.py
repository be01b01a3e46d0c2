"""FnApiRunner's graph phases, environments, URNs and pipeline-proto helpers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from apache_beam.portability import common_urns, python_urns
from apache_beam.portability.api import (
    beam_runner_api_pb2,
)
from apache_beam.runners import common as runners_common
from apache_beam.runners.pipeline_context import PipelineContext
from apache_beam.runners.pipeline_utils import (
    merge_common_environments,
    merge_superset_dep_environments,
    validate_pipeline_graph,
)
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.runners.worker import (
    bundle_processor,
)
from apache_beam.transforms import environments, window
from apache_beam.utils import proto_utils

# Graph phases and helpers from FnApiRunner's translations module.
Stage = translations.Stage
TransformContext = translations.TransformContext
create_and_optimize_stages = translations.create_and_optimize_stages
create_buffer_id = translations.create_buffer_id
split_buffer_id = translations.split_buffer_id
only_element = translations.only_element
unique_name = translations.unique_name
IMPULSE_BUFFER: bytes = translations.IMPULSE_BUFFER
PAR_DO_URNS: frozenset[str] = translations.PAR_DO_URNS

# Runner <-> SDK data plane transforms inside a fused stage.
DATA_INPUT_URN: str = bundle_processor.DATA_INPUT_URN
DATA_OUTPUT_URN: str = bundle_processor.DATA_OUTPUT_URN
IDENTITY_DOFN_URN: str = bundle_processor.IDENTITY_DOFN_URN
ENCODED_IMPULSE_VALUE: bytes = runners_common.ENCODED_IMPULSE_VALUE
STATE_BACKED_ITERABLE_CODER_URN: str = common_urns.coders.STATE_BACKED_ITERABLE.urn
WINDOWED_VALUE_CODER_URN: str = common_urns.coders.WINDOWED_VALUE.urn
PARAM_WINDOWED_VALUE_CODER_URN: str = common_urns.coders.PARAM_WINDOWED_VALUE.urn
LENGTH_PREFIX_CODER_URN: str = common_urns.coders.LENGTH_PREFIX.urn
BYTES_CODER_URN: str = common_urns.coders.BYTES.urn
GLOBAL_WINDOW_CODER_URN: str = common_urns.coders.GLOBAL_WINDOW.urn

# The URNs the Python SDK harness can execute inside a fused stage.
SDK_TRANSFORM_URNS: frozenset[str] = frozenset(
    bundle_processor.BeamTransformFactory._known_urns  # noqa: SLF001 - Beam internal
)


def par_do_payloads(
    transforms: Mapping[str, beam_runner_api_pb2.PTransform],
) -> Iterator[tuple[str, beam_runner_api_pb2.PTransform, beam_runner_api_pb2.ParDoPayload]]:
    """(id, transform, ParDoPayload) of each ParDo (SDF parts included) among ``transforms``."""
    for transform_id, transform in transforms.items():
        if transform.spec.urn in PAR_DO_URNS:
            payload = proto_utils.parse_Bytes(
                transform.spec.payload, beam_runner_api_pb2.ParDoPayload
            )
            yield transform_id, transform, payload


def side_input_ids(
    transforms: Mapping[str, beam_runner_api_pb2.PTransform],
) -> list[tuple[str, str]]:
    """(transform id, tag) of each side input read by a ParDo among ``transforms``."""
    return [
        (transform_id, tag)
        for transform_id, _, payload in par_do_payloads(transforms)
        for tag in payload.side_inputs
    ]


def fn_api_runner_supported_requirements() -> tuple[str, ...]:
    """The pipeline requirements Beam's own FnApiRunner declares support for."""
    return tuple(FnApiRunner.supported_requirements())


def embedded_environment_proto() -> beam_runner_api_pb2.Environment:
    """The environment proto for running Python transforms in this process."""
    return environments.EmbeddedPythonEnvironment.default().to_runner_api(None)  # type: ignore[arg-type]


def default_environment() -> environments.Environment:
    """The environment the runner asks Beam to use for Python transforms."""
    return environments.EmbeddedPythonEnvironment.default()


def resolve_any_environments(
    pipeline_proto: beam_runner_api_pb2.Pipeline,
) -> beam_runner_api_pb2.Pipeline:
    """Resolves ``AnyOf`` environments the way FnApiRunner does."""
    for env_id, env in pipeline_proto.components.environments.items():
        pipeline_proto.components.environments[env_id].CopyFrom(
            environments.resolve_anyof_environment(
                env,
                python_urns.EMBEDDED_PYTHON,
                common_urns.environments.EXTERNAL.urn,
                common_urns.environments.DOCKER.urn,
            )
        )
    return pipeline_proto


def prepare_pipeline_proto(
    pipeline_proto: beam_runner_api_pb2.Pipeline,
) -> beam_runner_api_pb2.Pipeline:
    """Validates the graph and merges environments, as FnApiRunner does first."""
    validate_pipeline_graph(pipeline_proto)
    return merge_common_environments(
        resolve_any_environments(merge_superset_dep_environments(pipeline_proto))
    )


_STANDARD_WINDOW_FNS = (
    window.GlobalWindows,
    window.FixedWindows,
    window.SlidingWindows,
    window.Sessions,
)


def windowing_from_proto(
    strategy: beam_runner_api_pb2.WindowingStrategy, context: PipelineContext
) -> Any:
    """Beam's ``Windowing`` of a windowing strategy proto."""
    from apache_beam.transforms import core

    return core.Windowing.from_runner_api(strategy, context)


def is_standard_window_fn(window_fn: Any) -> bool:
    """Global, fixed, sliding or session windows (exactly Beam's classes)."""
    return type(window_fn) in _STANDARD_WINDOW_FNS


# Beam's ``_KeyWithNone`` (every ``CombineGlobally``'s ``KeyWithVoid``): a DoFn registered
# by URN, not pickled.
KEY_WITH_NONE_DOFN_URN: str = python_urns.KEY_WITH_NONE_DOFN


PRECOMBINE_URN: str = common_urns.combine_components.COMBINE_PER_KEY_PRECOMBINE.urn
# A lifted combine's phases after its GroupByKey, by Beam's phase names.
COMBINE_PHASE_URNS: dict[str, str] = {
    common_urns.combine_components.COMBINE_PER_KEY_MERGE_ACCUMULATORS.urn: "merge",
    common_urns.combine_components.COMBINE_PER_KEY_EXTRACT_OUTPUTS.urn: "extract",
}
