"""Batched steps that call their function directly, as Beam's invokers would call it.

A Map, FlatMap or Filter's callable, or a DoFn's ``process``, called per element of a chunk
without Beam's ``DoFnRunner`` in between; with the element's timestamp or window
(:class:`ParamsStep`), or with side inputs bound once per batch (:class:`GlobalSidesStep`) or
per window and batch (:class:`WindowSidesStep`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from apache_beam.transforms.window import GlobalWindow

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import batched_dofns, batched_policy, batched_side_inputs
from beam_spark_runner.execution.batched_calls import (
    CHUNK,
    ArgumentOrders,
    params_of,
    per_window,
    with_arguments,
)
from beam_spark_runner.execution.batched_plan import StepSpec
from beam_spark_runner.execution.batched_step_kinds import Step

_WITH_VALUE = bi.WindowedValue.with_value
_TIMESTAMPED = bi.TimestampedValue
# What ``next`` gives an iterator that has ended.
_END = object()
# What ``_kind_of`` finds a list of outputs to be.
_PLAIN = "plain"  # none needs Beam's output handler
_TIMESTAMPED_ONLY = "timestamped"  # each exactly a ``TimestampedValue``
_SPECIAL = "special"  # others for Beam's output handler
_GLOBAL_WINDOW = GlobalWindow()


class DirectStep(Step):
    """A Map, FlatMap or Filter (or a DoFn's ``process``) called directly, no side inputs.

    Beam's ``SimpleInvoker`` semantics, a chunk at a time: outputs that are plain values
    get the input's timestamp, windows and pane (``with_value``); any ``WindowedValue``,
    ``TimestampedValue`` or ``TaggedOutput`` goes through Beam's output handler.
    """

    def __init__(self, spec: StepSpec, sampler: Any, state_handler: Any = None) -> None:
        super().__init__(spec, sampler, state_handler)
        # "map" or "filter" (Beam's wrappers of a plain callable, which is called) or
        # "flat_map" (the DoFn's ``process``).
        self.kind: str | None = None
        # What is called, and the step's extra arguments (side-input placeholders too).
        self.callable: Callable[..., Any] | None = None
        self.arguments: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
        # How the step's keyword arguments go positionally (``with_arguments``).
        self.argument_orders: ArgumentOrders = {}
        # ``callable`` with its arguments bound.
        self.call: Callable[[Any], Any] | None = None
        self.handler: Any = None
        # The step's windows of a ``TimestampedValue`` output, by its timestamp (µs), where
        # its window function is one ``batched_dofns.micros_windows`` takes.
        self.timestamped: Callable[[Any], Any] | None = None
        # The one window its window function assigns whatever the timestamp, if so.
        self.only_window: Any = None
        # Output types that need no output handler, seen so far.
        self.plain_types: set[type] = set()
        self._run: Callable[[list[Any], Callable[[], None]], None] | None = None

    def _set_up(
        self, dofn: Any, windowing: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.handler = bi.simple_output_handler(windowing, self.receiver)
        self.timestamped = batched_dofns.micros_windows(windowing.windowfn)
        self.only_window = batched_dofns.only_window(windowing.windowfn)
        self.kind, self.callable = self._callable(dofn)
        self.arguments = (args, kwargs)
        self.call = self._bind()
        self._run = {"map": self._map, "filter": self._filter}.get(self.kind, self._flat_map)

    def _callable(self, dofn: Any) -> tuple[str, Callable[..., Any]]:
        """The call's kind and target: a plain Map's or Filter's callable, or ``process``."""
        return bi.wrapped_callable(dofn) or ("flat_map", dofn.process)

    def _bind(self) -> Callable[[Any], Any] | None:
        """``callable`` with the step's arguments, bound once."""
        assert self.callable is not None
        return with_arguments(self.callable, *self.arguments, self.argument_orders)

    def _tear_down(self) -> None:
        self.handler = self.timestamped = self.only_window = self._run = None
        self.kind = self.callable = self.call = None
        self.arguments = ((), {})

    def _process(self, values: list[Any], flush: Callable[[], None]) -> None:
        self._run_simple(values, flush)

    def _run_simple(self, values: list[Any], flush: Callable[[], None]) -> None:
        """The step's call over ``values``, errors re-raised naming the step, as Beam."""
        assert self._run is not None
        try:
            self._run(values, flush)
        except BaseException as error:  # noqa: BLE001 - re-raised naming the step, as Beam
            self._reraise(error)
            raise

    def _plain(self, outputs: Sequence[Any]) -> bool:
        """Whether no output needs Beam's output handler (checked per type, cached)."""
        return self._kind_of(outputs) is _PLAIN

    def _kind_of(self, outputs: Sequence[Any]) -> str:
        """``_PLAIN``, ``_TIMESTAMPED_ONLY`` or ``_SPECIAL`` (plain types cached)."""
        types = set(map(type, outputs))
        if types <= self.plain_types:
            return _PLAIN
        if len(types) == 1 and _TIMESTAMPED in types:
            return _TIMESTAMPED_ONLY
        special = bi.special_output_types()
        if any(issubclass(t, special) for t in types):
            return _SPECIAL
        self.plain_types |= types
        return _PLAIN

    def _handle_each(self, values: list[Any], outputs: Sequence[Any]) -> None:
        timestamped = self.timestamped
        if timestamped is not None and all(type(o) is _TIMESTAMPED for o in outputs):
            # What Beam's output handler makes of a ``TimestampedValue``: the value at its
            # timestamp in the windows the step's window function assigns it there, once
            # per window of the input element; only the assignment is cached. Made from the
            # timestamp's microseconds, as a decoded windowed value is (its ``Timestamp`` is
            # made again if read).
            make = bi.create_windowed_value
            micros_of = bi.micros_of_timestamp
            append = self.receiver.values.append
            for windowed_value, output in zip(values, outputs, strict=True):
                micros = micros_of(output.timestamp)
                windows = timestamped(micros)
                if len(windowed_value.windows) != 1:
                    windows *= len(windowed_value.windows)
                append(make(output.value, micros, windows))
            return
        handle = self.handler.handle_process_outputs
        for windowed_value, output in zip(values, outputs, strict=True):
            handle(windowed_value, (output,))

    def _map(self, values: list[Any], flush: Callable[[], None]) -> None:
        """``Map(fn)``: Beam's ``[fn(x)]``, one output per element."""
        fn = self.call
        assert fn is not None
        outputs = [fn(windowed_value.value) for windowed_value in values]
        if self._plain(outputs):
            self.receiver.values.extend(map(_WITH_VALUE, values, outputs))
        else:
            self._handle_each(values, outputs)

    def _filter(self, values: list[Any], flush: Callable[[], None]) -> None:
        """``Filter(fn)``: Beam's ``[x] if fn(x) else []``; the kept elements as they are."""
        fn = self.call
        assert fn is not None
        kept = [windowed_value for windowed_value in values if fn(windowed_value.value)]
        elements = [windowed_value.value for windowed_value in kept]
        if self._plain(elements):
            self.receiver.values.extend(kept)
        else:
            self._handle_each(kept, elements)

    def _flat_map(self, values: list[Any], flush: Callable[[], None]) -> None:
        """``FlatMap``, ``MapTuple``, ``FlatMapTuple``: each element's outputs, in order."""
        process = self.call
        assert process is not None
        receiver = self.receiver
        plain_types = self.plain_types
        params_of = self.params_of
        if self.per_window:
            values = per_window(values)
        for windowed_value in values:
            if params_of is None:
                results = process(windowed_value.value)
            else:
                results = process(windowed_value.value, *params_of(windowed_value))
            if results is None:
                continue
            kind = type(results)
            if kind is list or kind is tuple:
                self._extend(windowed_value, results)
            else:
                # An iterator (a generator, a range). Most DoFns give none or one output per
                # element: those are read with ``next``, without a chunk's list.
                iterator = iter(results)
                first = next(iterator, _END)
                if first is _END:
                    continue
                second = next(iterator, _END)
                if second is not _END:
                    self._extend_chunks(windowed_value, [first, second], iterator, flush)
                elif type(first) in plain_types:
                    # ``_extend``'s one-output case, without its call.
                    receiver.values.append(windowed_value.with_value(first))
                else:
                    self._extend(windowed_value, (first,))
            if len(receiver.values) >= CHUNK:
                flush()

    def _extend_chunks(
        self,
        windowed_value: Any,
        piece: list[Any],
        iterator: Iterator[Any],
        flush: Callable[[], None],
    ) -> None:
        """An element's outputs from its first two (``piece``) on, a chunk at a time.

        Read a chunk at a time, not whole, and passed on as chunks fill.
        """
        piece.extend(itertools.islice(iterator, CHUNK - len(piece)))
        while piece:
            self._extend(windowed_value, piece)
            if len(self.receiver.values) >= CHUNK:
                flush()
            if len(piece) < CHUNK:
                # It has ended: asking again would cost a call per element.
                return
            piece = list(itertools.islice(iterator, CHUNK))

    def _extend(self, windowed_value: Any, results: Sequence[Any]) -> None:
        """One element's outputs, with its windowing (or through Beam's handler)."""
        if len(results) == 1 and type(results[0]) in self.plain_types:
            # A one-output element (most generators'): no set of its types to build.
            self.receiver.values.append(windowed_value.with_value(results[0]))
            return
        kind = self._kind_of(results)
        if kind is _PLAIN:
            self.receiver.values.extend(map(windowed_value.with_value, results))
        elif kind is _TIMESTAMPED_ONLY and self.timestamped is not None:
            self._timestamped_outputs(windowed_value, results)
        else:
            self._handle_each([windowed_value] * len(results), results)

    def _timestamped_outputs(self, windowed_value: Any, outputs: Sequence[Any]) -> None:
        """One element's ``TimestampedValue`` outputs, as ``_handle_each`` makes them.

        Its windows are read once for all its outputs (a source's FlatMap stamps many
        events per seed), and a window function assigning one window whatever the
        timestamp (``GlobalWindows``) gives it without a call per output.
        """
        make = bi.create_windowed_value
        micros_of = bi.micros_of_timestamp
        windows_at = self.timestamped
        assert windows_at is not None
        copies = len(windowed_value.windows)
        only = self.only_window
        if copies == 1 and only is not None:
            made = [make(o.value, micros_of(o.timestamp), [only]) for o in outputs]
        elif copies == 1:
            made = [
                make(o.value, micros, windows_at(micros))
                for o in outputs
                for micros in (micros_of(o.timestamp),)
            ]
        else:
            made = [
                make(o.value, micros, windows_at(micros) * copies)
                for o in outputs
                for micros in (micros_of(o.timestamp),)
            ]
        self.receiver.values.extend(made)


class CombinePhaseStep(DirectStep):
    """A lifted combine's merge or extract phase: a map of ``(key, value)``.

    As Beam's ``CombineOperation`` outputs it: the input's timestamp, windows and pane.
    """

    def _callable(self, dofn: Any) -> tuple[str, Callable[..., Any]]:
        return "map", dofn.apply_kv


class ParamsStep(DirectStep):
    """A DoFn taking its timestamp or window after the element, called directly.

    Where it takes its window, once per window of an element, as Beam's
    ``PerWindowInvoker`` calls it (``batched_policy.timestamp_window_params``).
    """

    def _set_up(
        self, dofn: Any, windowing: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        super()._set_up(dofn, windowing, args, kwargs)
        params = batched_policy.timestamp_window_params(dofn)
        assert params is not None, "planned as a DoFn taking its timestamp or window"
        self.kind, self.callable = "flat_map", dofn.process
        self.call = dofn.process
        self._run = self._flat_map
        self.params_of = params_of(params)
        self.per_window = "window" in params

    def _tear_down(self) -> None:
        super()._tear_down()
        self.params_of = None
        self.per_window = False


class GlobalSidesStep(DirectStep):
    """A direct call whose side inputs are all globally windowed.

    Bound once per batch with their values in place (Beam's invoker reads them once, for
    the global window), and the binding dropped when the batch finishes.
    """

    reads_global_sides = True

    def _bind(self) -> Callable[[Any], Any] | None:
        return None

    def _process(self, values: list[Any], flush: Callable[[], None]) -> None:
        if self.call is None:
            self.call = self._bound(_GLOBAL_WINDOW)
        self._run_simple(values, flush)

    def _bound(self, window: Any) -> Callable[[Any], Any]:
        """``callable`` with the side inputs' values for ``window`` in place."""
        assert self.callable is not None
        try:
            args, kwargs = batched_side_inputs.side_input_arguments(
                self.side_inputs, window, *self.arguments
            )
        except BaseException as error:  # noqa: BLE001 - re-raised naming the step, as Beam
            self._reraise(error)
            raise
        return with_arguments(self.callable, args, kwargs, self.argument_orders)

    def _end_batch(self) -> None:
        self.call = None


class WindowSidesStep(GlobalSidesStep):
    """A direct call reading side inputs per window, a run of neighbours at a time.

    Beam's ``PerWindowInvoker`` calls with the side inputs' values for the element's
    window; neighbours in the same window share one call, bound once per window and batch
    (by ``bi.window_key``). An element in several windows (Beam calls once per window,
    the element in that window alone) goes through Beam's DoFnRunner.
    """

    reads_global_sides = False
    reads_window_sides = True

    def __init__(self, spec: StepSpec, sampler: Any, state_handler: Any = None) -> None:
        super().__init__(spec, sampler, state_handler)
        self.window_calls: dict[Any, Callable[[Any], Any]] = {}

    def _process(self, values: list[Any], flush: Callable[[], None]) -> None:
        calls = self.window_calls
        key_of = bi.window_key
        start, count = 0, len(values)
        while start < count:
            windows = values[start].windows
            if len(windows) != 1:
                try:
                    self.runner.process(values[start])
                finally:
                    start += 1
                continue
            (window,) = windows
            key = key_of(window)
            end = start + 1
            while end < count:
                following = values[end].windows
                if len(following) != 1 or key_of(following[0]) != key:
                    break
                end += 1
            call = calls.get(key)
            if call is None:
                call = calls[key] = self._bound(window)
            self.call = call
            self._run_simple(values[start:end], flush)
            start = end

    def _tear_down(self) -> None:
        super()._tear_down()
        self.window_calls = {}

    def _end_batch(self) -> None:
        self.call = None
        self.window_calls.clear()
