"""Makes ``--runner=SparkStructuredRunner`` resolvable by Beam without importing us.

Beam resolves runner names from a fixed table (``apache_beam.runners.runner._RUNNER_MAP``)
built when that module is imported. The ``beam_spark_runner_startup.pth`` file installed
into site-packages calls :func:`install` at interpreter start; it adds a meta-path finder
that waits for that one module to be imported and then adds our entry to the table. It
imports nothing heavy, so interpreter start-up stays fast for programs that never use Beam.

It also keeps Spark's Python processes from importing PySpark out of a zip file: see
:func:`prefer_installed_pyspark`.
"""

from __future__ import annotations

import os
import sys

# Every Python process of the environment runs this at start: import only what the
# interpreter has already loaded (not ``typing``); type checkers read the names below.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery
    import types
    from collections.abc import Callable, Sequence
    from typing import Any

_BEAM_RUNNER_MODULE = "apache_beam.runners.runner"
_BEAM_OPTIONS_MODULE = "apache_beam.options.pipeline_options"
RUNNER_SHORT_NAME = "sparkstructuredrunner"
RUNNER_QUALIFIED_NAME = "beam_spark_runner.runner.SparkStructuredRunner"


def register(module: types.ModuleType) -> None:
    """Adds our runner to Beam's runner-name table in ``module``."""
    runner_map = getattr(module, "_RUNNER_MAP", None)
    if isinstance(runner_map, dict):
        runner_map.setdefault(RUNNER_SHORT_NAME, RUNNER_QUALIFIED_NAME)


def register_options(module: types.ModuleType) -> None:
    """Defines our ``--spark_*`` options once Beam's options module exists.

    Beam parses every flag against the PipelineOptions subclasses defined so far and warns
    that it discards the others; defining ours right after Beam's module keeps
    ``--spark_master`` and friends known even when the user never imports us.
    """
    import beam_spark_runner.options  # noqa: F401


_AFTER_IMPORT = {_BEAM_RUNNER_MODULE: register, _BEAM_OPTIONS_MODULE: register_options}

# The module PySpark runs a streaming query's stateful-level "pre-init" as (``python -m``).
PRE_INIT_MODULE = "pyspark.sql.streaming.transform_with_state_driver_worker"


class _RegisteringLoader:
    """Delegates to Beam's real loader, then runs our registration step.

    A loader as ``importlib.abc.Loader`` describes one (``create_module``, ``exec_module``).
    """

    def __init__(self, wrapped: Any, after: Callable[[types.ModuleType], None]) -> None:
        self._wrapped = wrapped
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._wrapped.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._wrapped.exec_module(module)
        self._after(module)


class _RunnerTableFinder:
    """Finds nothing itself; wraps the loaders of Beam's runner and options modules.

    A meta path finder as ``importlib.abc.MetaPathFinder`` describes one (``find_spec``).
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        after = _AFTER_IMPORT.get(fullname)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                # The import system needs only these two methods (duck typed).
                spec.loader = _RegisteringLoader(spec.loader, after)  # type: ignore[assignment]
                return spec
        return None


def _installed_copy(entry: str) -> str | None:
    """The site directory holding the same package as ``entry``, one of Spark's zips.

    A pip-installed PySpark is its own ``SPARK_HOME``: ``<site>/pyspark/python/lib`` holds
    ``pyspark.zip`` and ``py4j-<version>-src.zip``, copies of ``<site>/pyspark`` and of the
    py4j release PySpark pins. Returns ``<site>`` when the package the zip holds is
    installed there (for py4j: that same version), else None.
    """
    lib, name = os.path.split(entry)
    python_dir, lib_name = os.path.split(lib)
    pyspark_dir, python_name = os.path.split(python_dir)
    site, pyspark_name = os.path.split(pyspark_dir)
    if (lib_name, python_name, pyspark_name) != ("lib", "python", "pyspark"):
        return None
    if name == "pyspark.zip":
        installed = os.path.isfile(os.path.join(pyspark_dir, "__init__.py"))
    elif name.startswith("py4j-") and name.endswith("-src.zip"):
        version = name[len("py4j-") : -len("-src.zip")]
        installed = os.path.isdir(os.path.join(site, f"py4j-{version}.dist-info"))
    else:
        return None
    return site if installed else None


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """Drops Spark's zips of PySpark and py4j from ``path`` where they are installed too.

    Spark puts ``pyspark.zip`` first on the ``PYTHONPATH`` of every Python process it
    starts (workers, daemons, a streaming query's state planners); Python writes no bytecode
    for a zip, so each process would compile PySpark's modules again. Where the very same
    files are installed (the zip lies inside the installed package, and the site directory
    is on ``path`` too), the installed copy, with its bytecode cache, is imported instead.
    Returns what was dropped.
    """
    dropped = []
    for entry in list(path):
        if entry.endswith(".zip"):
            site = _installed_copy(entry)
            if site is not None and site in path:
                path.remove(entry)
                dropped.append(entry)
    return dropped


def runs_module(argv: Sequence[str], module: str) -> bool:
    """Whether the command line ``argv`` (``sys.orig_argv``) is ``python ... -m module``."""
    for index, arg in enumerate(argv[1:-1], start=1):
        if arg == "-m":
            return argv[index + 1] == module
    return False


def silence_stdout() -> None:
    """Sends this process's standard output to ``os.devnull``, for the process's life."""
    if getattr(sys.stdout, "name", None) != os.devnull:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the process's life


def quiet_pre_init(argv: Sequence[str]) -> bool:
    """In a streaming query's pre-init process: its standard output goes nowhere.

    PySpark starts one such process per stateful level and query beside the driver and
    sends its standard output to the driver's console, where it would print "Starting
    Streaming TransformWithStateInPandas Python worker." and more: noise a Beam user cannot
    act on. Its real errors go to the JVM over its socket. Returns whether it silenced.
    """
    if runs_module(argv, PRE_INIT_MODULE):
        silence_stdout()
        return True
    return False


def pre_init_socket_path(jvm_pid: int) -> str:
    """The socket of the server forking the pre-inits of the driver JVM ``jvm_pid``.

    See ``streaming.pre_init_server``. In the temporary directory, named after the user and
    the JVM; in ``/tmp`` where that name would be too long for a Unix socket.
    """
    name = f"beam-spark-pre-init-{os.getuid()}-{jvm_pid}.sock"
    path = os.path.join(os.environ.get("TMPDIR") or "/tmp", name)
    return path if len(path) < 100 else os.path.join("/tmp", name)


def forked_pre_init(argv: Sequence[str]) -> None:
    """In a pre-init process: runs the pre-init in a fork of the driver's warm server.

    Where the driver runs one for this process's parent, the JVM (see
    ``streaming.pre_init_server``): this process hands over its environment, working
    directory and standard error, waits for the fork and exits with its exit code. Returns
    where there is no such server, or it declines: this process then runs the pre-init
    itself.
    """
    if not runs_module(argv, PRE_INIT_MODULE) or not hasattr(os, "getuid"):
        return
    path = pre_init_socket_path(os.getppid())
    try:
        if os.stat(path).st_uid != os.getuid():
            return
    except OSError:
        return
    import marshal
    import socket

    from beam_spark_runner.workers import handover

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        request = marshal.dumps((sys.executable, sys.version, os.getcwd(), dict(os.environ)))
        handover.send(conn, request, [2])
        if conn.recv(1) != b"S":
            conn.close()
            return
    except Exception:  # noqa: BLE001 - any failure to hand over: this process runs it
        conn.close()
        return
    code = b""
    try:
        while len(code) < 4:
            chunk = conn.recv(4 - len(code))
            if not chunk:
                break
            code += chunk
    except OSError:
        pass
    os._exit(int.from_bytes(code, "big", signed=True) if len(code) == 4 else 1)


def install() -> None:
    """Registers now for Beam modules already loaded, else when they are imported.

    Also prefers the installed PySpark to Spark's zip of it (:func:`prefer_installed_pyspark`)
    and silences a streaming query's pre-init processes (:func:`quiet_pre_init`), which run
    in a fork of the driver's pre-init server where one serves (:func:`forked_pre_init`).
    """
    prefer_installed_pyspark(sys.path)
    argv = getattr(sys, "orig_argv", ())
    quiet_pre_init(argv)
    forked_pre_init(argv)
    pending = False
    for name, after in _AFTER_IMPORT.items():
        loaded = sys.modules.get(name)
        if loaded is not None:
            after(loaded)
        else:
            pending = True
    if pending and not any(isinstance(f, _RunnerTableFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RunnerTableFinder())
