"""Beam's process-wide state that belongs to one pipeline, set for each run.

Beam keeps some per-pipeline settings and caches in process globals. Beam's SDK harness
sets them up when a worker process starts for a job; ``Pipeline`` sets the pickler when a
pipeline is constructed. Spark's Python workers (and a long-lived driver) run one pipeline
after another, so whatever the last pipeline left there would apply to the next:

* the **pickler** (``--pickle_library``, Beam's ``pickler.set_library``), which pickles
  DoFns, coders and windowing on the driver and unpickles them in workers. Workers used to
  keep Beam's default (cloudpickle) whatever the pipeline chose, so a ``--pickle_library=dill``
  pipeline's lambdas did not unpickle;
* ``coder_impl``'s caches of pickled **special types** (named tuples, dataclasses, enums,
  protos) that a deterministic ``FastPrimitivesCoder`` (a GroupByKey's key coder) writes
  into the key's bytes. The cache is keyed by type only, whichever library pickled it:
  after one pipeline encoded a type with cloudpickle (Beam's default), a pipeline with
  ``--update_compatibility_version=2.66.0`` (whose keys pickle types with dill) wrote the
  cached cloudpickle bytes in that worker process and dill's in a process that had not seen
  the type. One key then had two encodings: GroupByKey split it into two groups, or a worker
  decoding the key with dill failed on cloudpickle's bytes ("Error decoding input stream
  with coder LengthPrefixCoder[DeterministicFastPrimitivesCoder] in step GBK/Read").

The driver applies the pipeline's settings (:func:`apply`) before it pickles and plans the
pipeline; each Spark task applies its run's settings (:func:`enter_run`) the first time its
worker process runs a task of that run. Both empty the type caches, so a run encodes types
as a fresh process would, like Beam's harness starting for a job. Both also install
:func:`~beam_spark_runner.beam_internals.cache_function_signatures` (once per process):
Beam's inspection of DoFn signatures, remembered per function, which is exact.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from apache_beam.options.pipeline_options import SetupOptions

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.execution import main_session
from beam_spark_runner.workers.zip_directories import remember_zip_directories

_LOGGER = logging.getLogger(__name__)

DEFAULT_PICKLE_LIBRARY = "default"

_lock = threading.Lock()
_current_run: str | None = None
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
    with _lock:
        bi.cache_function_signatures()
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
        bi.cache_function_signatures()
        # Local workers have it from the runner's daemon; a cluster's, from their first run.
        remember_zip_directories()
        bi.set_pickle_library(library)
        reset_type_pickle_caches()
        if saved_main_session is not None:
            main_session.restore(saved_main_session.value)
        _current_run = run_id
