"""Makes ``--runner=SparkStructuredRunner`` resolvable by Beam without importing us.

Beam resolves runner names from a fixed table (``apache_beam.runners.runner._RUNNER_MAP``)
built when that module is imported. The ``beam_spark_runner_startup.pth`` file installed
into site-packages calls :func:`install` at interpreter start; it adds a meta-path finder
that waits for that one module to be imported and then adds our entry to the table. It
imports nothing heavy, so interpreter start-up stays fast for programs that never use Beam.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

_BEAM_RUNNER_MODULE = "apache_beam.runners.runner"
RUNNER_SHORT_NAME = "sparkstructuredrunner"
RUNNER_QUALIFIED_NAME = "beam_spark_runner.runner.SparkStructuredRunner"


def register(module: types.ModuleType) -> None:
    """Adds our runner to Beam's runner-name table in ``module``."""
    runner_map = getattr(module, "_RUNNER_MAP", None)
    if isinstance(runner_map, dict):
        runner_map.setdefault(RUNNER_SHORT_NAME, RUNNER_QUALIFIED_NAME)


class _RegisteringLoader(importlib.abc.Loader):
    """Delegates to Beam's real loader, then registers our runner name."""

    def __init__(self, wrapped: importlib.abc.Loader) -> None:
        self._wrapped = wrapped

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._wrapped.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._wrapped.exec_module(module)
        register(module)


class _RunnerTableFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of Beam's runner module."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _BEAM_RUNNER_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Registers now if Beam's runner module is loaded, else when it is imported."""
    loaded = sys.modules.get(_BEAM_RUNNER_MODULE)
    if loaded is not None:
        register(loaded)
        return
    if not any(isinstance(f, _RunnerTableFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RunnerTableFinder())
