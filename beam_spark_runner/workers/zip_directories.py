"""Zip archives on a worker's ``sys.path`` read once, not at every task.

Before each task PySpark 3.5 and 4.0 call ``importlib.invalidate_caches()``
(``pyspark.worker``'s include paths; PySpark 4.1 calls it only when they changed). For a
zip archive on ``sys.path`` that makes its ``zipimporter`` read the archive's whole
directory again; Spark 4.0 puts its ``spark-core`` jar there, thousands of entries, and
each Python task of a pipeline re-read it. :func:`remember_zip_directories` makes a ``zipimporter``
re-read its archive only when the file changed (its size, modification time or inode),
which is what the invalidation is for.
"""

from __future__ import annotations

import functools
import os
import sys
import zipimport
from typing import Any

_MARK = "_beam_spark_runner_remembered"
# On a zipimporter: its archive's identity when its directory was last read.
_READ = "_beam_spark_runner_read"


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns, status.st_ino


def remember_zip_directories() -> None:
    """Installs the remembering ``zipimporter.invalidate_caches`` (once per process).

    The archives of the importers already made are read again now, so that processes
    forked from this one (PySpark's daemon forks its workers) start with them remembered.
    """
    original = zipimport.zipimporter.invalidate_caches
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)  # also keeps Python's own as __wrapped__
    def invalidate_caches(self: Any) -> None:
        identity = _identity(self.archive)
        if identity is not None and getattr(self, _READ, None) == identity:
            return
        original(self)
        setattr(self, _READ, identity)

    setattr(invalidate_caches, _MARK, True)
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    for importer in list(sys.path_importer_cache.values()):
        if isinstance(importer, zipimport.zipimporter):
            importer.invalidate_caches()
