"""What the runner refuses before Spark starts, and what it now accepts (no Spark needed)."""

import typing

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.planning.capabilities import check_pipeline

REQUIREMENTS = bi.common_urns.requirements


class Stateful(beam.DoFn):
    BAG = userstate.BagStateSpec("bag", VarIntCoder())
    TIMER = userstate.TimerSpec("timer", userstate.TimeDomain.WATERMARK)

    def process(
        self,
        kv: typing.Any,
        bag: typing.Any = beam.DoFn.StateParam(BAG),
        timer: typing.Any = beam.DoFn.TimerParam(TIMER),
    ) -> None:
        bag.add(kv[1])

    @userstate.on_timer(TIMER)
    def fired(self) -> None:
        pass


def stateful_proto() -> tuple[bi.beam_runner_api_pb2.Pipeline, str]:
    p = beam.Pipeline()
    _ = p | beam.Create([("k", 1)]) | "MyStateful" >> beam.ParDo(Stateful())
    proto = p.to_runner_api()
    (transform_id,) = [
        tid for tid, t in proto.components.transforms.items() if t.unique_name == "MyStateful"
    ]
    return proto, transform_id


def edit_payload(
    proto: bi.beam_runner_api_pb2.Pipeline,
    transform_id: str,
    edit: typing.Callable[[bi.beam_runner_api_pb2.ParDoPayload], None],
) -> None:
    transform = proto.components.transforms[transform_id]
    payload = bi.beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    edit(payload)
    transform.spec.payload = payload.SerializeToString()


def test_stateful_pardo_is_accepted() -> None:
    proto, _ = stateful_proto()
    assert REQUIREMENTS.REQUIRES_STATEFUL_PROCESSING.urn in proto.requirements
    check_pipeline(proto)  # raises if state and timers were refused


def test_time_sorted_input_is_refused_naming_transform_and_urn() -> None:
    proto, transform_id = stateful_proto()
    edit_payload(proto, transform_id, lambda p: setattr(p, "requires_time_sorted_input", True))
    proto.requirements.append(REQUIREMENTS.REQUIRES_TIME_SORTED_INPUT.urn)
    with pytest.raises(UnsupportedFeatureError) as caught:
        check_pipeline(proto)
    message = str(caught.value)
    assert REQUIREMENTS.REQUIRES_TIME_SORTED_INPUT.urn in message
    assert "'MyStateful' (beam:transform:pardo:v1)" in message
    assert "RequiresTimeSortedInput" in message


def test_stable_input_is_refused_with_a_way_out() -> None:
    proto, transform_id = stateful_proto()
    edit_payload(proto, transform_id, lambda p: setattr(p, "requires_stable_input", True))
    proto.requirements.append(REQUIREMENTS.REQUIRES_STABLE_INPUT.urn)
    with pytest.raises(UnsupportedFeatureError, match="Reshuffle") as caught:
        check_pipeline(proto)
    assert "'MyStateful'" in str(caught.value)


def test_timer_in_an_unsupported_time_domain_is_refused() -> None:
    proto, transform_id = stateful_proto()

    def unspecified(payload: bi.beam_runner_api_pb2.ParDoPayload) -> None:
        payload.timer_family_specs[
            "timer"
        ].time_domain = bi.beam_runner_api_pb2.TimeDomain.UNSPECIFIED

    edit_payload(proto, transform_id, unspecified)
    with pytest.raises(UnsupportedFeatureError) as caught:
        check_pipeline(proto)
    message = str(caught.value)
    assert "'MyStateful'" in message
    assert "UNSPECIFIED" in message
    assert "timer family 'timer'" in message


def test_test_stream_left_in_a_proto_is_refused() -> None:
    # run_pipeline replaces TestStreams a batch run reproduces before it builds the proto;
    # a proto that still holds one (another caller of run_proto) is refused.
    from apache_beam.testing.test_stream import TestStream as ScriptedStream

    p = beam.Pipeline()
    _ = p | "Script" >> ScriptedStream().add_elements([1]) | beam.Map(str)
    with pytest.raises(UnsupportedFeatureError, match=r"'Script' is a TestStream \(beam:tra"):
        check_pipeline(p.to_runner_api())
