"""Python's cyclic garbage collector, paused around work that keeps many objects alive.

Work that builds many objects that live for a while (a batch of windowed values, a shard's
decoded keys) makes the collector walk them often although they are not garbage. Cyclic
garbage made meanwhile is collected once the collector is back on.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector is off inside (and back on after, if it was on before)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
