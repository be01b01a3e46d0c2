"""Beam's DoFn machinery the batched path calls: signatures, ``DoFnRunner``, output handler."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from apache_beam import coders, pvalue
from apache_beam.internal.util import ArgumentPlaceholder, insert_values_in_args
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import common as runners_common
from apache_beam.runners.pipeline_context import PipelineContext
from apache_beam.runners.worker import bundle_processor
from apache_beam.transforms import core, sideinputs
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.windowed_value import WindowedValue


class ListReceiver(runners_common.Receiver):  # type: ignore[misc]
    """A Beam receiver that appends every windowed value it receives to ``values``.

    Once ``values`` holds ``limit`` values, it calls ``full`` (which takes them).
    """

    def __init__(self) -> None:
        self.values: list[WindowedValue] = []
        self.limit = sys.maxsize
        self.full: Callable[[], None] | None = None

    def receive(self, windowed_value: WindowedValue) -> None:
        self.values.append(windowed_value)
        if len(self.values) >= self.limit and self.full is not None:
            self.full()


class _NullReceiver(runners_common.Receiver):  # type: ignore[misc]
    def receive(self, windowed_value: WindowedValue) -> None:
        """Drops the value: an output tag nobody reads, as Beam's ``_TaggedReceivers``."""


class _MainOnlyReceivers(dict):  # type: ignore[type-arg]
    """Tagged receivers of a one-output step: unknown tags go nowhere, as in Beam."""

    def __missing__(self, tag: Any) -> Any:
        return _NullReceiver()


def dofn_runner(
    dofn: Any,
    windowing: Any,
    receiver: ListReceiver,
    step_name: str,
    transform_id: str,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    side_inputs: Sequence[Any] = (),
) -> Any:
    """Beam's ``DoFnRunner`` for a one-output step writing to ``receiver``.

    Built as Beam's ``DoOperation`` builds it (the main output and its tag go to the
    receiver, other tags nowhere), so ``process``, ``start``, ``finish``, ``setup`` and
    ``teardown`` behave as in the bundle processor, errors naming the step included.
    ``side_inputs`` are the step's side-input maps (:func:`state_backed_side_input_maps`).
    """
    from apache_beam.utils.counters import CounterFactory

    state = runners_common.DoFnState(CounterFactory())
    state.step_name = step_name
    receivers = _MainOnlyReceivers({None: receiver})
    return runners_common.DoFnRunner(
        dofn,
        list(args),
        dict(kwargs or {}),
        list(side_inputs),
        windowing,
        tagged_receivers=receivers,
        step_name=step_name,
        state=state,
        transform_id=transform_id,
        operation_name=step_name,
    )


def simple_output_handler(windowing: Any, receiver: ListReceiver) -> Any:
    """Beam's output handler of a ``CallableWrapperDoFn`` writing to ``receiver``."""
    return runners_common._OutputHandler(  # noqa: SLF001 - Beam internal
        windowing.windowfn, receiver, _MainOnlyReceivers({None: receiver}), None, None, False, False
    )


def special_output_types() -> tuple[type, ...]:
    """Outputs of ``process`` that Beam does not simply give the input's windowing."""
    from apache_beam.pvalue import TaggedOutput

    return (WindowedValue, TimestampedValue, TaggedOutput)


def reraise_augmented(runner: Any, error: BaseException, windowed_value: Any) -> None:
    """Re-raises ``error`` as Beam's ``DoFnRunner`` does: the message names the step."""
    runner._reraise_augmented(error, windowed_value)  # noqa: SLF001 - Beam internal


def _code_key(function: Any) -> tuple[Any, ...] | None:
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    return (code.co_code, code.co_names, code.co_freevars, code.co_filename, code.co_firstlineno)


@functools.cache
def _wrapper_codes() -> dict[tuple[Any, ...] | None, str]:
    """The code of the functions Beam's ``Map`` and ``Filter`` wrap a plain callable in."""
    from apache_beam.transforms import core

    def probe(x: Any) -> Any:
        return x

    def probe_with_arguments(x: Any, y: Any) -> Any:
        return x

    return {
        _code_key(core.Map(probe).fn._fn): "map",  # noqa: SLF001 - Beam internal
        # Map(fn) of a callable taking more than the element (extra arguments, side inputs).
        _code_key(core.Map(probe_with_arguments).fn._fn): "map",  # noqa: SLF001
        _code_key(core.Filter(probe).fn._fn): "filter",  # noqa: SLF001 - Beam internal
    }


def wrapped_callable(dofn: Any) -> tuple[str, Callable[[Any], Any]] | None:
    """("map" or "filter", the user's callable) of a plain ``Map``/``Filter``, else None.

    Beam wraps the callable of ``Map(fn)`` as ``lambda x: [fn(x)]`` (``lambda x, *args,
    **kwargs: [fn(x, *args, **kwargs)]`` if ``fn`` takes more than the element) and of
    ``Filter(fn)`` as ``lambda x, *a, **k: [x] if fn(x, *a, **k) else []``: recognised by
    their code (the same Beam made them), the callable is the closure's ``fn``.
    """
    wrapper = getattr(dofn, "_fn", None)
    kind = _wrapper_codes().get(_code_key(wrapper))
    if kind is None or wrapper is None or wrapper.__closure__ is None:
        return None
    (cell,) = wrapper.__closure__
    return kind, cell.cell_contents


def dofn_signature(dofn: Any) -> Any:
    """Beam's ``DoFnSignature`` of ``dofn`` (its methods, their arguments and defaults)."""
    return runners_common.DoFnSignature(dofn)


def process_arguments(dofn: Any) -> tuple[list[str], list[Any]]:
    """The argument names and defaults of ``dofn``'s ``process``, as Beam's signature reads them.

    Without the rest of the signature, which inspects every attribute of the DoFn.
    """
    method = runners_common.MethodWrapper(dofn, "process")
    return method.args, method.defaults


def is_dofn_param(default: Any) -> bool:
    """Whether a ``process`` default is one of Beam's ``DoFn.*Param`` (instance or class).

    Any other default is a plain value: Beam's invoker passes it only when an extra
    argument fills its slot, so the call is ``process(element, *args, **kwargs)`` as
    without it (``runners.common._get_arg_placeholders``). ``FlatMap(str.split)``'s
    signature is ``str.split``'s: ``sep=None, maxsplit=-1``.
    """
    param = core._DoFnParam  # noqa: SLF001 - Beam internal: every DoFn.*Param is one
    return isinstance(default, param) or (isinstance(default, type) and issubclass(default, param))


def is_side_input_placeholder(argument: Any) -> bool:
    """Whether an extra argument of a ParDo stands for a side input (Beam's placeholder)."""
    return isinstance(argument, ArgumentPlaceholder)


def insert_side_input_values(
    args: tuple[Any, ...], kwargs: dict[str, Any], values: list[Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with ``values`` in their side-input placeholders, in order.

    Into the positional arguments' placeholders first, then the keyword arguments' by name,
    as Beam's ``PerWindowInvoker`` does (``internal.util.insert_values_in_args``).
    """
    new_args, new_kwargs = insert_values_in_args(args, kwargs, values)
    return tuple(new_args), new_kwargs


def state_backed_side_input_maps(
    payload: beam_runner_api_pb2.ParDoPayload,
    transform_id: str,
    descriptor: Any,
    context: PipelineContext,
) -> Callable[[Any], list[Any]]:
    """A ParDo's side-input maps, given a state handler, as Beam's bundle processor makes them.

    Beam's ``StateBackedSideInputMap`` per side input, in Beam's order (by side-input index).
    """
    transform = descriptor.transforms[transform_id]
    made = []
    for tag, side_input in payload.side_inputs.items():
        pcollection = descriptor.pcollections[transform.inputs[tag]]
        strategy = descriptor.windowing_strategies[pcollection.windowing_strategy_id]
        coder = coders.WindowedValueCoder(
            context.coders[pcollection.coder_id], context.coders[strategy.window_coder_id]
        )
        made.append((tag, pvalue.SideInputData.from_runner_api(side_input, context), coder))
    made.sort(key=lambda entry: sideinputs.get_sideinput_index(entry[0]))

    def make(state_handler: Any) -> list[Any]:
        return [
            bundle_processor.StateBackedSideInputMap(state_handler, transform_id, tag, data, coder)
            for tag, data, coder in made
        ]

    return make


def callable_combine_fn_function(combine_fn: Any) -> Any:
    """The callable of Beam's wrapper ``CombineFn`` of one (``CombinePerKey(sum)``), else None."""
    if isinstance(combine_fn, core.CallableWrapperCombineFn):
        return combine_fn._fn  # noqa: SLF001 - Beam internal
    return None


def processes_batches(dofn: Any, signature: Any) -> bool:
    """Whether a DoFn processes batches (``process_batch``, or a ``process`` yielding batches)."""
    return bool(
        getattr(dofn, "_process_batch_defined", False)
        or getattr(signature.process_method.method_value, "_beam_yields_batches", False)
    )


def is_globally_windowed_side_input(
    side_input: beam_runner_api_pb2.SideInput, context: PipelineContext
) -> bool:
    """Whether a side input is read for the global window whatever the main input's window.

    As Beam's ``StateBackedSideInputMap.is_globally_windowed`` tells it.
    """
    data = pvalue.SideInputData.from_runner_api(side_input, context)
    return bool(data.window_mapping_fn == sideinputs._global_window_mapping_fn)  # noqa: SLF001
