"""The batched path: a fused stage's stateless steps run step by step over a whole batch.

Beam's bundle processor moves each element through the stage's operation chain, with a
counter update, a size sample and a receiver call per element and step. Steps that need
nothing per element from the runner — Map, FlatMap, Filter, MapTuple/FlatMapTuple (Beam's
``CallableWrapperDoFn``), ``WindowInto`` with Beam's standard window functions, and user
DoFns whose ``process`` takes only the element, or with timestamp or window parameters, also
with side inputs read as iterables, a lifted combine's precombine, merge and extract
phases — run here instead, one step at a time over the batch's decoded windowed values:

* each step is Beam's own ``DoFnRunner`` (``WindowInto``: the DoFn Beam's bundle processor
  runs for it), so outputs keep or get their timestamps, windows and panes exactly as Beam
  gives them; a Map/FlatMap/Filter whose callable takes only the element is called
  directly (Beam's ``SimpleInvoker`` semantics: ``wv.with_value(output)``), any output that
  is a ``WindowedValue``, ``TimestampedValue`` or ``TaggedOutput`` going through Beam's
  output handler; a step with side inputs gets Beam's side-input maps over the stage
  worker's state handler, each value kept per main window for the batch
  (``beam_internals.side_input_maps``);
* each step gets ``setup`` once, ``start_bundle``/``finish_bundle`` per batch (finish
  outputs included, downstream of the step's other outputs, as in Beam) and ``teardown``
  when the stage worker is torn down; its own metrics container (user metrics land under
  its step), and Beam's element counts and sampled sizes per PCollection;
* an error is Beam's: the user's exception, its message ending in
  ``[while running '<step>']``.

What qualifies is decided once per stage worker from the process bundle descriptor
(:func:`plan_batched_steps`): the steps reachable from the stage's input through qualifying
steps only, with at most one PCollection (the *hand-off*) read by a step that does not
qualify (``execution.batched_plan``). The hand-off's elements go to the bundle processor
without being encoded (``beam_internals.HandoffCoder``), which runs the rest of the stage
from a descriptor without the batched steps. Outputs of batched steps bound for the stage's
outputs are encoded here directly.

A stage of no steps whose outputs write its input's coder (a CoGroupByKey's Flatten read
and GroupByKey write) is a *pass-through*: the bundle processor would decode each element
(user objects unpickled) and encode it again, giving the bytes it read. Here the encoded
elements go to the outputs as they are; only where each ends is read, with the input's
coder reading its length-prefixed (user-coded) parts as bytes. Element counts, the read
index and sampled sizes (the sampled elements decoded) are reported as for any batch.

Known difference: the steps of a batch run a chunk at a time, not interleaved element by
element, so a DoFn that mutates its input or output after emitting it, or steps sharing
mutable globals, may see other values than on Beam's path (Beam forbids such mutation).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import random
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from apache_beam.transforms.window import GlobalWindow

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import gc_pause
from beam_spark_runner.execution.batched_plan import BatchedPlan, StepSpec

_LOGGER = logging.getLogger(__name__)

_WITH_VALUE = bi.WindowedValue.with_value
_TIMESTAMPED = bi.TimestampedValue
# What ``next`` gives an iterator that has ended.
_END = object()
# Elements that go through the steps together.
_CHUNK = 256


def _nanos_to_ms(nanos: int) -> int:
    return nanos // 1_000_000


_GLOBAL_WINDOW = GlobalWindow()


# ``_params_of`` for the usual parameter lists, without a name compared per element (a
# DoFn taking both: 0.12 us an element, against 0.42-0.47 us comparing names).
_DIRECT_PARAMS: dict[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] = {
    ("timestamp",): lambda wv: (wv.timestamp,),
    ("window",): lambda wv: (wv.windows[0],),
    ("timestamp", "window"): lambda wv: (wv.timestamp, wv.windows[0]),
    ("window", "timestamp"): lambda wv: (wv.windows[0], wv.timestamp),
}


def _params_of(params: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A windowed value's timestamp or (only) window per name in ``params``, in order.

    As Beam's invoker passes them (after ``_per_window`` where a window is taken).
    """
    direct = _DIRECT_PARAMS.get(params)
    if direct is not None:
        return direct
    return lambda windowed_value: tuple(
        windowed_value.timestamp if name == "timestamp" else windowed_value.windows[0]
        for name in params
    )


def _per_window(values: list[Any]) -> list[Any]:
    """Each element once per window, in that window alone.

    As Beam's ``PerWindowInvoker`` calls a DoFn taking its window: the same value and
    timestamp, and no pane (``invoke_process`` makes a new ``WindowedValue`` without one).
    """
    if all(len(windowed_value.windows) == 1 for windowed_value in values):
        return values
    exploded = []
    for windowed_value in values:
        if len(windowed_value.windows) == 1:
            exploded.append(windowed_value)
        else:
            value, timestamp = windowed_value.value, windowed_value.timestamp
            exploded.extend(
                bi.WindowedValue(value, timestamp, (w,)) for w in windowed_value.windows
            )
    return exploded


_ArgumentOrders = dict[tuple[int, tuple[str, ...]], tuple[str, ...] | None]


def _with_arguments(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    orders: _ArgumentOrders | None = None,
) -> Callable[[Any], Any]:
    """``fn`` called with the element, then the step's extra arguments (as Beam calls it).

    A call with ``**kwargs`` copies the dict for every element, one with ``*args`` a tuple:
    a Map reading a dict side input (``Map(fn, weights=AsDict(...))``) spent a seventh of
    its workers' time there (0.54 us a call, 0.22 with the argument in a closure). So
    keyword arguments that bind to ``fn``'s positional parameters go positionally
    (:func:`_positional_order`, remembered in ``orders`` for the step's next batches), and
    up to two extra arguments are held by the closure.
    """
    if kwargs:
        orders = {} if orders is None else orders
        shape = (len(args), tuple(kwargs))
        if shape not in orders:
            orders[shape] = _positional_order(fn, *shape)
        order = orders[shape]
        if order is None:
            return lambda element: fn(element, *args, **kwargs)
        args = (*args, *(kwargs[name] for name in order))
    if not args:
        return fn
    if len(args) == 1:
        (first,) = args
        return lambda element: fn(element, first)
    if len(args) == 2:
        first, second = args
        return lambda element: fn(element, first, second)
    return lambda element: fn(element, *args)


def _positional_order(
    fn: Callable[..., Any], count: int, names: tuple[str, ...]
) -> tuple[str, ...] | None:
    """Keyword arguments ``names`` ordered as the positional parameters they bind to.

    Those parameters come right after the element and ``count`` positional extras. None
    where any would bind otherwise (keyword-only, ``**kw``, a default left between them, no
    signature, a call that fails as it is). A wrapper's own signature counts, not what it
    wraps.
    """
    import inspect

    try:
        signature = inspect.signature(fn, follow_wrapped=False)
        bound = signature.bind(None, *range(count), **dict.fromkeys(names))
    except (TypeError, ValueError):
        return None
    if bound.kwargs or len(bound.args) != 1 + count + len(names):
        return None
    return tuple(list(bound.arguments)[1 + count :])


class _Step:
    """One batched step in a stage worker: Beam's DoFnRunner, its metrics and timings."""

    def __init__(self, spec: StepSpec, sampler: Any, state_handler: Any = None) -> None:
        self.spec = spec
        self.state_handler = state_handler
        # A ParDo's side-input maps (read through the stage's state handler), reset after
        # each batch.
        self.side_inputs: list[Any] = []
        # How the step's keyword arguments go positionally (_with_arguments), per batch.
        self.argument_orders: _ArgumentOrders = {}
        self.receiver = bi.ListReceiver()
        self.container = bi.metrics_container(spec.step_name)
        self.states = [
            bi.scoped_state(sampler, spec.step_name, spec.transform_id, name, self.container)
            for name in ("start", "process", "finish")
        ]
        self.runner: Any = None
        # ``WindowInto`` with Beam's fixed, sliding, session or global windows: the new
        # windows of an element in one window, by its timestamp in µs
        # (``bi.window_assigner``).
        self.assign: Callable[[int], Any] | None = None
        # A Flatten of one input: each windowed value passed on as it is.
        self.passes = False
        # A lifted combine's precombine: its DoFn adds a chunk at a time (``add_all``).
        self.precombine: Any = None
        # A Map/FlatMap/Filter called directly: "map" or "filter" (Beam's wrappers of a
        # plain callable, which is called) or "flat_map" (the DoFn's ``process``); None
        # for any other step.
        self.kind: str | None = None
        # What is called, and the step's extra arguments (side-input placeholders too).
        self.callable: Callable[..., Any] | None = None
        self.arguments: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})
        # ``callable`` with its arguments: bound once, or, where the side inputs are all
        # globally windowed, once per batch with their values in place (Beam's invoker
        # reads them once, for the global window) and dropped when the batch finishes.
        self.call: Callable[[Any], Any] | None = None
        self.reads_global_sides = False
        # Side inputs not all globally windowed: ``callable`` with their values for a
        # window, bound once per window and batch (by ``bi.window_key``).
        self.reads_window_sides = False
        self.window_calls: dict[Any, Callable[[Any], Any]] = {}
        self.handler: Any = None
        # The step's windows of a ``TimestampedValue`` output, by its timestamp (µs), where
        # its window function is one ``bi.micros_windows`` takes.
        self.timestamped: Callable[[Any], Any] | None = None
        # Output types that need no output handler, seen so far.
        self.plain_types: set[type] = set()
        # A "flat_map" DoFn taking its timestamp or window after the element
        # (``bi.timestamp_window_params``): those of a windowed value, and whether it is
        # called once per window of an element (where it takes its window).
        self.params_of: Callable[[Any], tuple[Any, ...]] | None = None
        self.per_window = False
        self.nanos = [0, 0, 0]

    def set_up(self) -> None:
        dofn, windowing, args, kwargs = self.spec.make_dofn()
        if self.spec.side_inputs is not None:
            self.side_inputs = self.spec.side_inputs(self.state_handler)
        self.runner = bi.dofn_runner(
            dofn,
            windowing,
            self.receiver,
            self.spec.step_name,
            self.spec.transform_id,
            args,
            kwargs,
            self.side_inputs,
        )
        self.assign = bi.window_assigner(dofn)
        self.passes = bool(getattr(type(dofn), "runner_flatten", False))
        if getattr(type(dofn), "runner_precombine", False):
            self.precombine = dofn
        if getattr(type(dofn), "runner_combine_phase", False):
            # A combine's merge or extract phase: a map of (key, value), as Beam's
            # CombineOperation outputs it (the input's timestamp, windows and pane).
            self.handler = bi.simple_output_handler(windowing, self.receiver)
            self.kind, self.callable = "map", dofn.apply_kv
            self.call = self.callable
        if bi.is_simple_callable(dofn):
            self.handler = bi.simple_output_handler(windowing, self.receiver)
            self.timestamped = bi.micros_windows(windowing.windowfn)
            self.kind, self.callable = bi.wrapped_callable(dofn) or ("flat_map", dofn.process)
            self.arguments = (args, kwargs)
            if not self.side_inputs:
                self.call = _with_arguments(self.callable, args, kwargs, self.argument_orders)
            elif all(side_input.is_globally_windowed() for side_input in self.side_inputs):
                self.reads_global_sides = True
            else:
                self.reads_window_sides = True
        elif not (
            self.side_inputs
            or args
            or kwargs
            or self.kind
            or self.assign
            or self.passes
            or self.precombine is not None
        ):
            params = bi.timestamp_window_params(dofn)
            if params is not None:
                self.handler = bi.simple_output_handler(windowing, self.receiver)
                self.timestamped = bi.micros_windows(windowing.windowfn)
                self.kind = "flat_map"
                self.callable = self.call = dofn.process
                self.params_of = _params_of(params)
                self.per_window = "window" in params
        with self.states[0]:
            self.runner.setup()

    def _bind_global_sides(self) -> None:
        """The batch's call, with the globally windowed side inputs' values in place."""
        self.call = self._bound(_GLOBAL_WINDOW)

    def _bound(self, window: Any) -> Callable[[Any], Any]:
        """``callable`` with the side inputs' values for ``window`` in place."""
        assert self.callable is not None
        try:
            args, kwargs = bi.side_input_arguments(self.side_inputs, window, *self.arguments)
        except BaseException as error:  # noqa: BLE001 - re-raised naming the step, as Beam
            bi.reraise_augmented(self.runner, error, None)
            raise
        return _with_arguments(self.callable, args, kwargs, self.argument_orders)

    def _run_per_window(self, values: list[Any], flush: Callable[[], None]) -> None:
        """A direct call reading side inputs per window, a run of neighbours at a time.

        Beam's ``PerWindowInvoker`` calls with the side inputs' values for the element's
        window; neighbours in the same window share one call, bound once per window and
        batch. An element in several windows (Beam calls once per window, the element in
        that window alone) goes through Beam's DoFnRunner.
        """
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

    def tear_down(self) -> None:
        runner, self.runner = self.runner, None
        self.side_inputs = []
        self.handler = self.assign = self.precombine = None
        self.kind = self.callable = self.call = self.params_of = None
        self.per_window = False
        self.arguments = ((), {})
        self.reads_global_sides = self.reads_window_sides = False
        self.window_calls = {}
        self.timestamped = None
        self.passes = False
        if runner is not None:
            with self.states[2]:
                runner.teardown()

    def start(self) -> None:
        self.receiver.values = []
        began = time.perf_counter_ns()
        with self.states[0]:
            self.runner.start()
        self.nanos[0] += time.perf_counter_ns() - began

    def process(self, values: list[Any], sink: Callable[[list[Any]], None]) -> None:
        """Processes ``values``, handing the outputs to ``sink`` every ``_CHUNK`` or so.

        A FlatMap may give many outputs per element: they go downstream in chunks, not all
        at once. The time ``sink`` takes is not this step's.
        """
        began = time.perf_counter_ns()

        def flush() -> None:
            nonlocal began
            outputs, self.receiver.values = self.receiver.values, []
            self.nanos[1] += time.perf_counter_ns() - began
            sink(outputs)
            began = time.perf_counter_ns()

        # A DoFn's outputs (and those of Beam's output handler) go on as they fill a chunk,
        # even while the DoFn is still iterating over one element's outputs.
        self.receiver.full, self.receiver.limit = flush, _CHUNK
        try:
            with self.states[1]:
                if self.passes:
                    self.receiver.values.extend(values)
                elif self.precombine is not None:
                    self._precombine(values)
                elif self.assign is not None:
                    self._window_into(values)
                elif self.reads_window_sides:
                    self._run_per_window(values, flush)
                elif self.kind is not None:
                    if self.call is None:
                        self._bind_global_sides()
                    self._run_simple(values, flush)
                else:
                    process = self.runner.process
                    for windowed_value in values:
                        process(windowed_value)
        finally:
            self.receiver.full, self.receiver.limit = None, sys.maxsize
        self.nanos[1] += time.perf_counter_ns() - began
        outputs, self.receiver.values = self.receiver.values, []
        sink(outputs)

    def finish(self) -> list[Any]:
        """Finishes the bundle; returns what ``finish_bundle`` output."""
        began = time.perf_counter_ns()
        with self.states[2]:
            self.runner.finish()
        self.nanos[2] += time.perf_counter_ns() - began
        outputs, self.receiver.values = self.receiver.values, []
        # As Beam's DoOperation.reset: the next batch reads the side inputs again.
        for side_input in self.side_inputs:
            side_input.reset()
        if self.reads_global_sides or self.reads_window_sides:
            self.call = None
            self.window_calls.clear()
        return outputs

    def _window_into(self, values: list[Any]) -> None:
        """``WindowInto``: what Beam's ``WindowIntoDoFn`` outputs, windows from a cache.

        An element in one window becomes ``WindowedValue(value, timestamp, new windows)``
        (no pane), as the DoFn yields it; any other goes through Beam's DoFnRunner (one
        output per window).
        """
        assign = self.assign
        assert assign is not None
        make = bi.create_windowed_value  # from the timestamp in µs, as the input has it
        append = self.receiver.values.append
        for windowed_value in values:
            if len(windowed_value.windows) == 1:
                micros = windowed_value.timestamp_micros
                append(make(windowed_value.value, micros, assign(micros)))
            else:
                self.runner.process(windowed_value)

    def _precombine(self, values: list[Any]) -> None:
        """The precombine's table takes the chunk; what it flushes goes on."""
        try:
            self.receiver.values.extend(self.precombine.add_all(values))
        except BaseException as error:  # noqa: BLE001 - re-raised naming the step, as Beam
            bi.reraise_augmented(self.runner, error, None)
            raise

    def _run_simple(self, values: list[Any], flush: Callable[[], None]) -> None:
        """Beam's ``SimpleInvoker`` and output handler, a chunk at a time.

        Outputs that are plain values get the input's timestamp, windows and pane
        (``with_value``); any ``WindowedValue``, ``TimestampedValue`` or ``TaggedOutput``
        goes through Beam's output handler, as on Beam's path.
        """
        try:
            if self.kind == "map":
                self._map(values)
            elif self.kind == "filter":
                self._filter(values)
            else:
                self._flat_map(_per_window(values) if self.per_window else values, flush)
        except BaseException as error:  # noqa: BLE001 - re-raised naming the step, as Beam
            bi.reraise_augmented(self.runner, error, None)
            raise

    def _plain(self, outputs: Sequence[Any]) -> bool:
        """Whether no output needs Beam's output handler (checked per type, cached)."""
        types = set(map(type, outputs))
        if types <= self.plain_types:
            return True
        special = bi.special_output_types()
        if any(issubclass(t, special) for t in types):
            return False
        self.plain_types |= types
        return True

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

    def _map(self, values: list[Any]) -> None:
        """``Map(fn)``: Beam's ``[fn(x)]``, one output per element."""
        fn = self.call
        assert fn is not None
        outputs = [fn(windowed_value.value) for windowed_value in values]
        if self._plain(outputs):
            self.receiver.values.extend(map(_WITH_VALUE, values, outputs))
        else:
            self._handle_each(values, outputs)

    def _filter(self, values: list[Any]) -> None:
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
                # element: those are read with ``next``, without a chunk's list (0.43 ->
                # 0.25 us a one-output generator, 0.27 -> 0.12 us an empty iterator).
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
            if len(receiver.values) >= _CHUNK:
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
        piece.extend(itertools.islice(iterator, _CHUNK - len(piece)))
        while piece:
            self._extend(windowed_value, piece)
            if len(self.receiver.values) >= _CHUNK:
                flush()
            if len(piece) < _CHUNK:
                # It has ended: asking again would cost a call per element, a third of a
                # one-output generator's handling (0.63 -> 0.40 us).
                return
            piece = list(itertools.islice(iterator, _CHUNK))

    def _extend(self, windowed_value: Any, results: Sequence[Any]) -> None:
        """One element's outputs, with its windowing (or through Beam's handler)."""
        if len(results) == 1 and type(results[0]) in self.plain_types:
            # A one-output element (most generators'): no set of its types to build.
            self.receiver.values.append(windowed_value.with_value(results[0]))
        elif self._plain(results):
            self.receiver.values.extend(map(windowed_value.with_value, results))
        else:
            self._handle_each([windowed_value] * len(results), results)

    def monitoring_infos(self) -> list[Any]:
        """The step's user metrics and timings since the last call (then reset)."""
        infos = bi.user_monitoring_infos(self.container, self.spec.transform_id)
        infos.extend(
            bi.execution_time_monitoring_infos(
                self.spec.transform_id, *(_nanos_to_ms(n) for n in self.nanos)
            )
        )
        self.container.reset()
        self.nanos = [0, 0, 0]
        return infos


class SizeSampler:
    """Which elements of a PCollection to sample for their sizes, as Beam picks them.

    Beam's ``OperationCounters`` samples the first ten elements an operation sees, then
    about 10/N of the elements after the N-th (reservoir sampling's fast approximation: a
    random gap after each sample), over the operation's life, not per bundle. So does this,
    over the batched steps' life: a long-running stage samples ever fewer (one sample per
    chunk and PCollection cost a few per cent of a streaming query's time).
    """

    FIRST = 10

    def __init__(self) -> None:
        self.seen = 0
        self.next = 0  # the index of the next element to sample, over the life

    def pick(self, count: int) -> list[int]:
        """The indexes, in the next ``count`` elements, of those to sample."""
        start = self.seen
        end = self.seen = start + count
        picked: list[int] = []
        while self.next < end:
            picked.append(self.next - start)
            seen = self.next + 1
            if seen < self.FIRST:
                self.next = seen
            else:
                gap = math.floor(
                    math.log(1.0 - random.random()) / math.log(1.0 - self.FIRST / (seen + 1))
                )
                self.next = seen + gap
        return picked


class _Batch:
    """One batch on its way through the steps: counts, sizes, outputs, the hand-off."""

    def __init__(self, steps: BatchedSteps) -> None:
        # A pass-through's input, as it came (pieces of encoded elements), and the end of
        # each element in their concatenation.
        self.passed: list[bytes] = []
        self.passed_ends: list[int] = []
        self._steps = steps
        self.counts = dict.fromkeys(steps.plan.coder_ids, 0)
        self.sizes: dict[str, list[int]] = {p: [] for p in steps.plan.coder_ids}
        self.handoff: list[Any] = []
        # Nanoseconds spent decoding the input and encoding each output.
        self.io_nanos = dict.fromkeys(
            [steps.plan.input_transform_id, *steps.plan.direct_outputs], 0
        )
        self.outputs: dict[str, tuple[Any, list[int]]] = {
            transform_id: (bi.create_OutputStream(), [])
            for transform_id in steps.plan.direct_outputs
        }

    def emit(self, pcollection: str, values: list[Any]) -> None:
        """Hands ``values`` of ``pcollection`` to its readers, counted and size-sampled."""
        if not values:
            return
        steps = self._steps
        picked = self._count(pcollection, len(values))
        if picked:
            self._sample(pcollection, [values[i] for i in picked])
        if pcollection == steps._handoff:
            self.handoff.extend(values)
        for transform_id in steps._outputs_of.get(pcollection, ()):
            stream, ends = self.outputs[transform_id]
            began = time.perf_counter_ns()
            _encode_into(steps._outputs[transform_id][1], values, stream, ends)
            self.io_nanos[transform_id] += time.perf_counter_ns() - began
        for step in steps._readers.get(pcollection, ()):
            step.process(values, functools.partial(self.emit, step.spec.output_pcollection))

    def _count(self, pcollection: str, count: int) -> list[int]:
        """Counts a chunk of ``count`` elements; returns which of them to sample for sizes."""
        self.counts[pcollection] += count
        return self._steps._samplers[pcollection].pick(count)

    def _sample(self, pcollection: str, values: list[Any]) -> None:
        estimate = self._steps._sizes[pcollection].estimate_size
        self.sizes[pcollection].extend(map(estimate, values))

    def pass_through(self, pieces: Iterable[bytes]) -> None:
        """A pass-through's input (see the module doc): where its elements end, counted.

        Only the elements sampled for their sizes are decoded, as ``emit`` samples them.
        """
        steps = self._steps
        assert steps._pass_through is not None
        read = steps._pass_through.decode_from_stream
        decode = steps._input.decode_nested
        input_id = steps.plan.input_transform_id
        pcollection = steps.plan.input_pcollection
        offset = self.passed_ends[-1] if self.passed_ends else 0
        for piece in pieces:
            began = time.perf_counter_ns()
            stream = bi.create_InputStream(piece)
            remaining = stream.size
            size = len(piece)
            ends: list[int] = []  # in the piece
            while remaining():
                read(stream, True)
                ends.append(size - remaining())
            self.io_nanos[input_id] += time.perf_counter_ns() - began
            for chunk in range(0, len(ends), _CHUNK):
                picked = self._count(pcollection, min(_CHUNK, len(ends) - chunk))
                if picked:
                    sampled = [chunk + i for i in picked]
                    self._sample(
                        pcollection,
                        [decode(piece[ends[i - 1] if i else 0 : ends[i]]) for i in sampled],
                    )
            self.passed.append(piece)
            self.passed_ends.extend([offset + end for end in ends] if offset else ends)
            offset += size

    def encoded_outputs(self) -> dict[str, tuple[bytes, list[int]]]:
        """Per data output, its encoded elements and each one's end."""
        if self._steps._pass_through is not None:
            data = self.passed[0] if len(self.passed) == 1 else b"".join(self.passed)
            return dict.fromkeys(self.outputs, (data, self.passed_ends))
        return {
            transform_id: (stream.get(), ends)
            for transform_id, (stream, ends) in self.outputs.items()
        }


@typing.runtime_checkable
class ValuesInput(Protocol):
    """A batch's input that can make its windowed values without Beam's decoding.

    A Spark stream's columns (``streaming.spark_sources.ColumnsInput``). Iterated, it gives
    them encoded, for the bundle processor.
    """

    def __iter__(self) -> Iterator[bytes]: ...

    def windowed_values(self) -> Iterator[Any] | None:
        """The values the input coder would decode, in order; None where it cannot."""


def _encode_into(impl: Any, values: list[Any], out: Any, ends: list[int]) -> None:
    """Encodes windowed values as the data plane does, noting each element's end."""
    encode = impl.encode_to_stream
    size = out.size
    end = ends.append
    for value in values:
        encode(value, out, True)
        end(size())


@dataclasses.dataclass
class BatchResult:
    """What a batch gave: encoded stage outputs, the hand-off's input, monitoring infos."""

    # Data output transform id -> (encoded elements, each element's end).
    outputs: dict[str, tuple[bytes, list[int]]]
    # The encoded elements for the bundle processor (None: no hand-off).
    handoff: bytes | None
    monitoring_infos: list[Any]


class BatchedSteps:
    """The batched steps of one stage worker (see the module docstring).

    DoFns are set up before their first batch, torn down with the stage worker, when the
    process is idle (``tear_down_if_idle``) and after a failed batch (Beam discards a failed
    bundle's processor too), and set up anew from the descriptor when needed again.
    """

    def __init__(self, plan: BatchedPlan, display_name: str, state_handler: Any = None) -> None:
        """``state_handler`` serves the steps' side inputs (``reads_side_inputs``)."""
        self.plan = plan
        self.display_name = display_name
        coders = bi.PipelineContext(plan.coders).coders
        self._input = coders[plan.input_coder_id].get_impl()
        self._outputs = {
            transform_id: (pcollection, coders[coder_id].get_impl())
            for transform_id, (pcollection, coder_id) in plan.direct_outputs.items()
        }
        self._handoff = plan.handoff[0] if plan.handoff else None
        # A pass-through (see the module doc): reads where each input element ends.
        self._pass_through = (
            coders[plan.pass_through_coder_id].get_impl() if plan.pass_through_coder_id else None
        )
        self._sizes = {p: coders[c].get_impl() for p, c in plan.coder_ids.items()}
        self._samplers = {p: SizeSampler() for p in plan.coder_ids}
        self._sampler = bi.state_sampler(display_name)
        self._steps = [_Step(spec, self._sampler, state_handler) for spec in plan.steps]
        self.reads_side_inputs = any(spec.side_inputs is not None for spec in plan.steps)
        self._readers: dict[str, list[_Step]] = {}
        for step in self._steps:
            self._readers.setdefault(step.spec.input_pcollection, []).append(step)
        self._outputs_of: dict[str, list[str]] = {}
        for transform_id, (pcollection, _) in plan.direct_outputs.items():
            self._outputs_of.setdefault(pcollection, []).append(transform_id)
        self._lock = threading.Lock()
        self._set_up = False
        self.last_used = 0.0

    @property
    def step_names(self) -> list[str]:
        """The batched steps' names, in the order they run."""
        return [spec.step_name for spec in self.plan.steps]

    def run(self, data: bytes | Iterable[bytes]) -> BatchResult:
        """Runs the batched steps over one batch of encoded elements (one bundle).

        ``data`` is the batch's elements, or pieces of them decoded as the steps need them
        (a native text read's blocks, ``execution.text_read.TextInput``), or a
        ``ValuesInput`` that makes the windowed values itself.

        The batch goes through the steps a chunk at a time (``_CHUNK`` elements, outputs
        included), so few windowed values are alive at once, with Python's cyclic garbage
        collector paused (``execution.gc_pause``: Beam's operation chain frees each element
        before the next is made, so the collector never runs there).
        """
        with self._lock:
            previous = bi.get_current_tracker()
            batch = _Batch(self)
            try:
                with gc_pause.paused():
                    if not self._set_up:
                        self._set_up = True
                        # Beam sets its operations up outside any bundle: no metrics
                        # container is current, and what ``setup`` counts is not reported.
                        bi.set_current_tracker(None)
                        for step in self._steps:
                            step.set_up()
                    bi.set_current_tracker(self._sampler)
                    # Beam starts a bundle's operations downstream first, finishes upstream
                    # first.
                    for step in reversed(self._steps):
                        step.start()
                    if self._pass_through is not None:
                        batch.pass_through([data] if isinstance(data, bytes) else data)
                    else:
                        self._decode_and_emit(data, batch)
                    for step in self._steps:
                        batch.emit(step.spec.output_pcollection, step.finish())
            except BaseException:
                bi.record_failed_bundle_monitoring_infos(self._monitoring_infos(batch))
                self._tear_down_locked("a batch failed")
                raise
            finally:
                bi.set_current_tracker(previous)
                self.last_used = time.time()
            handoff = None
            if self._handoff is not None:
                handoff = bi.hand_off(self.plan.token, batch.handoff)
            return BatchResult(batch.encoded_outputs(), handoff, self._monitoring_infos(batch))

    def _decode_and_emit(self, data: bytes | Iterable[bytes], batch: _Batch) -> None:
        """The batch's input values, a chunk at a time, through the steps."""
        decode = self._input.decode_all
        made = data.windowed_values() if isinstance(data, ValuesInput) else None
        if made is not None:
            values = made
        elif isinstance(data, bytes):
            values = decode(data)
        else:
            values = itertools.chain.from_iterable(map(decode, data))
        input_id = self.plan.input_transform_id
        while True:
            began = time.perf_counter_ns()
            chunk = list(itertools.islice(values, _CHUNK))
            batch.io_nanos[input_id] += time.perf_counter_ns() - began
            if not chunk:
                break
            batch.emit(self.plan.input_pcollection, chunk)

    def _monitoring_infos(self, batch: _Batch) -> list[Any]:
        """Per step and PCollection, as Beam's operations report them for a bundle.

        The hand-off PCollection is counted by the bundle processor's data input.
        """
        infos: list[Any] = []
        for step in self._steps:
            infos.extend(step.monitoring_infos())
        # The data input and outputs are operations of Beam's too: their times (decoding,
        # encoding), and the input's read index (the stage worker drops the one the bundle
        # processor reports for the hand-off).
        for transform_id, nanos in batch.io_nanos.items():
            infos.extend(bi.execution_time_monitoring_infos(transform_id, 0, nanos // 10**6, 0))
        read = batch.counts[self.plan.input_pcollection]
        infos.append(bi.read_index_monitoring_info(self.plan.input_transform_id, read))
        for pcollection, count in batch.counts.items():
            if pcollection == self._handoff:
                continue
            sizes = batch.sizes[pcollection]
            summary = (sum(sizes), len(sizes), min(sizes), max(sizes)) if sizes else (0, 0, 0, 0)
            infos.extend(bi.pcollection_monitoring_infos(pcollection, count, summary))
        return infos

    def _tear_down_locked(self, why: str) -> int:
        if not self._set_up:
            return 0
        self._set_up = False
        _LOGGER.debug("Tearing down the batched steps of %s (%s)", self.display_name, why)
        for step in self._steps:
            try:
                step.tear_down()
            except Exception:  # noqa: BLE001 - as Beam: a teardown error fails nothing else
                _LOGGER.exception("Teardown of %s failed", step.spec.step_name)
        return 1

    def tear_down(self, why: str) -> None:
        """Tears down the steps' DoFns (a batch running meanwhile finishes first)."""
        with self._lock:
            self._tear_down_locked(why)

    def tear_down_if_idle(self, now: float, idle_seconds: float) -> int:
        """Tears down the DoFns if no batch ran for ``idle_seconds``; 1 if it did, else 0.

        A batch running now is never touched.
        """
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            if now - self.last_used < idle_seconds:
                return 0
            return self._tear_down_locked("idle")
        finally:
            self._lock.release()
