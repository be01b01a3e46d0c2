"""How the batched path calls a step's function: its arguments bound once, as Beam passes them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from apache_beam.utils.windowed_value import WindowedValue

# Elements that go through the steps together.
CHUNK = 256


# ``params_of`` for the usual parameter lists: no name compared per element.
_DIRECT_PARAMS: dict[tuple[str, ...], Callable[[Any], tuple[Any, ...]]] = {
    ("timestamp",): lambda wv: (wv.timestamp,),
    ("window",): lambda wv: (wv.windows[0],),
    ("timestamp", "window"): lambda wv: (wv.timestamp, wv.windows[0]),
    ("window", "timestamp"): lambda wv: (wv.windows[0], wv.timestamp),
}


def params_of(params: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A windowed value's timestamp or (only) window per name in ``params``, in order.

    As Beam's invoker passes them (after ``per_window`` where a window is taken).
    """
    direct = _DIRECT_PARAMS.get(params)
    if direct is not None:
        return direct
    return lambda windowed_value: tuple(
        windowed_value.timestamp if name == "timestamp" else windowed_value.windows[0]
        for name in params
    )


def per_window(values: list[Any]) -> list[Any]:
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
            exploded.extend(WindowedValue(value, timestamp, (w,)) for w in windowed_value.windows)
    return exploded


ArgumentOrders = dict[tuple[int, tuple[str, ...]], tuple[str, ...] | None]


def with_arguments(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    orders: ArgumentOrders | None = None,
) -> Callable[[Any], Any]:
    """``fn`` called with the element, then the step's extra arguments (as Beam calls it).

    A call with ``**kwargs`` copies the dict for every element, one with ``*args`` a tuple,
    so keyword arguments that bind to ``fn``'s positional parameters go positionally
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
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
        bound = signature.bind(None, *range(count), **dict.fromkeys(names))
    except (TypeError, ValueError):
        return None
    if bound.kwargs or len(bound.args) != 1 + count + len(names):
        return None
    return tuple(list(bound.arguments)[1 + count :])
