"""Side inputs: materialised on the driver, served to bundle processors from state.

The driver collects a side input's elements once, groups them by window (and key) with
Beam's ``WindowGroupingBuffer`` and encodes them under the state keys the SDK requests. The
entries are broadcast; each Spark Python worker loads them into the in-memory
``StateServicer`` of the stages that read them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import StageExecutionError


class _RecordingStateServicer:
    """Duck-typed stand-in for a ``StateServicer`` that only records appends."""

    def __init__(self) -> None:
        self.entries: list[tuple[bytes, bytes]] = []

    def append_raw(self, state_key: Any, data: bytes) -> None:
        self.entries.append((state_key.SerializeToString(), data))


def side_input_state_entries(
    consuming_transform_id: str,
    tag: str,
    access_pattern_urn: str,
    elements: Iterable[bytes],
    value_coder: Any,
) -> list[tuple[bytes, bytes]]:
    """State entries that serve one side input to the bundle processor.

    Uses Beam's ``WindowGroupingBuffer`` to group the side input's elements by window (and
    key, for multimap access) exactly as FnApiRunner does, and encodes them under the state
    keys the SDK asks for.
    """
    access_pattern = bi.beam_runner_api_pb2.FunctionSpec(urn=access_pattern_urn)
    grouped = bi.WindowGroupingBuffer(access_pattern, value_coder)
    for data in elements:
        grouped.append(data)
    recorder = _RecordingStateServicer()
    state_key = bi.beam_fn_api_pb2.StateKey
    if access_pattern_urn == bi.common_urns.side_inputs.ITERABLE.urn:
        for _, window, data, _ in grouped.encoded_items():
            recorder.append_raw(
                state_key(
                    iterable_side_input=state_key.IterableSideInput(
                        transform_id=consuming_transform_id, side_input_id=tag, window=window
                    )
                ),
                data,
            )
    elif access_pattern_urn == bi.common_urns.side_inputs.MULTIMAP.urn:
        for key, window, data, count in grouped.encoded_items():
            recorder.append_raw(
                state_key(
                    multimap_side_input=state_key.MultimapSideInput(
                        transform_id=consuming_transform_id,
                        side_input_id=tag,
                        window=window,
                        key=key,
                    )
                ),
                data,
            )
            recorder.append_raw(
                state_key(
                    multimap_keys_side_input=state_key.MultimapKeysSideInput(
                        transform_id=consuming_transform_id, side_input_id=tag, window=window
                    )
                ),
                key,
            )
            recorder.append_raw(
                state_key(
                    multimap_keys_values_side_input=state_key.MultimapKeysValuesSideInput(
                        transform_id=consuming_transform_id, side_input_id=tag, window=window
                    )
                ),
                key + count.to_bytes(4, "big", signed=True) + data,
            )
    else:
        raise StageExecutionError(
            consuming_transform_id,
            f"Expected a side input access pattern of {bi.common_urns.side_inputs.ITERABLE.urn}"
            f" or {bi.common_urns.side_inputs.MULTIMAP.urn}, found {access_pattern_urn}.",
        )
    return recorder.entries
