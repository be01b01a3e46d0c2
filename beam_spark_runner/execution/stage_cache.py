"""The stage workers a Python worker process keeps, and when their DoFns are torn down.

A process keeps each stage's worker across tasks (its descriptors and DoFn instances), at
most ``_MAX_CACHED_STAGES``; a run's workers go when a stage of another run starts, and a
background thread tears idle DoFns down (``IDLE_TEARDOWN_SECONDS``).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution.stage_processor import StageWorker
from beam_spark_runner.execution.stage_spec import IDLE_TEARDOWN_SECONDS, StageSpec

_LOGGER = logging.getLogger(__name__)

# Worker processes keep this many stage workers (descriptors, DoFn instances) alive.
_MAX_CACHED_STAGES = 64
_WORKERS: collections.OrderedDict[str, StageWorker] = collections.OrderedDict()

_IDLE_POLL_SECONDS = 1.0


@dataclasses.dataclass
class _Lifecycle:
    """Per-process state of the teardown machinery (see :func:`stage_worker`)."""

    # The process that started the idle thread and exit hook; a forked child starts its own.
    pid: int | None = None
    # A threading.Lock guarding _WORKERS and last_used against the idle thread.
    lock: Any = None
    # time.time() of the last stage_worker() call (Beam's bundle times are time.time() too).
    last_used: float = 0.0


_LIFECYCLE = _Lifecycle()


def _lifecycle_lock() -> Any:
    """The lock guarding ``_WORKERS``; starts the idle thread and exit hook once per process.

    The task thread creates the lock (in stage_worker) before it starts the idle thread, so
    no other thread can race the creation. Not done at import: PySpark's daemon imports this
    module before it forks the workers, and a fork copies no threads.
    """
    if _LIFECYCLE.pid != os.getpid():
        _LIFECYCLE.pid = os.getpid()
        _LIFECYCLE.lock = threading.Lock()
        atexit.register(tear_down_stage_workers)
        threading.Thread(
            target=_tear_down_idle_forever, name="beam-spark-dofn-teardown", daemon=True
        ).start()
    return _LIFECYCLE.lock


def _shut_down(workers: Iterable[StageWorker], why: str) -> None:
    """Tears down every DoFn of ``workers``; an error is logged, never raised."""
    for worker in workers:
        _LOGGER.debug("Tearing down stage %s (%s)", worker.spec.display_name, why)
        try:
            worker.worker.bundle_processor_cache.shutdown()
            batched = getattr(worker, "batched", None)
            if batched is not None:
                batched.tear_down(why)
        except Exception:  # noqa: BLE001 - a teardown error must not fail other work
            _LOGGER.exception("Teardown of stage %s failed", worker.spec.display_name)


def tear_down_stage_workers() -> None:
    """Tears down and forgets every stage worker of this process (at exit, or on demand)."""
    with _lifecycle_lock():
        workers = list(_WORKERS.values())
        _WORKERS.clear()
    _shut_down(workers, "process exit")


def tear_down_idle_dofns(now: float, idle_seconds: float | None = None) -> int:
    """Tears down the DoFns of this process if it has run no bundle for ``idle_seconds``.

    By default, the longest ``idle_teardown_seconds`` of the cached stage workers' specs
    (a process runs one pipeline's stages at a time: the run's own setting).

    Only bundle processors waiting in Beam's cache are torn down: one running a bundle is
    never touched, and a bundle starting meanwhile takes a processor from the cache (an
    atomic pop) or builds a new one. The stage workers stay cached. Returns how many bundle
    processors (each holding one instance of each DoFn of its stage) were torn down.
    """
    with _lifecycle_lock():
        stages = [(w.worker.bundle_processor_cache, w.spec.display_name) for w in _WORKERS.values()]
        batched = [b for w in _WORKERS.values() if (b := getattr(w, "batched", None)) is not None]
        last_used = _LIFECYCLE.last_used
        if idle_seconds is None:
            idle_seconds = max(
                (w.spec.idle_teardown_seconds for w in _WORKERS.values()),
                default=IDLE_TEARDOWN_SECONDS,
            )
    caches = [cache for cache, _ in stages]
    if any(bi.bundle_processors_busy(c) for c in caches):
        return 0
    bundle_times = [t for c in caches for t in list(c.last_access_times.values())]
    batch_times = [b.last_used for b in batched]
    if now - max([last_used, *bundle_times, *batch_times]) < idle_seconds:
        return 0
    torn_down = sum(b.tear_down_if_idle(now, idle_seconds) for b in batched)
    for cache, name in stages:
        for processors in list(cache.cached_bundle_processors.values()):
            while processors:
                try:
                    processor = processors.pop()
                except IndexError:  # the task thread took it meanwhile
                    break
                torn_down += 1
                try:
                    processor.shutdown()
                except Exception:  # noqa: BLE001 - logged; the other processors still go
                    _LOGGER.exception("Teardown of an idle bundle processor of %s failed", name)
    if torn_down:
        _LOGGER.debug("Tore down %d idle bundle processors", torn_down)
    return torn_down


def _tear_down_idle_forever() -> None:
    while True:
        time.sleep(_IDLE_POLL_SECONDS)
        try:
            tear_down_idle_dofns(time.time())
        except Exception:  # noqa: BLE001 - keep the thread alive; the next poll retries
            _LOGGER.exception("Tearing down idle DoFns failed")


def stage_worker(spec: StageSpec) -> StageWorker:
    """The worker for ``spec`` in this process, built on first use.

    Workers of other pipeline runs are torn down first (their DoFns' ``teardown`` runs):
    a process runs one pipeline's stages at a time, and an old run's DoFns never run again.
    Least recently used workers beyond ``_MAX_CACHED_STAGES`` are torn down too.
    """
    lock = _lifecycle_lock()
    with lock:
        _LIFECYCLE.last_used = time.time()
        other_runs = [
            key
            for key, w in _WORKERS.items()
            if w.spec.environment.run_id != spec.environment.run_id
        ]
        retired = [_WORKERS.pop(key) for key in other_runs]
    _shut_down(retired, f"a stage of run {spec.environment.run_id} started")
    # Beam's per-pipeline globals (pickler, pickled-type caches), before unpickling anything.
    spec.environment.enter()
    with lock:
        worker = _WORKERS.get(spec.cache_key)
        evicted: list[StageWorker] = []
        if worker is None:
            worker = StageWorker(spec)
            _WORKERS[spec.cache_key] = worker
            while len(_WORKERS) > _MAX_CACHED_STAGES:
                evicted.append(_WORKERS.popitem(last=False)[1])
        else:
            _WORKERS.move_to_end(spec.cache_key)
    _shut_down(evicted, "evicted from the stage worker cache")
    return worker
