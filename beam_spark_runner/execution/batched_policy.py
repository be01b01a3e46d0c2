"""Which DoFns the batched path runs, and how Beam would call them (``execution.batched_plan``)."""

from __future__ import annotations

from typing import Any

from apache_beam.transforms import core

from beam_spark_runner import beam_internals as bi


def _batchable_params() -> dict[str, Any]:
    """What a DoFn may ask for besides its element for the batched path to run it, by name."""
    return {"timestamp": core.DoFn.TimestampParam, "window": core.DoFn.WindowParam}


def timestamp_window_params(dofn: Any) -> tuple[str, ...] | None:
    """The timestamp and window parameters ``dofn``'s ``process`` takes after its element.

    Where it takes nothing else (``DoFn.TimestampParam``, ``DoFn.WindowParam``):
    "timestamp" or "window" per parameter, in order; None for any other signature.

    Beam's ``PerWindowInvoker`` calls such a DoFn as ``process(element, timestamp or
    window, ...)``, once per window of the element where it takes its window
    (``has_windowed_inputs``), and handles its outputs as the ``SimpleInvoker``'s.
    """
    args, defaults = bi.process_arguments(dofn)
    if not defaults or len(args) != len(defaults) + 1:
        return None
    params = _batchable_params().items()
    names = []
    for default in defaults:
        name = next((name for name, param in params if param == default), None)
        if name is None:
            return None
        names.append(name)
    return tuple(names)


# Packages of Beam that hold user code Beam ships (its examples and benchmarks, such as
# Nexmark's DoFns), not its machinery: their DoFns are judged as a user's are.
_BEAM_USER_CODE_PACKAGES = ("apache_beam.examples.", "apache_beam.testing.benchmarks.")


def unbatchable_dofn_reason(dofn: Any, args: Any, kwargs: Any, side_inputs: int = 0) -> str | None:
    """Why the batched path cannot run ``dofn`` (None: it can).

    It can run Beam's ``CallableWrapperDoFn`` (Map, FlatMap, Filter, MapTuple,
    FlatMapTuple), with extra arguments that are plain values (``Map(fn, 3, k=v)``), and
    user DoFns whose ``process`` takes the element and, as keyword defaults, only
    ``TimestampParam`` or ``WindowParam``; both with their ``side_inputs`` (how many the
    ParDo has: the caller checks how they are read). Not with DoFn parameters passed as
    arguments, state, timers, restrictions, batched ``process_batch`` or lifecycle
    parameters. Beam's own other DoFns (and wrappers such as the runtime type check's)
    keep the bundle processor, except those of its examples and benchmarks (user code
    that Beam ships).
    """
    placeholder = bi.is_side_input_placeholder
    extra = [*args, *kwargs.values()]
    # Side inputs stand in the arguments as placeholders, one each.
    if sum(map(placeholder, extra)) != side_inputs:
        return "arguments the runner cannot tell from side inputs"
    plain = [a for a in extra if not placeholder(a)]
    if plain and type(dofn) is not core.CallableWrapperDoFn:
        return "a DoFn with extra arguments"
    if any(map(bi.is_dofn_param, plain)):
        return "DoFn parameters passed as arguments"
    positional_sides = sum(map(placeholder, args))
    if not isinstance(dofn, core.DoFn):
        return "not a DoFn"
    module = type(dofn).__module__
    if (
        type(dofn) is not core.CallableWrapperDoFn
        and module.startswith("apache_beam.")
        and not module.startswith(_BEAM_USER_CODE_PACKAGES)
    ):
        return f"Beam's own {type(dofn).__name__}"
    try:
        signature = bi.dofn_signature(dofn)
    except Exception as error:  # noqa: BLE001 - the bundle processor will say what is wrong
        return f"no signature ({error})"
    if signature.is_splittable_dofn() or signature.is_stateful_dofn():
        return "splittable or stateful"
    if bi.processes_batches(dofn, signature):
        return "processes batches"
    process = signature.process_method
    # Without extra arguments Beam calls process(element) whatever its signature: its
    # SimpleInvoker, or its PerWindowInvoker filling no plain default (``Map(float)``:
    # ``float(x=0, /)``). With them, their slots must be the ones after the element.
    if (
        extra
        and process.defaults
        and len(process.args) - len(process.defaults) != 1 + positional_sides
    ):
        return "process takes other arguments than the element (and its side inputs)"
    allowed = _batchable_params().values()
    # Unpickled parameters are copies: compare as Beam does (by the parameter's id).
    if any(bi.is_dofn_param(d) and not any(p == d for p in allowed) for d in process.defaults):
        return "process takes parameters other than timestamp and window"
    for method in (
        signature.setup_lifecycle_method,
        signature.start_bundle_method,
        signature.finish_bundle_method,
        signature.teardown_lifecycle_method,
    ):
        if method.args or method.defaults:
            return "a lifecycle method takes parameters"
    contexts = [
        getattr(signature, name, lambda: ())()
        for name in ("get_setup_contexts", "get_bundle_contexts")  # Beam 2.70+
    ]
    if any(any(found) for found in contexts):
        return "setup or bundle contexts"
    return None


def is_simple_callable(dofn: Any) -> bool:
    """Whether Beam calls ``dofn``'s ``process`` with the element and extra arguments alone.

    A Map/FlatMap/Filter whose callable takes only the element, or a user DoFn whose
    ``process`` has no defaults. Beam runs those with its ``SimpleInvoker``:
    ``process(element)``, each output with the input's timestamp, windows and pane unless
    it is a ``WindowedValue``, a ``TimestampedValue`` or a ``TaggedOutput``; with side
    inputs or extra arguments, its ``PerWindowInvoker``, which calls
    ``process(element, *arguments)`` (side inputs' values for the element's window in
    their placeholders) and outputs the same way for an element in one window. A callable
    with plain defaults (no ``DoFn.*Param``) gets the ``PerWindowInvoker`` too, which
    fills no plain default.
    """
    # The step's DoFnRunner has already built the signature, so a DoFn it refuses never
    # gets here.
    _, defaults = bi.process_arguments(dofn)
    if type(dofn) is core.CallableWrapperDoFn:
        return not any(map(bi.is_dofn_param, defaults))
    return not defaults
