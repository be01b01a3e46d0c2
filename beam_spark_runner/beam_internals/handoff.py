"""The hand-off coder: batched steps' outputs go to the bundle processor unencoded."""

from __future__ import annotations

import collections
import threading
from typing import Any

from apache_beam import coders
from apache_beam.coders import coder_impl
from apache_beam.portability.api import (
    beam_fn_api_pb2,
    beam_runner_api_pb2,
)
from apache_beam.runners.pipeline_context import PipelineContext


class _HandoffValues(threading.local):
    """Windowed values a batch hands to the bundle processor, per hand-off token.

    Per thread: the bundle processor decodes its input in the thread that asked for the
    bundle (``SdkWorker.do_instruction``), right after the batch queued it.
    """

    def __init__(self) -> None:
        self.queues: dict[str, collections.deque[Any]] = {}


_HANDOFF_VALUES = _HandoffValues()


class _HandoffCoderImpl(coder_impl.StreamCoderImpl):  # type: ignore[misc]
    """Decodes each one-byte element as the next value handed off under its token."""

    def __init__(self, token: str, windowed_impl: Any) -> None:
        self._token = token
        self._windowed = windowed_impl

    def encode_to_stream(self, value: Any, stream: Any, nested: bool) -> None:
        self._windowed.encode_to_stream(value, stream, nested)

    def decode_from_stream(self, stream: Any, nested: bool) -> Any:
        stream.read_byte()
        return _HANDOFF_VALUES.queues[self._token].popleft()

    def estimate_size(self, value: Any, nested: bool = False) -> int:
        return self._windowed.estimate_size(value, nested)  # type: ignore[no-any-return]

    def get_estimated_size_and_observables(self, value: Any, nested: bool = False) -> Any:
        return self._windowed.get_estimated_size_and_observables(value, nested)


class HandoffCoder(coders.Coder):  # type: ignore[misc]
    """The coder of a stage's hand-off from its batched steps to the bundle processor.

    The batched steps' output is not encoded: each element is one byte on the data plane,
    and the bundle processor's data input reads the windowed value itself (see
    :func:`hand_off`). So nothing is lost that an encoding would lose (timestamps finer
    than Beam's millisecond encoding) and nothing is encoded twice. Sizes are estimated
    with the PCollection's windowed coder.
    """

    def __init__(self, token: str, windowed_coder: Any) -> None:
        self._token = token
        self._windowed_coder = windowed_coder

    def _create_impl(self) -> Any:
        return _HandoffCoderImpl(self._token, self._windowed_coder.get_impl())

    def is_deterministic(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is HandoffCoder
            and other._token == self._token
            and other._windowed_coder == self._windowed_coder
        )

    def __hash__(self) -> int:
        return hash((type(self), self._token))


def handoff_coder_proto(
    token: str, descriptor: beam_fn_api_pb2.ProcessBundleDescriptor, windowed_coder_id: str
) -> beam_runner_api_pb2.Coder:
    """The proto of a :class:`HandoffCoder` for a windowed coder of ``descriptor``."""
    windowed = PipelineContext(descriptor).coders[windowed_coder_id]
    return HandoffCoder(token, windowed).to_runner_api(PipelineContext())  # type: ignore[no-any-return]


def hand_off(token: str, values: list[Any]) -> bytes:
    """Queues ``values`` for the hand-off coder of ``token``; the bytes to feed its input."""
    _HANDOFF_VALUES.queues[token] = collections.deque(values)
    return b"\x00" * len(values)
