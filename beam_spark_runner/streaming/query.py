"""The streaming query's DataFrame: the plan as one chain of Spark steps.

``plan_topology`` turns the fused plan into routed nodes (``topology``); ``build_frame``
chains ``source -> router 0 -> level 1 -> router 1 -> ... -> router L`` and keeps what
reaches the sink (markers only); router 0 runs in each source's own ``mapInArrow``.
``run.streaming`` starts and watches the query.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.pickled_runs import pickles_in_runs
from beam_spark_runner.planning import (
    GROUP_BY_KEY_URN,
    BufferKind,
    Plan,
    PlannedStage,
)
from beam_spark_runner.spark.compat import has_state_processor, named_function
from beam_spark_runner.spark.map_in_arrow import map_in_arrow
from beam_spark_runner.spark.stateful_operator import stateful_operator
from beam_spark_runner.streaming import rows as routed
from beam_spark_runner.streaming.bounded_side_inputs import BroadcastPlan
from beam_spark_runner.streaming.check import is_unbounded_splittable
from beam_spark_runner.streaming.level_chain import chained_frame
from beam_spark_runner.streaming.levels import Level
from beam_spark_runner.streaming.placement import level_slots, placed
from beam_spark_runner.streaming.router import RouterSpec, run_router
from beam_spark_runner.streaming.side_inputs import SideInputSpec, SideInputStageSpec
from beam_spark_runner.streaming.source import source_frame
from beam_spark_runner.streaming.source_plan import SourcePlan
from beam_spark_runner.streaming.spark_sources import (
    spark_stream_roots,
    stream_columns,
    union_spark_streams,
)
from beam_spark_runner.streaming.test_stream import test_stream_steps
from beam_spark_runner.streaming.topology import (
    GROUP,
    SINK,
    STAGE,
    NodeSpec,
    Topology,
    build_topology,
    canonical_order,
)
from beam_spark_runner.translators.base import TranslationContext, spark_function_name
from beam_spark_runner.translators.fused_stage import broadcast_side_inputs, stage_spec
from beam_spark_runner.translators.group_by_key import group_spec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_LOGGER = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
STATE_STORE_PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
_ROOT_KINDS = (BufferKind.IMPULSE, BufferKind.TEST_STREAM, BufferKind.SPARK_STREAM)
SIMPLIFIED_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


def _feeders(plan: Plan, buffer_id: bytes) -> tuple[tuple[str, str], ...]:
    """What a reader of ``buffer_id`` reads from: a root, a GroupByKey or writing stages."""
    buffer = plan.buffers[buffer_id]
    if buffer.kind in _ROOT_KINDS:
        return (("root", buffer_id.decode()),)
    if buffer.urn == GROUP_BY_KEY_URN:
        return ((GROUP, buffer_id.decode()),)
    return tuple((STAGE, writer) for writer, _ in buffer.writers)


def _readers(
    plan: Plan, buffer_id: bytes, broadcast_readers: frozenset[str] = frozenset()
) -> tuple[tuple[str, ...], ...]:
    """Who reads what is written to ``buffer_id``: its GroupByKey, or its reading stages.

    A stage reading it as its n-th side input (from 1) is ``("stage", name, n)``, unless
    the stage gets its side inputs broadcast (``broadcast_readers``).
    """
    buffer = plan.buffers[buffer_id]
    if buffer.urn == GROUP_BY_KEY_URN:
        return ((GROUP, buffer_id.decode()),)
    sides = tuple(
        (STAGE, reader, str(number))
        for reader in buffer.side_readers
        if reader not in broadcast_readers
        for number, side in enumerate(plan.stage(reader).side_inputs, start=1)
        if side.buffer_id == buffer_id
    )
    return (*((STAGE, reader) for reader in buffer.main_readers), *sides)


def side_input_stage_spec(stage: PlannedStage, context: TranslationContext) -> SideInputStageSpec:
    """What a shard of a stage with side inputs needs: coders and window mappings."""
    return SideInputStageSpec(
        stage=stage_spec(stage, context),
        components=context.plan.components.SerializeToString(),
        input_coder_id=stage.input_coder_id,
        side_inputs=side_input_specs(stage, context.plan),
    )


def side_input_specs(stage: PlannedStage, plan: Plan) -> tuple[SideInputSpec, ...]:
    """Each side input ``stage`` reads: its coder and window mapping."""
    payloads = {t: p for t, _, p in bi.par_do_payloads(stage.descriptor.transforms)}
    return tuple(
        SideInputSpec(
            transform_id=side.transform_id,
            tag=side.tag,
            access_pattern_urn=side.access_pattern_urn,
            value_coder_id=plan.safe_coders[plan.data_channel_coders[side.pcollection_id]],
            window_mapping=payloads[side.transform_id]
            .side_inputs[side.tag]
            .window_mapping_fn.SerializeToString(),
        )
        for side in stage.side_inputs
    )


def plan_topology(plan: Plan, shards: int, broadcasts: BroadcastPlan | None = None) -> Topology:
    """The plan's stages and GroupByKeys as routed nodes, in topological order.

    Stages in ``broadcasts.computed_in_batch`` are left out; stages in
    ``broadcasts.readers`` read no side input through the query.
    """
    broadcasts = broadcasts or BroadcastPlan(frozenset(), frozenset())
    batch_only = broadcasts.computed_in_batch
    specs: list[NodeSpec] = []
    groups_added: set[bytes] = set()

    def add_group(buffer_id: bytes) -> None:
        buffer = plan.buffers[buffer_id]
        groups_added.add(buffer_id)
        specs.append(
            NodeSpec(
                name=buffer_id.decode(),
                kind=GROUP,
                stateful=True,
                inputs=tuple((STAGE, writer) for writer, _ in buffer.writers),
                outputs=(tuple((STAGE, reader) for reader in buffer.main_readers),),
            )
        )

    for stage in plan.stages:
        if stage.name in batch_only:
            continue
        input_buffer = plan.buffers[stage.input_buffer_id]
        if input_buffer.urn == GROUP_BY_KEY_URN and stage.input_buffer_id not in groups_added:
            add_group(stage.input_buffer_id)
        streamed_sides = () if stage.name in broadcasts.readers else stage.side_inputs
        specs.append(
            NodeSpec(
                name=stage.name,
                identity=stage_identity(stage),
                kind=STAGE,
                stateful=bool(stage.stateful or streamed_sides or is_unbounded_splittable(stage)),
                inputs=_feeders(plan, stage.input_buffer_id),
                outputs=tuple(
                    _readers(plan, output.buffer_id, broadcasts.readers) for output in stage.outputs
                ),
                side_inputs=tuple(_feeders(plan, side.buffer_id) for side in streamed_sides),
            )
        )
    for buffer_id, buffer in plan.buffers.items():
        if (
            buffer.urn == GROUP_BY_KEY_URN
            and buffer_id not in groups_added
            and not all(writer in batch_only for writer, _ in buffer.writers)
        ):
            add_group(buffer_id)
    return build_topology(canonical_order(specs), shards)


def run_readers(plan: Plan, topology: Topology) -> frozenset[int]:
    """The nodes reading their main elements in pickled runs (``rows.run_outputs``).

    Stages with streamed side inputs, neither stateful nor splittable: their shards
    (``side_inputs.SideInputShard``) keep the runs as they come until they run.
    """
    return frozenset(
        node.index
        for node in topology.nodes
        if node.kind == STAGE
        and node.side_expected
        and not plan.stage(node.name).stateful
        and not is_unbounded_splittable(plan.stage(node.name))
    )


def pickled_outputs(
    plan: Plan, topology: Topology, stages: Collection[int]
) -> dict[int, dict[int, int]]:
    """Per stage of a router (``stages``), the outputs it sends in pickled runs, by parts.

    Those ``rows.run_outputs`` allows whose coder is Beam's windowed-value coder of a
    pickling value coder (``coders.pickled_runs.pickles_in_runs``).
    """
    readers = run_readers(plan, topology)
    coders = bi.PipelineContext(plan.components).coders
    pickled: dict[int, dict[int, int]] = {}
    for index in stages:
        node = topology.nodes[index]
        outputs = plan.stage(node.name).outputs
        runs = {
            output: parts
            for output, parts in routed.run_outputs(topology, node, readers, stages).items()
            if pickles_in_runs(coders[outputs[output].coder_id])
        }
        if runs:
            pickled[index] = runs
    return pickled


def stage_identity(stage: PlannedStage) -> str:
    """A fused stage's transforms, sorted: what it is, the same in every process.

    Its name is not: Beam names a fused stage by the order it fused its parts in, which
    follows protobuf map order, and that varies between processes (seen: a restarted
    ``fileio.WriteToFiles`` pipeline's stage named its parts in another order).
    """
    return "+".join(sorted(t.unique_name for t in stage.descriptor.transforms.values()))


def ensure_state_store(spark: SparkSession) -> None:
    """RocksDB state stores, which ``transformWithState`` needs.

    RocksDB's changelog checkpointing is left at Spark's default (off): each shard rewrites
    its state every micro-batch, so it saved nothing under load (``docs/performance.md``).
    """
    current = spark.conf.get(STATE_STORE_PROVIDER_CONF, None)
    if current != ROCKSDB_PROVIDER:
        _LOGGER.info("Streaming state store: %s (was %s)", ROCKSDB_PROVIDER, current)
        spark.conf.set(STATE_STORE_PROVIDER_CONF, ROCKSDB_PROVIDER)


def one_worker_daemon() -> dict[str, str]:
    """The setting a query starts with so that all its Python workers fork from one daemon.

    Spark keeps a daemon per Python environment, and its ``mapInArrow`` runners set
    ``SPARK_SIMPLIFIED_TRACEBACK`` where its ``transformWithState`` runners do not: with it
    on, a query started two daemons, each importing Beam. Failures still name the stage:
    workers format the user's traceback themselves (``errors.StageExecutionError``).
    """
    return {SIMPLIFIED_TRACEBACK_CONF: "false"}


def _source_plan(plan: Plan, topology: Topology) -> SourcePlan:
    impulse = next(
        (b.decode() for b, buffer in plan.buffers.items() if buffer.kind == BufferKind.IMPULSE),
        None,
    )
    return SourcePlan(
        topology=topology,
        impulse=impulse if impulse in topology.roots else None,
        test_streams=tuple(test_stream_steps(plan)),
        open_roots=frozenset(
            root.producer for root in spark_stream_roots(plan) if root.producer in topology.roots
        ),
    )


def _level(
    context: TranslationContext,
    topology: Topology,
    step: int,
    side_input_state: dict[str, Any],
    broadcast_readers: frozenset[str],
) -> Any:
    """The stateful processor of level ``step``: its nodes' specs in a ``levels.Level``."""
    plan = context.plan
    level = topology.stateful_in(step)
    groups = {
        node.index: group_spec(plan.buffers[node.name.encode()], context)
        for node in level
        if node.kind == GROUP
    }
    level_stages = [plan.stage(node.name) for node in level if node.kind == STAGE]
    stateful = {
        topology.node_of(stage.name).index: stage_spec(
            stage, context, side_input_state.get(stage.name)
        )
        for stage in level_stages
        if stage.stateful
    }
    with_side_inputs = {
        topology.node_of(stage.name).index: side_input_stage_spec(stage, context)
        for stage in level_stages
        if stage.side_inputs and stage.name not in broadcast_readers
    }
    splittable = {
        topology.node_of(stage.name).index: stage_spec(
            stage, context, side_input_state.get(stage.name)
        )
        for stage in level_stages
        if is_unbounded_splittable(stage)
    }
    return Level(
        topology, groups, stateful, splittable, with_side_inputs, context.sinks
    ).processor()


def _router_body(
    context: TranslationContext,
    topology: Topology,
    step: int,
    side_input_state: dict[str, Any],
    reads: dict[str, Any],
) -> Any:
    """Router ``step``'s ``mapInArrow`` function, or None if no stateless stage runs there."""
    plan = context.plan
    stages = {
        node.index: stage_spec(plan.stage(node.name), context, side_input_state.get(node.name))
        for node in topology.stateless_in(step)
    }
    if not stages:
        return None
    names = " + ".join(plan.stage(topology.nodes[i].name).display_name for i in stages)
    body = functools.partial(
        run_router,
        RouterSpec(
            step,
            topology,
            stages,
            # Only the reads this router's stages read (their coders ship per task).
            {p: c for p, c in reads.items() if stages.keys() & set(topology.roots[p])},
            pickled_outputs(plan, topology, stages),
        ),
        sinks=context.sinks,
    )
    return named_function(body, spark_function_name(names))


def build_frame(
    context: TranslationContext,
    topology: Topology,
    broadcast_readers: frozenset[str] = frozenset(),
    partitions: int | None = None,
) -> DataFrame:
    """The query's DataFrame: source, routers and levels, ending in the sink's markers.

    The stages in ``broadcast_readers`` get their (bounded) side inputs computed now, one
    Spark job each, and broadcast. With ``partitions`` (the query's shuffle partitions),
    each level's shards are spread over them (``placement``); without, each shard is its
    own slot, as checkpoints written before placement expect.
    """
    plan = context.plan
    spark = context.spark
    side_input_state = {
        node.name: broadcast_side_inputs(plan.stage(node.name), context, inline=node.stateful)
        for node in topology.nodes
        if node.name in broadcast_readers
    }
    reads = stream_columns(plan, topology)
    # Router 0 runs in each source's own mapInArrow: a task of the union reads one input's
    # partition, so routing each input is routing the union, and a source's rows (a Spark
    # stream's whole batches) do not cross to the JVM and back to another Python worker.
    first = _router_body(context, topology, 0, side_input_state, reads)
    frame = source_frame(spark, _source_plan(plan, topology), first)
    frame = union_spark_streams(frame, spark, plan, topology, first)
    # PySpark 3.5 allows one stateful operator per query: several levels run in one group.
    chain = not has_state_processor() and topology.levels > 1
    chained: list[Any] = []
    chained_routers: list[Any] = []
    for step in range(1, topology.levels + 1):
        processor = _level(context, topology, step, side_input_state, broadcast_readers)
        if chain:
            chained.append(processor)
        else:
            if partitions is not None:
                frame = placed(frame, level_slots(topology, step, partitions))
            frame = stateful_operator(
                frame, [routed.TARGET, routed.SHARD], processor, routed.routed_type()
            )
        body = _router_body(context, topology, step, side_input_state, reads)
        if chain and step < topology.levels:
            chained_routers.append(body)
            continue
        if chain and step == topology.levels:
            frame = chained_frame(frame, chained, chained_routers)
        if body is not None:
            frame = map_in_arrow(frame, body, routed.routed_type())
    return frame.filter(frame[routed.TARGET] == SINK)
