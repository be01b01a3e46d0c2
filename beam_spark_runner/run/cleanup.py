"""What a streaming run leaves behind, removed: its temporary checkpoint, its sinks' old files.

* A query without ``--spark_checkpoint_location`` checkpoints into a temporary directory
  (``beam-spark-checkpoint-*``), removed once the query ends, however it ends: done, failed,
  cancelled, stopped, or the driver exiting. The tasks of a stopped query may still write
  for a moment, so the removal tries again until the directory stays gone. At exit, queries
  still running are stopped (their watchers given time to close the run), then the runner's
  own session, then the temporary checkpoints are removed.
* Beam's file sinks write into a temporary directory beside their output
  (``beam-temp-<name>-<uuid1>``), removed once the write is finalized. A driver killed
  before that leaves it behind, and its restart writes into new ones. When a query ends
  DONE, the runner removes its sinks' temporary directories made since the checkpoint was
  first started (a ``uuid1`` holds its creation time): those of the killed attempts.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from beam_spark_runner.spark import internals as spark_internals
from beam_spark_runner.spark.session import stop_owned_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOGGER = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "beam-spark-checkpoint-"
# How long a removal keeps trying while a stopped query's tasks still write.
_REMOVE_SECONDS = 5.0
# How long the exit waits for a stopped query's watcher to close its run.
_EXIT_WAIT_SECONDS = 30.0
# uuid1 times count 100 ns from 1582-10-15; this many before the Unix epoch.
_UUID1_EPOCH = 0x01B21DD213814000

_lock = threading.Lock()
# Temporary checkpoints made in this process (removed again at exit), and running queries.
_checkpoints: set[str] = set()
_running: dict[int, tuple[Callable[[], None], threading.Thread]] = {}
_registered = False


def _register_exit() -> None:
    global _registered
    if not _registered:
        # After the session module's handler was registered: this one runs first.
        atexit.register(_at_exit)
        _registered = True


def temporary_checkpoint() -> str:
    """A new temporary checkpoint directory, removed at exit if not before."""
    path = tempfile.mkdtemp(prefix=CHECKPOINT_PREFIX)
    with _lock:
        _checkpoints.add(path)
        _register_exit()
    return path


def remove_tree(path: str, seconds: float = _REMOVE_SECONDS) -> bool:
    """Removes ``path``, trying again while something still writes there; whether it is gone."""
    deadline = time.monotonic() + seconds
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return True
        if time.monotonic() > deadline:
            _LOGGER.warning("Could not remove the temporary checkpoint %s; remove it by hand", path)
            return False
        time.sleep(0.1)


def stop_at_exit(stop: Callable[[], None], watcher: threading.Thread) -> Callable[[], None]:
    """Has a running query stopped at exit, its watcher awaited; returns the undo."""
    key = id(watcher)
    with _lock:
        _running[key] = (stop, watcher)
        _register_exit()

    def undo() -> None:
        with _lock:
            _running.pop(key, None)

    return undo


def _at_exit() -> None:
    with _lock:
        running = list(_running.values())
        checkpoints = sorted(_checkpoints)
    for stop, watcher in running:
        try:
            stop()
        except Exception:  # noqa: BLE001 - the process is exiting; the rest must still run
            _LOGGER.debug("Stopping a query at exit failed", exc_info=True)
        watcher.join(_EXIT_WAIT_SECONDS)
    if not checkpoints:
        return
    # Spark's executors may still write checkpoint files until the session stops.
    stop_owned_session()
    for path in checkpoints:
        if os.path.exists(path):
            remove_tree(path, seconds=1.0)


def checkpoint_started(spark: SparkSession, location: str) -> float | None:
    """When the query of ``location`` first started (its metadata file's time), or None."""
    jvm = spark_internals.session_jvm(spark)
    if jvm is None:
        return None
    try:
        path = jvm.org.apache.hadoop.fs.Path(location, "metadata")
        fs = path.getFileSystem(spark_internals.hadoop_configuration(spark))
        if not fs.exists(path):
            return None
        return float(fs.getFileStatus(path).getModificationTime()) / 1000
    except Exception:  # noqa: BLE001 - then nothing counts as an earlier attempt's
        _LOGGER.debug("Cannot read when %s started", location, exc_info=True)
        return None


def created_at(name: str, prefix: str) -> float | None:
    """The creation time (epoch seconds) of a temporary directory named prefix + uuid1 hex."""
    if not name.startswith(prefix):
        return None
    try:
        made = uuid.UUID(hex=name[len(prefix) :])
    except ValueError:
        return None
    if made.version != 1:
        return None
    return (made.time - _UUID1_EPOCH) / 1e7


def _temp_dirs(prefix: str) -> list[str]:
    """The directories named ``prefix`` + something, on the prefix's file system."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.io.localfilesystem import LocalFileSystem

    directory, name = FileSystems.split(prefix)
    # Empty directories exist only on a local disk; matching lists files.
    if isinstance(FileSystems.get_filesystem(prefix), LocalFileSystem):
        if not os.path.isdir(directory):
            return []
        return [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith(name)]
    found = set()
    for metadata in FileSystems.match([f"{prefix}*/*"])[0].metadata_list:
        found.add(prefix + metadata.path[len(prefix) :].split("/")[0])
    return sorted(found)


def remove_abandoned_temp_dirs(prefixes: Iterable[str], since: float) -> list[str]:
    """Removes the sinks' temporary directories made at ``since`` or later; returns them.

    ``prefixes``: each sink's '<directory>/beam-temp-<name>-'.
    """
    from apache_beam.io.filesystems import FileSystems

    removed = []
    for prefix in prefixes:
        try:
            for path in _temp_dirs(prefix):
                made = created_at(FileSystems.split(path)[1], FileSystems.split(prefix)[1])
                if made is not None and made >= since:
                    FileSystems.delete([path])
                    removed.append(path)
        except Exception:  # noqa: BLE001 - a finished run stays finished
            _LOGGER.warning("Could not remove the temporary files under %s*", prefix, exc_info=True)
    if removed:
        _LOGGER.info("Removed temporary files of earlier, killed attempts: %s", ", ".join(removed))
    return removed
