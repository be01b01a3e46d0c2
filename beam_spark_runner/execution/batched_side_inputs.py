"""The batched path's side inputs: Beam's maps, each value kept per main window for a batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from beam_spark_runner import beam_internals as bi


class _PerWindowSideInput:
    """A side-input map that looks a main window up once per batch, not per element.

    Beam's ``StateBackedSideInputMap`` maps the main window to the side-input window and
    looks that up for every element; this keeps the value per main window
    until :meth:`reset` (the end of a batch: a streaming shard's side inputs change
    between batches).
    """

    def __init__(self, side_input_map: Any) -> None:
        self._map = side_input_map
        self._values: dict[Any, Any] = {}

    def __getitem__(self, window: Any) -> Any:
        key = bi.window_key(window)
        try:
            return self._values[key]
        except KeyError:
            value = self._values[key] = self._map[window]
            return value

    def is_globally_windowed(self) -> bool:
        return bool(self._map.is_globally_windowed())

    def reset(self) -> None:
        self._values.clear()
        self._map.reset()


def side_input_maps(
    payload: bi.beam_runner_api_pb2.ParDoPayload,
    transform_id: str,
    descriptor: Any,
    context: bi.PipelineContext,
) -> Callable[[Any], list[Any]]:
    """A ParDo's side-input maps, given a state handler, as Beam's bundle processor makes them.

    In Beam's order (by side-input index), each cached per main window.
    """
    make_maps = bi.state_backed_side_input_maps(payload, transform_id, descriptor, context)

    def make(state_handler: Any) -> list[Any]:
        return [_PerWindowSideInput(side_map) for side_map in make_maps(state_handler)]

    return make


def side_input_arguments(
    side_inputs: list[Any], window: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A step's extra arguments with its side inputs' values for ``window`` in place.

    What Beam's ``PerWindowInvoker`` passes for an element in ``window``: each map read for
    the window, in side-input order, into the placeholders of the positional arguments,
    then of the keyword arguments by name (``internal.util.insert_values_in_args``).
    Globally windowed side inputs are read for the global window whatever ``window`` is.
    """
    values = [side_input[window] for side_input in side_inputs]
    return bi.insert_side_input_values(args, kwargs, values)
