"""An in-process data channel between Arrow batches and Beam's bundle processor.

Beam's bundle processor reads its input from a data channel and writes each output
PCollection to an output stream, calling ``maybe_flush()`` after every element. The output
stream here records the stream size at each of those calls: the element boundaries, for
free. With them a stage's output becomes an Arrow column of one element per cell without
decoding anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from beam_spark_runner import beam_internals as bi


class ElementBoundaryStream(bi.ClosableOutputStream):
    """An output stream that remembers where each element ends."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[int] = []

    def maybe_flush(self) -> None:
        """Called by Beam's DataOutputOperation after each element."""
        self.ends.append(self.size())

    def close(self) -> None:
        """Nothing to flush: the runner reads the stream after the bundle."""


class _TimerStream(bi.ClosableOutputStream):
    """Collects the timers one DoFn's timer family sets (or clears) during a bundle."""

    def close(self) -> None:
        """Nothing to flush."""


class _LazyData:
    """A bundle input whose chunks are produced only as the bundle reads them."""

    def __init__(self, transform_id: str, chunks: Iterable[bytes]) -> None:
        self.transform_id = transform_id
        self.chunks = chunks


class ArrowDataChannel(bi.DataChannel):
    """Feeds one bundle's input and collects its outputs, per instruction id."""

    def __init__(self) -> None:
        self._inputs: dict[str, list[Any]] = {}
        self._outputs: dict[str, dict[str, ElementBoundaryStream]] = {}
        self._timers: dict[str, dict[tuple[str, str], _TimerStream]] = {}

    def set_input(
        self, instruction_id: str, transform_id: str, data: bytes | Iterable[bytes]
    ) -> None:
        """Queues ``data`` (concatenated encoded elements) for the bundle's input.

        ``data`` may also be an iterable of such chunks, read only when the bundle
        processor asks for its input (e.g. the lines of a text file, a block at a time).
        """
        if not isinstance(data, bytes):
            self._inputs.setdefault(instruction_id, []).append(_LazyData(transform_id, data))
            return
        self._inputs.setdefault(instruction_id, []).append(
            bi.beam_fn_api_pb2.Elements.Data(
                instruction_id=instruction_id, transform_id=transform_id, data=data
            )
        )

    def set_timers(
        self, instruction_id: str, transform_id: str, timer_family_id: str, timers: bytes
    ) -> None:
        """Queues encoded timers to fire in the bundle ``instruction_id``."""
        self._inputs.setdefault(instruction_id, []).append(
            bi.beam_fn_api_pb2.Elements.Timers(
                instruction_id=instruction_id,
                transform_id=transform_id,
                timer_family_id=timer_family_id,
                timers=timers,
            )
        )

    def input_elements(
        self,
        instruction_id: str,
        expected_inputs: Any,
        abort_callback: Any = None,
    ) -> Iterator[Any]:
        """Yields the queued data and timers of ``instruction_id`` to the bundle processor."""
        for item in self._inputs.pop(instruction_id, []):
            if isinstance(item, _LazyData):
                for chunk in item.chunks:
                    if chunk:
                        yield bi.beam_fn_api_pb2.Elements.Data(
                            instruction_id=instruction_id,
                            transform_id=item.transform_id,
                            data=chunk,
                        )
            else:
                yield item

    def output_stream(self, instruction_id: str, transform_id: str) -> ElementBoundaryStream:
        """A fresh boundary-recording stream for one output of the bundle."""
        stream = ElementBoundaryStream()
        self._outputs.setdefault(instruction_id, {})[transform_id] = stream
        return stream

    def output_timer_stream(
        self, instruction_id: str, transform_id: str, timer_family_id: str
    ) -> _TimerStream:
        """A stream for timers set during the bundle."""
        stream = _TimerStream()
        self._timers.setdefault(instruction_id, {})[(transform_id, timer_family_id)] = stream
        return stream

    def take_outputs(self, instruction_id: str) -> dict[str, ElementBoundaryStream]:
        """Removes and returns the output streams of a finished bundle."""
        return self._outputs.pop(instruction_id, {})

    def take_timers(self, instruction_id: str) -> dict[tuple[str, str], bytes]:
        """Removes and returns the timers a finished bundle set, per (transform, family)."""
        streams = self._timers.pop(instruction_id, {})
        return {family: data for family, stream in streams.items() if (data := stream.get())}

    def discard(self, instruction_id: str) -> None:
        """Forgets everything about a failed bundle."""
        self._inputs.pop(instruction_id, None)
        self._outputs.pop(instruction_id, None)
        self._timers.pop(instruction_id, None)

    def close(self) -> None:
        """Nothing to release."""


class ArrowDataChannelFactory(bi.DataChannelFactory):
    """Hands the bundle processor the one in-process channel, whatever port it names."""

    def __init__(self, channel: ArrowDataChannel) -> None:
        self._channel = channel

    def create_data_channel(self, remote_grpc_port: Any, data_stream_id: Any = None) -> Any:
        """The in-process channel."""
        return self._channel

    def create_data_channel_from_url(self, url: Any, data_stream_id: Any = None) -> Any:
        """The in-process channel."""
        return self._channel

    def close(self) -> None:
        """Nothing to release."""
