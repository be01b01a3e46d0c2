"""Pipeline proto -> Beam's fusion phases -> a plan of Spark stages and buffers.

Read in this order: ``urns`` (the URNs and buffer kinds), ``phases`` (Beam's graph phases
with ours, as one list), ``assembly`` (fused stages wired to buffers: ``build_plan``),
``physical`` (how each stage runs on Spark), ``plan`` (the model translators read).
``capabilities`` checks a pipeline before any of it. This module only re-exports.
"""

from __future__ import annotations

from beam_spark_runner.planning.aggregation import (
    NativeAggregation,
    aggregation_of,
    native_aggregation,
)
from beam_spark_runner.planning.assembly import build_plan, value_only_group_coders
from beam_spark_runner.planning.phases import create_stages, phases
from beam_spark_runner.planning.plan import (
    PhysicalPlan,
    Plan,
    PlannedBuffer,
    PlannedStage,
    SideInput,
    StageInput,
    StageOutput,
    StageStrategy,
)
from beam_spark_runner.planning.text_reads import native_text_reads
from beam_spark_runner.planning.urns import (
    COMBINE_PER_KEY_URN,
    CREATE_BUFFER_KIND,
    CREATE_URN,
    EXECUTABLE_STAGE_URN,
    FLATTEN_URN,
    GROUP_BY_KEY_URN,
    IMPULSE_URN,
    NATIVE_COMBINE_BUFFER_KIND,
    NATIVE_COMBINE_URN,
    RESHUFFLE_BUFFER_KIND,
    RESHUFFLE_URN,
    RUNNER_PRIMITIVE_URNS,
    SPARK_STREAM_BUFFER_KIND,
    SPARK_STREAM_URN,
    TEST_STREAM_BUFFER_KIND,
    TEST_STREAM_URN,
    TEXT_READ_BUFFER_KIND,
    TEXT_READ_URN,
    BufferKind,
    decode_create_payload,
    encode_create_payload,
)

__all__ = [
    "COMBINE_PER_KEY_URN",
    "CREATE_BUFFER_KIND",
    "CREATE_URN",
    "EXECUTABLE_STAGE_URN",
    "FLATTEN_URN",
    "GROUP_BY_KEY_URN",
    "IMPULSE_URN",
    "NATIVE_COMBINE_BUFFER_KIND",
    "NATIVE_COMBINE_URN",
    "RESHUFFLE_BUFFER_KIND",
    "RESHUFFLE_URN",
    "RUNNER_PRIMITIVE_URNS",
    "SPARK_STREAM_BUFFER_KIND",
    "SPARK_STREAM_URN",
    "TEST_STREAM_BUFFER_KIND",
    "TEST_STREAM_URN",
    "TEXT_READ_BUFFER_KIND",
    "TEXT_READ_URN",
    "BufferKind",
    "NativeAggregation",
    "PhysicalPlan",
    "Plan",
    "PlannedBuffer",
    "PlannedStage",
    "SideInput",
    "StageInput",
    "StageOutput",
    "StageStrategy",
    "aggregation_of",
    "build_plan",
    "create_stages",
    "decode_create_payload",
    "encode_create_payload",
    "native_aggregation",
    "native_text_reads",
    "phases",
    "value_only_group_coders",
]
