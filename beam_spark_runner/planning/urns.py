"""The URNs the runner plans with, and the kinds of buffers between its stages.

Buffers are named by id, ``<kind>:<name>`` (Beam's ``create_buffer_id``): ``impulse`` (the
single element that starts a root stage); ``group:<transform id>`` (a GroupByKey: writers'
elements shuffled by key); ``reshuffle:<transform id>`` (``phases.expand_reshuffle``:
repartitioned); ``materialize:<name>`` (a plain PCollection or a Flatten: the writers'
union); ``textread:<transform id>`` (a plain ``ReadFromText``'s lines, ``text_reads``);
``create:<transform id>`` (a replaced ``beam.Create``'s encoded values,
``rewrites.native_create``); ``nativecombine:<transform id>`` (a CombinePerKey as a Spark
aggregation, ``phases.native_combines``); ``teststream:<pcollection>`` and
``sparkstream:<pcollection>`` (a streaming run's TestStream or Spark source output).
"""

from __future__ import annotations

from beam_spark_runner import beam_internals as bi

RESHUFFLE_URN: str = bi.common_urns.composites.RESHUFFLE.urn
GROUP_BY_KEY_URN: str = bi.common_urns.primitives.GROUP_BY_KEY.urn
FLATTEN_URN: str = bi.common_urns.primitives.FLATTEN.urn
IMPULSE_URN: str = bi.common_urns.primitives.IMPULSE.urn
EXECUTABLE_STAGE_URN: str = bi.common_urns.executable_stage
COMBINE_PER_KEY_URN: str = bi.common_urns.composites.COMBINE_PER_KEY.urn

# Transforms the runner executes itself; everything else runs in the bundle processor.
RUNNER_PRIMITIVE_URNS: frozenset[str] = frozenset([FLATTEN_URN, GROUP_BY_KEY_URN, RESHUFFLE_URN])

# A plain ReadFromText the runner reads itself; its payload is the JSON list of the
# matched files' [path, size].
TEXT_READ_URN = "beam:runner:spark:text_read:v1"
# A beam.Create's values, held by the runner; its payload is the encoded values, as a
# Beam iterable of bytes (encode_create_payload).
CREATE_URN = "beam:runner:spark:create:v1"
# A TestStream in a streaming run: each of its outputs is a buffer the query's source fills.
TEST_STREAM_URN: str = bi.common_urns.primitives.TEST_STREAM.urn
# A Spark streaming source (``beam_spark_runner.io``); its payload is a JSON SparkStreamSpec.
SPARK_STREAM_URN = "beam:runner:spark:read_spark_stream:v1"
# A CombinePerKey the runner runs as a Spark aggregation; its payload is a JSON
# NativeAggregation.
NATIVE_COMBINE_URN = "beam:runner:spark:native_combine:v1"

# Streaming sources the query's own source fills (known runner URNs in a streaming run).
STREAMING_SOURCE_URNS: frozenset[str] = frozenset([TEST_STREAM_URN, SPARK_STREAM_URN])


class BufferKind:
    """The kinds of buffer ids: the prefix before ``:`` (plain strings, as Beam's are)."""

    IMPULSE = "impulse"
    GROUP = "group"
    MATERIALIZE = "materialize"
    RESHUFFLE = "reshuffle"
    TEXT_READ = "textread"
    CREATE = "create"
    NATIVE_COMBINE = "nativecombine"
    TEST_STREAM = "teststream"
    SPARK_STREAM = "sparkstream"


# The names callers used before BufferKind.
RESHUFFLE_BUFFER_KIND = BufferKind.RESHUFFLE
TEXT_READ_BUFFER_KIND = BufferKind.TEXT_READ
CREATE_BUFFER_KIND = BufferKind.CREATE
TEST_STREAM_BUFFER_KIND = BufferKind.TEST_STREAM
SPARK_STREAM_BUFFER_KIND = BufferKind.SPARK_STREAM
NATIVE_COMBINE_BUFFER_KIND = BufferKind.NATIVE_COMBINE

# Runner transforms without inputs whose output a stage reads as its data input.
RUNNER_SOURCE_BUFFER_KINDS: dict[str, str] = {
    TEXT_READ_URN: BufferKind.TEXT_READ,
    CREATE_URN: BufferKind.CREATE,
    TEST_STREAM_URN: BufferKind.TEST_STREAM,
    SPARK_STREAM_URN: BufferKind.SPARK_STREAM,
}

# The runner primitive filling each buffer kind other than a group's (a GroupByKey's own URN).
BUFFER_KIND_URNS: dict[str, str] = {
    BufferKind.IMPULSE: IMPULSE_URN,
    BufferKind.NATIVE_COMBINE: NATIVE_COMBINE_URN,
    BufferKind.RESHUFFLE: RESHUFFLE_URN,
    BufferKind.MATERIALIZE: FLATTEN_URN,
    **{kind: urn for urn, kind in RUNNER_SOURCE_BUFFER_KINDS.items()},
}


def _create_payload_coder() -> object:
    from apache_beam.coders import coders

    return coders.IterableCoder(coders.BytesCoder())


def encode_create_payload(encoded_values: list[bytes]) -> bytes:
    """The payload of a ``CREATE_URN`` transform holding these encoded values."""
    return _create_payload_coder().encode(encoded_values)  # type: ignore[attr-defined,no-any-return]


def decode_create_payload(payload: bytes) -> list[bytes]:
    """The encoded values of a ``CREATE_URN`` transform's payload."""
    return list(_create_payload_coder().decode(payload))  # type: ignore[attr-defined]
