"""Python's cyclic garbage collector, paused around work that keeps many objects alive.

The collector runs every 700 net container allocations, and every so often over the whole
heap (a worker's heap holds Beam, PySpark and pyarrow: ~150 000 objects). Work that builds
many objects that live for a while (a batch of windowed values, a shard's decoded keys)
makes it run often over objects that are not garbage; measured, that was a third to half
of such work's CPU. Cyclic garbage made meanwhile is collected once the collector is back.
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
