"""What the runner can execute, checked on the pipeline before Spark starts.

Every check raises :class:`UnsupportedFeatureError` naming the transform, its URN, what is
missing and what to do. Nothing unsupported passes through silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning import SPARK_STREAM_URN, Plan

_REQUIREMENTS = bi.common_urns.requirements
SUPPORTED_REQUIREMENTS: frozenset[str] = frozenset(
    [
        _REQUIREMENTS.REQUIRES_STATEFUL_PROCESSING.urn,
        _REQUIREMENTS.REQUIRES_SPLITTABLE_DOFN.urn,
        _REQUIREMENTS.REQUIRES_BUNDLE_FINALIZATION.urn,
    ]
)
# Timer time domains the batch runner fires (as FnApiRunner): event and processing time.
SUPPORTED_TIME_DOMAINS: dict[int, str] = {
    bi.beam_runner_api_pb2.TimeDomain.EVENT_TIME: "EVENT_TIME",
    bi.beam_runner_api_pb2.TimeDomain.PROCESSING_TIME: "PROCESSING_TIME",
}
TEST_STREAM_URN: str = bi.common_urns.primitives.TEST_STREAM.urn
_DATA_PLANE_URNS = frozenset([bi.DATA_INPUT_URN, bi.DATA_OUTPUT_URN])
_PYTHON_ENVIRONMENT_URNS = frozenset(
    [
        bi.python_urns.EMBEDDED_PYTHON,
        bi.python_urns.EMBEDDED_PYTHON_GRPC,
        bi.python_urns.SUBPROCESS_SDK,
        bi.common_urns.environments.DOCKER.urn,
        bi.common_urns.environments.PROCESS.urn,
        bi.common_urns.environments.EXTERNAL.urn,
        bi.common_urns.environments.DEFAULT.urn,
    ]
)

_REQUIREMENT_HINTS: dict[str, str] = {
    _REQUIREMENTS.REQUIRES_TIME_SORTED_INPUT.urn: (
        "Time-sorted input (@DoFn.RequiresTimeSortedInput) is not supported yet; sort "
        "inside the DoFn with state and an event-time timer, or use another runner."
    ),
    _REQUIREMENTS.REQUIRES_STABLE_INPUT.urn: (
        "Stable input (@DoFn.RequiresStableInput) is not supported yet: a retried Spark task "
        "may recompute its input. Put a Reshuffle before the DoFn and drop the annotation, "
        "or use another runner."
    ),
}


def _leaf_transforms(
    proto: bi.beam_runner_api_pb2.Pipeline,
) -> Iterator[tuple[str, bi.beam_runner_api_pb2.PTransform]]:
    for transform_id, transform in proto.components.transforms.items():
        if not transform.subtransforms:
            yield transform_id, transform


def _par_dos(
    proto: bi.beam_runner_api_pb2.Pipeline,
) -> Iterator[tuple[bi.beam_runner_api_pb2.PTransform, bi.beam_runner_api_pb2.ParDoPayload]]:
    leaves = dict(_leaf_transforms(proto))
    for _, transform, payload in bi.par_do_payloads(leaves):
        yield transform, payload


def _transforms_needing(proto: bi.beam_runner_api_pb2.Pipeline, requirement: str) -> list[str]:
    found = []
    for transform, payload in _par_dos(proto):
        if (
            (requirement == _REQUIREMENTS.REQUIRES_TIME_SORTED_INPUT.urn)
            and payload.requires_time_sorted_input
        ) or (
            (requirement == _REQUIREMENTS.REQUIRES_STABLE_INPUT.urn)
            and payload.requires_stable_input
        ):
            found.append(f"'{transform.unique_name}' ({transform.spec.urn})")
    return found


def _check_timers(proto: bi.beam_runner_api_pb2.Pipeline) -> None:
    for transform, payload in _par_dos(proto):
        for family_id, spec in payload.timer_family_specs.items():
            if spec.time_domain not in SUPPORTED_TIME_DOMAINS:
                domain = bi.beam_runner_api_pb2.TimeDomain.Enum.Name(spec.time_domain)
                raise UnsupportedFeatureError(
                    f"Transform '{transform.unique_name}' ({transform.spec.urn}) has timer "
                    f"family '{family_id}' in time domain {domain}; SparkStructuredRunner fires "
                    f"timers in {' and '.join(SUPPORTED_TIME_DOMAINS.values())} only. Use "
                    "TimeDomain.WATERMARK or TimeDomain.REAL_TIME."
                )


def check_requirements(proto: bi.beam_runner_api_pb2.Pipeline) -> None:
    """Checks the pipeline's requirements and timer domains."""
    for requirement in proto.requirements:
        if requirement in SUPPORTED_REQUIREMENTS:
            continue
        culprits = _transforms_needing(proto, requirement)
        detail = f" Transforms needing it: {', '.join(culprits)}." if culprits else ""
        hint = _REQUIREMENT_HINTS.get(
            requirement, "Remove the feature from the pipeline or run it on another runner."
        )
        raise UnsupportedFeatureError(
            f"The pipeline requires {requirement}, which SparkStructuredRunner does not support "
            f"yet (supported: {', '.join(sorted(SUPPORTED_REQUIREMENTS))}).{detail} {hint}"
        )
    _check_timers(proto)


def check_pipeline(proto: bi.beam_runner_api_pb2.Pipeline) -> None:
    """Checks requirements for a batch run, and that nothing in it is unbounded."""
    check_requirements(proto)
    for _, transform in _leaf_transforms(proto):
        if transform.spec.urn == TEST_STREAM_URN:
            raise UnsupportedFeatureError(
                f"Transform '{transform.unique_name}' is a TestStream ({TEST_STREAM_URN}) in a "
                "pipeline run in batch from its proto. SparkStructuredRunner streams a "
                "TestStream, and runs one in batch only from the Python pipeline, where it "
                "checks that a batch run reproduces its script (see "
                "beam_spark_runner.rewrites.batch_test_stream). Run it with Pipeline.run(), "
                "or with run_proto(), which streams it."
            )
        if transform.spec.urn == SPARK_STREAM_URN:
            raise UnsupportedFeatureError(
                f"Transform '{transform.unique_name}' is a ReadFromSparkStream "
                f"({SPARK_STREAM_URN}), which reads a Spark stream and runs only in a "
                "streaming run; a batch run cannot end it. Run the pipeline in streaming (it "
                "streams by itself unless a streaming check refused it: see that reason)."
            )
    unbounded = unbounded_pcollections(proto)
    if unbounded:
        raise UnsupportedFeatureError(
            f"The pipeline has unbounded PCollections ({', '.join(unbounded)}), and a batch "
            "run reads an unbounded source to its end before anything downstream fires. "
            "SparkStructuredRunner streams such a pipeline, and runs it in batch only from "
            "the Python pipeline, where it checks that a batch run gives the streaming result "
            "(see beam_spark_runner.rewrites.streaming_in_batch). Run it with Pipeline.run() "
            "or run_proto()."
        )


def unbounded_pcollections(proto: bi.beam_runner_api_pb2.Pipeline) -> list[str]:
    """Unbounded PCollections, each as 'name' (produced by 'transform' (URN))."""
    found = []
    for pcoll_id, pcoll in proto.components.pcollections.items():
        if pcoll.is_bounded == bi.beam_runner_api_pb2.IsBounded.UNBOUNDED:
            producers = [
                f"'{t.unique_name}' ({t.spec.urn})"
                for _, t in _leaf_transforms(proto)
                if pcoll_id in t.outputs.values()
            ]
            found.append(f"'{pcoll.unique_name}' from {', '.join(producers) or 'unknown'}")
    return found


def unbounded_source(proto: bi.beam_runner_api_pb2.Pipeline) -> str | None:
    """The transform making the first unbounded PCollection in topological order: the source.

    Said as 'name' (URN); None if every PCollection is bounded. Transforms are visited as
    they were applied (each composite's parts in order), which is a topological order.
    """
    transforms = proto.components.transforms
    pcollections = proto.components.pcollections
    pending = list(reversed(proto.root_transform_ids))
    while pending:
        transform = transforms[pending.pop()]
        if transform.subtransforms:
            pending.extend(reversed(transform.subtransforms))
            continue
        if any(
            pcollections[p].is_bounded == bi.beam_runner_api_pb2.IsBounded.UNBOUNDED
            for p in transform.outputs.values()
        ):
            return f"'{transform.unique_name}' ({transform.spec.urn})"
    return None


def check_plan(plan: Plan, translator_for: Callable[[str], object | None]) -> None:
    """Checks that every runner primitive has a translator and every SDK URN runs here."""
    for buffer in plan.buffers.values():
        if translator_for(buffer.urn) is None:
            raise UnsupportedFeatureError(
                f"Transform '{buffer.name}' has URN {buffer.urn}, which SparkStructuredRunner "
                "cannot translate yet. Replace it with supported transforms or use another runner."
            )
    check_stages(plan)


def check_stages(plan: Plan) -> None:
    """Checks that every transform of every fused stage runs in Beam's Python SDK here."""
    environments = plan.components.environments
    for stage in plan.stages:
        for transform in stage.descriptor.transforms.values():
            urn = transform.spec.urn
            if urn in _DATA_PLANE_URNS:
                continue
            env = environments.get(transform.environment_id) if transform.environment_id else None
            if env is not None and env.urn not in _PYTHON_ENVIRONMENT_URNS:
                raise UnsupportedFeatureError(
                    f"Transform '{transform.unique_name}' ({urn}) runs in environment "
                    f"{env.urn}, but SparkStructuredRunner executes Python transforms in "
                    "process only; cross-language transforms are not supported yet."
                )
            if urn not in bi.SDK_TRANSFORM_URNS:
                raise UnsupportedFeatureError(
                    f"Transform '{transform.unique_name}' has URN {urn}, which neither "
                    "SparkStructuredRunner nor Beam's Python SDK harness can execute. If it is "
                    "a cross-language or runner-specific transform, it is not supported yet; "
                    "replace it with a Python transform or use another runner."
                )
