"""Beam's picklers: the process-wide library, the main session, the pickled-type caches."""

from __future__ import annotations

import functools
import gc
import logging
import os
from typing import Any, NamedTuple

from apache_beam.coders import coder_impl
from apache_beam.coders.coders import FastPrimitivesCoder, LengthPrefixCoder, PickleCoder
from apache_beam.internal import cloudpickle_pickler, pickler

_LOGGER = logging.getLogger(__name__)


def set_pickle_library(library: str) -> None:
    """Sets Beam's process-wide pickler (``--pickle_library``), as ``Pipeline`` does.

    It pickles DoFns, coders and windowing on the driver and unpickles them in workers.
    """
    pickler.set_library(library)


def dump_main_session(path: str) -> bytes:
    """The main session, pickled as Beam's stager does for ``--save_main_session``.

    With dill, the whole ``__main__`` module; with cloudpickle, Beam's registries (coders,
    logical types, schemas) only, since cloudpickle pickles ``__main__`` code by value.
    ``path`` is the scratch file Beam's pickler writes. Beam 2.69 and older write nothing
    with cloudpickle (their ``dump_session`` is a no-op): that session is empty bytes.
    """
    pickler.dump_session(path)
    if not os.path.exists(path):
        return b""
    with open(path, "rb") as file:
        return file.read()


def load_main_session(path: str) -> None:
    """Loads a main session in a worker, as Beam's SDK harness does (``sdk_worker_main``).

    An empty file (the session of a Beam whose cloudpickle ``dump_session`` wrote nothing)
    loads nothing.
    """
    if os.path.getsize(path) == 0:
        return
    pickler.load_session(path)


def cloudpickle_dumps(value: Any) -> bytes:
    """Pickles ``value`` with Beam's cloudpickle pickler, whatever ``--pickle_library`` is."""
    return cloudpickle_pickler.dumps(value)


def cloudpickle_loads(data: bytes) -> Any:
    """Unpickles bytes from :func:`cloudpickle_dumps`."""
    return cloudpickle_pickler.loads(data)


class _TypeCacheProbe(NamedTuple):
    """A type only :func:`type_pickle_caches` encodes, to find ``coder_impl``'s caches."""

    value: int


class _DropFallbackWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "_TypeCacheProbe" not in record.getMessage()


@functools.cache
def type_pickle_caches() -> tuple[dict[Any, bytes], dict[bytes, Any]] | None:
    """``coder_impl``'s process-wide caches of pickled "special types", or None if not found.

    A deterministic ``FastPrimitivesCoder`` (a GroupByKey's key coder) encodes a named
    tuple, dataclass, enum or proto by pickling its type, and caches the pickle by type
    (``_pickled_types``) and the type by pickle (``_unpickled_types``), whichever library
    pickled it: cloudpickle, or dill for ``--update_compatibility_version`` 2.67.0 and
    earlier. In the compiled ``coder_impl`` these dicts are C module variables, out of
    Python's reach: they are found as the dicts that hold a probe type after encoding and
    decoding one value of it. Searched once per process; the dicts never change identity.
    """
    pickled = getattr(coder_impl, "_pickled_types", None)
    unpickled = getattr(coder_impl, "_unpickled_types", None)
    if isinstance(pickled, dict) and isinstance(unpickled, dict):  # pure-Python coder_impl
        return pickled, unpickled
    impl = coder_impl.FastPrimitivesCoderImpl(
        PickleCoder().get_impl(), requires_deterministic_step_label="type_pickle_caches"
    )
    quiet = _DropFallbackWarning()
    coder_logger = logging.getLogger(coder_impl.__name__)
    coder_logger.addFilter(quiet)
    try:
        encoded = impl.encode(_TypeCacheProbe(0))
        impl.decode(encoded)
    except Exception:  # noqa: BLE001 - a Beam that encodes differently: report not found
        _LOGGER.debug("Could not encode the type-cache probe", exc_info=True)
        return None
    finally:
        coder_logger.removeFilter(quiet)
    holders = [r for r in gc.get_referrers(_TypeCacheProbe) if type(r) is dict]
    pickled_found = [
        d
        for d in holders
        if isinstance(d.get(_TypeCacheProbe), bytes) and d[_TypeCacheProbe] in encoded
    ]
    if len(pickled_found) != 1:
        return None
    type_pickle = pickled_found[0][_TypeCacheProbe]
    unpickled_found = [d for d in holders if d.get(type_pickle) is _TypeCacheProbe]
    if len(unpickled_found) != 1:
        return None
    return pickled_found[0], unpickled_found[0]


def pickles_values(value_coder: Any) -> bool:
    """Whether ``value_coder`` encodes a value as ``pickle`` does, but for Beam's types.

    Beam's ``PickleCoder``, and its ``FastPrimitivesCoder`` falling back to it (what a
    PCollection without a type hint gets): that one encodes Python's primitives and their
    containers itself, which decode to equal values, and pickles anything else; only its
    iterable-like types (Beam's lazy iterables, which all define ``__iter__``) decode to
    another type (a list). Also either behind a ``LengthPrefixCoder`` (as Beam's runners
    send a coder of the SDK's own over the data plane).
    """
    if type(value_coder) is LengthPrefixCoder:
        value_coder = value_coder.value_coder()
    kind = type(value_coder)
    if kind is PickleCoder:
        return True
    return kind is FastPrimitivesCoder and type(value_coder._fallback_coder) is PickleCoder
