"""Beam's process-wide state that belongs to one pipeline, set for each run.

Beam keeps per-pipeline settings and caches in process globals, and Spark's Python workers
(and a long-lived driver) run one pipeline after another, so whatever the last pipeline
left there would apply to the next: the **pickler** (``--pickle_library``), and
``coder_impl``'s caches of pickled **special types** (named tuples, dataclasses, enums,
protos), keyed by type whichever library pickled them, so one grouping key could get two
encodings across pipelines. The driver applies a pipeline's settings (:func:`apply`)
before it pickles and plans it; a worker applies its run's (:func:`enter_run`) the first
time it runs a task of that run. Both empty the type caches, as a fresh process would.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from apache_beam.options.pipeline_options import SetupOptions

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import main_session
from beam_spark_runner.workers.zip_directories import remember_zip_directories

_LOGGER = logging.getLogger(__name__)

DEFAULT_PICKLE_LIBRARY = "default"

_lock = threading.Lock()
_current_run: str | None = None
# The process that runs pipelines (the user's): its Beam functions are patched only while
# a run is in it, never for the process's life.
_driver_pid: int | None = None
_warned_caches_not_found = False


def pickle_library(options: Any) -> str:
    """The pickler a pipeline's options choose (``--pickle_library``)."""
    return options.view_as(SetupOptions).pickle_library or DEFAULT_PICKLE_LIBRARY


def reset_type_pickle_caches() -> bool:
    """Empties Beam's caches of pickled special types; False if they could not be found."""
    global _warned_caches_not_found
    caches = bi.type_pickle_caches()
    if caches is None:
        if not _warned_caches_not_found:
            _warned_caches_not_found = True
            _LOGGER.warning(
                "Could not find Beam's cache of pickled types (coder_impl): a grouping key "
                "holding a named tuple, dataclass, enum or proto may encode differently "
                "after another pipeline with a different --pickle_library or "
                "--update_compatibility_version ran in the same process."
            )
        return False
    for cache in caches:
        cache.clear()
    return True


def apply(library: str) -> None:
    """Makes this process's Beam globals those of the pipeline about to run (driver)."""
    global _driver_pid
    with _lock:
        _driver_pid = os.getpid()
        bi.set_pickle_library(library)
        reset_type_pickle_caches()


def enter_run(run_id: str, library: str, saved_main_session: Any = None) -> None:
    """In a worker: the first time this process runs a task of ``run_id``, apply its globals.

    A worker process runs one task at a time; tasks of one run share the globals, so the
    caches fill once per run and process. ``saved_main_session`` is a Spark broadcast of the
    run's :class:`~beam_spark_runner.execution.main_session.MainSession` (``--save_main_session``),
    restored into this process's ``__main__`` before anything of the run is unpickled.
    """
    global _current_run
    with _lock:
        if run_id == _current_run:
            return
        if os.getpid() != _driver_pid:  # the driver has them while it runs (signature_memos)
            bi.cache_function_signatures()
            bi.shared_keys_per_task(task_partition_key)
        # Local workers have it from the runner's daemon; a cluster's, from their first run.
        remember_zip_directories()
        bi.set_pickle_library(library)
        reset_type_pickle_caches()
        if saved_main_session is not None:
            main_session.restore(saved_main_session.value)
        _current_run = run_id


def task_partition_key() -> str | None:
    """The running Spark task's partition as a key; None outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else f"spark-partition-{context.partitionId()}"


@dataclass(frozen=True)
class TaskEnvironment:
    """What every task of a run applies first in its worker process: the run's globals.

    One object in each spec a task receives, applied once per run and process.
    """

    run_id: str
    # The pipeline's --pickle_library: workers unpickle its DoFns and coders with it.
    pickle_library: str = DEFAULT_PICKLE_LIBRARY
    # The run's main session (--save_main_session): a Spark broadcast or an inline value.
    main_session: Any = None

    def enter(self) -> None:
        """Applies the run's globals in this process, the first time a task of it runs."""
        enter_run(self.run_id, self.pickle_library, self.main_session)
