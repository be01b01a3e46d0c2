"""Which CombinePerKeys Spark can aggregate itself, and what they compute."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning.urns import COMBINE_PER_KEY_URN

if TYPE_CHECKING:
    from beam_spark_runner.planning.plan import Plan, PlannedBuffer


@dataclasses.dataclass(frozen=True)
class NativeAggregation:
    """What a native combine computes: a function over the values of one Arrow type.

    ``function`` is ``sum``, ``min``, ``max``, ``count`` or ``mean``; ``value_type`` is
    ``int`` (Beam's ``VarIntCoder``), ``float`` (``FloatCoder``) or ``none`` (``count``
    reads no values, whatever their coder).
    """

    function: str
    value_type: str

    def payload(self) -> bytes:
        """The ``NATIVE_COMBINE_URN`` transform's payload."""
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_payload(cls, payload: bytes) -> NativeAggregation:
        """The aggregation a ``NATIVE_COMBINE_URN`` transform's payload names."""
        return cls(**json.loads(payload))


# Value coders whose values become a typed column, and the column's type.
_TYPED_VALUE_CODERS: dict[str, str] = {
    bi.common_urns.coders.VARINT.urn: "int",
    bi.common_urns.coders.DOUBLE.urn: "float",
}


def native_aggregation(
    transform: bi.beam_runner_api_pb2.PTransform, components: bi.beam_runner_api_pb2.Components
) -> NativeAggregation | None:
    """The aggregation a CombinePerKey can run as in Spark, or None to keep Beam's path.

    It can where its CombineFn is Beam's ``sum``, ``min``, ``max`` (of the builtins),
    ``CountCombineFn`` or ``MeanCombineFn`` (``bi.builtin_aggregation``), its input has
    Beam's default windowing (the global window, the default trigger: one output per key,
    at the end of the window), and its values are coded as integers (``VarIntCoder``) or
    floats (``FloatCoder``), which every value then is; ``count`` takes any values.
    """
    if transform.spec.urn != COMBINE_PER_KEY_URN or len(transform.inputs) != 1:
        return None
    payload = bi.beam_runner_api_pb2.CombinePayload.FromString(transform.spec.payload)
    function = bi.builtin_aggregation(payload.combine_fn)
    if function is None:
        return None
    pcollection = components.pcollections[bi.only_element(list(transform.inputs.values()))]
    strategies = bi.PipelineContext(components).windowing_strategies
    if not strategies[pcollection.windowing_strategy_id].is_default():
        return None
    kv_coder = components.coders[pcollection.coder_id]
    if kv_coder.spec.urn != bi.common_urns.coders.KV.urn:
        return None
    value_coder = components.coders[kv_coder.component_coder_ids[1]]
    if value_coder.spec.urn == bi.common_urns.coders.LENGTH_PREFIX.urn:
        value_coder = components.coders[value_coder.component_coder_ids[0]]
    value_type = _TYPED_VALUE_CODERS.get(value_coder.spec.urn)
    if function == "count":
        return NativeAggregation(function, "none")
    if value_type is None:
        return None
    return NativeAggregation(function, value_type)


def aggregation_of(plan: Plan, node: PlannedBuffer) -> NativeAggregation:
    """What the native combine of this ``nativecombine:`` buffer computes."""
    return NativeAggregation.from_payload(plan.components.transforms[node.name].spec.payload)
