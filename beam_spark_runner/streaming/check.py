"""What a streaming run supports, checked before Spark starts.

Each check raises :class:`UnsupportedFeatureError` naming the transform, its URN, what is
missing and what to do. The runner then runs the pipeline in batch only where a batch run
is proven to give the streaming result (``rewrites.streaming_in_batch``), and refuses it
otherwise.
"""

from __future__ import annotations

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning import SPARK_STREAM_URN, TEST_STREAM_URN, Plan, PlannedStage
from beam_spark_runner.spark.compat import (
    ONE_LEVEL_STREAMING_SPARK,
    STREAMING_SPARK,
    require_spark,
    require_state_protocol,
)
from beam_spark_runner.streaming.topology import Topology

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
    require_spark(feature, ONE_LEVEL_STREAMING_SPARK)
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


def check_streaming_plan(plan: Plan) -> None:
    """Refuses stages a streaming run cannot execute yet (on the fused plan).

    An unbounded splittable DoFn can read side inputs that the runner computes before the
    query (bounded ones, see ``bounded_side_inputs``), not streamed ones. (A stateless or
    stateful stage reading streamed side inputs streams: ``side_inputs``,
    ``stateful_side_inputs``; planning keeps such a reader out of a splittable DoFn's stage.)
    """
    from beam_spark_runner.streaming.bounded_side_inputs import plan_broadcasts

    broadcasts = plan_broadcasts(plan)
    broadcast_readers = broadcasts.readers
    for stage in plan.stages:
        if (
            stage.side_inputs
            and is_unbounded_splittable(stage)
            and stage.name not in broadcast_readers
        ):
            side = stage.side_inputs[0]
            raise UnsupportedFeatureError(
                f"Stage '{stage.display_name}' runs an unbounded splittable DoFn "
                f"and reads side input '{side.tag}' of '{side.transform_id}' "
                f"({side.access_pattern_urn}), which is unbounded or computed by stages the "
                "stream also needs; SparkStructuredRunner's streaming runs give unbounded "
                "splittable DoFns bounded side inputs computed before the query only yet. "
                "Make the side input bounded (a Create or bounded read used only as that "
                "side input), or read it in a DoFn after the splittable one."
            )


def check_one_level(plan: Plan, topology: Topology) -> None:
    """Refuses, on PySpark 3.5, a pipeline whose stateful nodes take more than one level.

    PySpark 3.5's one stateful operator, ``applyInPandasWithState``, is allowed once per
    query, and a node reading another's output runs a level after it.
    """
    if topology.levels <= 1:
        return
    import pyspark

    needed = ".".join(str(part) for part in STREAMING_SPARK)
    steps = "; ".join(
        f"level {level}: "
        + ", ".join(_node_name(plan, node.name) for node in topology.stateful_in(level))
        for level in range(1, topology.levels + 1)
    )
    raise UnsupportedFeatureError(
        f"This streaming pipeline needs {topology.levels} stateful steps one after the other "
        f"({steps}), but PySpark {pyspark.__version__} allows one stateful operator "
        "(applyInPandasWithState) per streaming query (Spark 3.5 refuses a second at "
        "analysis), so SparkStructuredRunner streams pipelines of one stateful level there. "
        f"Install pyspark>={needed} (and run on a Spark {needed}+ cluster), which streams "
        "this pipeline, or keep one GroupByKey, stateful DoFn, unbounded splittable DoFn or "
        "stage with streamed side inputs on any path from a source to a sink."
    )


def _node_name(plan: Plan, name: str) -> str:
    """A node as the user named it: a stage's transforms, or a GroupByKey's transform."""
    if name in {stage.name for stage in plan.stages}:
        return f"'{plan.stage(name).display_name}'"
    buffer_name = plan.buffers[name.encode()].name
    transform = plan.components.transforms.get(buffer_name)
    return f"'{transform.unique_name if transform is not None else buffer_name}'"
