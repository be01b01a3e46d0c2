"""What a streaming run supports, checked before Spark starts.

Each check raises :class:`UnsupportedFeatureError` naming the transform, its URN, what is
missing and what to do. The runner then runs the pipeline in batch only where a batch run
is proven to give the streaming result (``rewrites.streaming_in_batch``), and refuses it
otherwise.
"""

from __future__ import annotations

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning import SPARK_STREAM_URN, TEST_STREAM_URN, PlannedStage
from beam_spark_runner.spark.compat import (
    OLDEST_STREAMING_SPARK,
    require_spark,
    require_state_protocol,
)

_UNBOUNDED = bi.beam_runner_api_pb2.IsBounded.UNBOUNDED
SDF_PROCESS_URN: str = bi.common_urns.sdf_components.PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS.urn


def is_unbounded_splittable(stage: PlannedStage) -> bool:
    """Whether the stage processes an unbounded splittable DoFn's restrictions."""
    descriptor = stage.descriptor
    return any(
        transform.spec.urn == SDF_PROCESS_URN
        and any(
            descriptor.pcollections[p].is_bounded == _UNBOUNDED for p in transform.outputs.values()
        )
        for transform in descriptor.transforms.values()
    )


def check_streaming_pipeline(proto: bi.beam_runner_api_pb2.Pipeline) -> None:
    """Refuses sources a streaming run cannot read yet (on the unfused pipeline)."""
    feature = "Streaming (Structured Streaming with a stateful operator)"
    require_spark(feature, OLDEST_STREAMING_SPARK)
    require_state_protocol(feature)
    components = proto.components
    for transform in components.transforms.values():
        if transform.subtransforms:
            continue
        if transform.spec.urn == TEST_STREAM_URN:
            continue
        outputs = [components.pcollections[p] for p in transform.outputs.values()]
        inputs = [components.pcollections[p] for p in transform.inputs.values()]
        if (
            transform.spec.urn not in (*bi.PAR_DO_URNS, SPARK_STREAM_URN)
            and any(p.is_bounded == _UNBOUNDED for p in outputs)
            and not any(p.is_bounded == _UNBOUNDED for p in inputs)
        ):
            raise UnsupportedFeatureError(
                f"Transform '{transform.unique_name}' ({transform.spec.urn}) produces an "
                "unbounded PCollection of its own and is not a splittable DoFn; "
                "SparkStructuredRunner's streaming runs read TestStreams, splittable DoFns, "
                "Spark streams (beam_spark_runner.io.ReadFromSparkStream) and bounded "
                "sources only yet."
            )
