"""The SparkSession the runner uses: an active one, or an embedded one it owns.

* An already active session (spark-submit, a notebook, a test fixture) is used as is and
  never stopped by the runner. ``--spark_master`` and ``--spark_conf`` cannot change it.
* Otherwise the runner creates one (``--spark_master``, default ``local[*]``) and keeps it
  for later pipelines in the same process, since starting Spark takes seconds. It stops
  it when the process exits, or when a later pipeline asks for a different master.

Before creating a session it checks for Java, so a machine without it gets a clear message
rather than a py4j traceback.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from beam_spark_runner.options import DEFAULT_MASTER, SparkSettings
from beam_spark_runner.spark import class_archive, driver_jvm, jars, java
from beam_spark_runner.spark import compat as spark_compat
from beam_spark_runner.spark.java import check_java, required_java_major
from beam_spark_runner.spark.master import check_master_reachable
from beam_spark_runner.workers import warmup as worker_warmup
from beam_spark_runner.workers import zygote as worker_zygote

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

_LOGGER = logging.getLogger(__name__)

_lock = threading.Lock()
_owned: SparkSession | None = None
_owned_settings: SparkSettings | None = None
_shipped_package: str | None = None


def is_local_master(master: str) -> bool:
    """True for masters whose executors run on this machine."""
    return master.startswith("local")


def _package_zip() -> str:
    """A zip of this package, shipped to executors of remote clusters once per process."""
    global _shipped_package
    if _shipped_package is None:
        root = Path(__file__).resolve().parent.parent
        handle, path = tempfile.mkstemp(prefix="beam_spark_runner-", suffix=".zip")
        os.close(handle)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in root.rglob("*.py"):
                archive.write(file, Path(root.name) / file.relative_to(root))
        _shipped_package = path
    return _shipped_package


def _configured_master() -> str | None:
    """The master spark-submit chose, when this driver was launched by spark-submit.

    spark-submit starts the JVM first and passes its port in ``PYSPARK_GATEWAY_PORT``; its
    configuration (``--master`` included) is readable only once PySpark has connected to
    that JVM. Outside spark-submit the JVM must not start early: the builder's
    ``--spark_conf`` values (driver memory, ...) apply only when it starts.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects; creates no context
    return SparkConf().get("spark.master", None)


JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
ADAPTIVE_EXECUTION = "spark.sql.adaptive.enabled"

# C1 only: a local driver JVM just moves Arrow batches, where C2 costs more than it saves.
# Not for a session started for a streaming query, which runs the same code for as long as
# it runs: there C2's compilation is paid once and its code takes a third of C1's CPU time
# per event (docs/performance.md). (The user's spark.driver.extraJavaOptions come after:
# -XX:TieredStopAtLevel=4 restores C2, =1 keeps C1 only.)
LOCAL_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

# A local driver JVM is the whole cluster (it caches stage outputs too): Spark's 1 GiB
# default ran out, so a quarter of the machine's memory within these bounds.
LOCAL_DRIVER_MEMORY_MIN_MIB = 1024
LOCAL_DRIVER_MEMORY_MAX_MIB = 8192


def local_driver_memory() -> str:
    """The driver heap of a local session the runner starts (``spark.driver.memory``)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (e.g. Windows)
        return f"{LOCAL_DRIVER_MEMORY_MIN_MIB}m"
    quarter_mib = physical // 4 // (1 << 20)
    mib = max(LOCAL_DRIVER_MEMORY_MIN_MIB, min(LOCAL_DRIVER_MEMORY_MAX_MIB, quarter_mib))
    return f"{mib}m"


# At the default --spark_log_level (WARN), the driver JVM of a session the runner starts
# logs with this profile: Spark's default without the start-up lines every run prints
# (loopback address, SparkUI port retries, native-hadoop library) and without the three
# copies of a failing task's traceback, which the runner reports once itself.
QUIET_LOG4J_PROFILE = Path(__file__).resolve().parent / "log4j2-quiet.properties"
QUIET_LOG_LEVEL = "WARN"


def _driver_java_options(master: str, settings: SparkSettings, streaming: bool) -> str:
    options = [LOCAL_DRIVER_JAVA_OPTIONS] if is_local_master(master) and not streaming else []
    if settings.log_level == QUIET_LOG_LEVEL:
        options.append(f"-Dlog4j2.configurationFile={QUIET_LOG4J_PROFILE.as_uri()}")
    return " ".join(options)


def session_conf(master: str, settings: SparkSettings, streaming: bool = False) -> dict[str, str]:
    """The Spark settings of a session the runner creates for ``master``.

    ``streaming``: the session is started for a streaming query (its JVM compiles with C2).
    """
    conf: dict[str, str] = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    java_options = _driver_java_options(master, settings, streaming)
    if java_options:
        conf[JAVA_OPTIONS] = java_options
    if is_local_master(master):
        # Workers forked from a daemon that already imported Beam start in milliseconds
        # instead of seconds (see worker_daemon). Remote executors may not have this
        # package installed before tasks ship it, so only local sessions use it.
        conf[worker_warmup.DAEMON_CONF] = worker_warmup.DAEMON_MODULE
        conf["spark.driver.memory"] = local_driver_memory()
    # Adaptive execution merges shuffle partitions smaller than 1 MiB into one task, a
    # good trade for rows Spark itself processes. A Beam stage spends its time in Python
    # per element (a lifted combine's merge, a GroupByKey's grouping), so a small
    # shuffle can still be seconds of work: keep it spread over every core.
    conf["spark.sql.adaptive.coalescePartitions.enabled"] = "false"
    # Adaptive execution makes each shuffle's map side a job of its own and has nothing to
    # act on in a Beam plan (no joins): off, a pipeline is one Spark job.
    conf[ADAPTIVE_EXECUTION] = "false"
    if spark_compat.has_unix_domain_sockets():
        # Over loopback TCP Nagle's algorithm holds a task's first rows until the worker's
        # delayed acknowledgement of its command; a Unix domain socket has neither.
        conf[spark_compat.UNIX_DOMAIN_SOCKETS] = "true"
    if spark_compat.has_dataframe_debugging():
        # The call sites would name the runner's translators, not the user's code, and
        # recording them costs Py4J calls per Column.
        conf[spark_compat.DATAFRAME_DEBUGGING] = "false"
    if settings.default_parallelism:
        conf["spark.default.parallelism"] = str(settings.default_parallelism)
        conf["spark.sql.shuffle.partitions"] = str(settings.default_parallelism)
    conf.update(settings.conf)
    if is_local_master(master):
        # A streaming query's checkpoint on the local disk without a `chmod` process per
        # file (streaming.checkpoint_files). Local only: a cluster's executors would need
        # the jar on their class path too.
        conf.update(jars.session_settings(conf, java.spark_conf_directory(java.spark_home())))
    return conf


def local_cores(master: str) -> int:
    """The cores a ``local``, ``local[N]``, ``local[N,F]`` or ``local[*]`` master runs tasks on."""
    if not is_local_master(master) or master.startswith("local-cluster"):
        raise ValueError(f"{master!r} is not a local[N] master: its cores are the cluster's")
    inside = master[len("local[") : -1] if master.startswith("local[") else "1"
    cores = inside.split(",")[0].strip()
    if cores == "*":
        return os.cpu_count() or 1
    return int(cores)


def local_session_conf(master: str, settings: SparkSettings) -> dict[str, str]:
    """Every setting a local session the runner creates for ``master`` runs with.

    ``session_conf``, plus the shuffle partitions ``_build_session`` sets once the session
    has started (one per core) unless ``settings`` chose them: for starting another session
    as the runner starts its own (the benchmarks' hand-written peers). Not the class
    archive's JVM options (they change how fast the JVM starts, nothing else) nor the SQL
    settings a Beam plan's jobs run with (``INTERPRETED_SQL``: not a user's SQL).
    """
    conf = session_conf(master, settings)
    conf.setdefault("spark.sql.shuffle.partitions", str(local_cores(master)))
    return conf


# A Beam plan's JVM side only moves and sorts binary columns: compiling generated code per
# query shape costs more than it saves, so its SQL operators run interpreted (not a user's SQL).
WHOLE_STAGE_CODEGEN = "spark.sql.codegen.wholeStage"
CODEGEN_FACTORY_MODE = "spark.sql.codegen.factoryMode"
INTERPRETED_SQL = {WHOLE_STAGE_CODEGEN: "false", CODEGEN_FACTORY_MODE: "NO_CODEGEN"}


def interpreted_sql_settings(settings: SparkSettings, owned: bool) -> dict[str, str]:
    """``INTERPRETED_SQL`` for a Beam plan, on a session the runner created (``owned``).

    Without the settings the user chose in ``settings.conf`` (--spark_conf).
    """
    if not owned:
        return {}
    return {k: v for k, v in INTERPRETED_SQL.items() if k not in settings.conf}


@contextlib.contextmanager
def settings_within(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Within: ``settings`` on ``spark``; the session's own values come back on the way out.

    A streaming query started within keeps them for its life: it runs on a copy of its
    session's settings made when it starts. Nothing comes back once the driver JVM has
    ended (the error in flight says how it ended).
    """
    conf = spark.conf
    before = {key: conf.get(key, None) for key in settings}
    for key, value in settings.items():
        conf.set(key, value)
    try:
        yield
    finally:
        if driver_jvm.running():
            for key, previous in before.items():
                if previous is None:
                    conf.unset(key)
                else:
                    conf.set(key, previous)


@contextlib.contextmanager
def interpreted_sql(spark: SparkSession, settings: SparkSettings, owned: bool) -> Iterator[None]:
    """Within: ``interpreted_sql_settings`` on ``spark``, for a batch pipeline's job.

    Settings named in ``settings.conf`` (--spark_conf) are not touched, nor is a session
    the runner did not create. The session's own values come back on the way out. Spark
    reads them when it plans and runs the job, so a batch pipeline's DataFrames must be
    executed within; a query another thread plans meanwhile gets them too (the results
    are the same either way: only how Spark evaluates its own operators differs).
    """
    with settings_within(spark, interpreted_sql_settings(settings, owned)):
        yield


LOOPBACK = "127.0.0.1"
_ADDRESS_SETTINGS = ("spark.driver.bindAddress", "spark.driver.host")


def bind_to_loopback(conf: dict[str, str]) -> bool:
    """Keeps an embedded (local) session's driver and UI on the loopback interface.

    Spark binds its UI to every interface unless ``SPARK_LOCAL_IP`` says otherwise, and a
    laptop's UI then shows the job to its whole network. Unless the user chose an address
    (``SPARK_LOCAL_IP``, or ``spark.driver.bindAddress``/``spark.driver.host`` through
    ``--spark_conf``), the driver's JVM starts with ``SPARK_LOCAL_IP=127.0.0.1``. Returns
    whether it did.
    """
    if os.environ.get("SPARK_LOCAL_IP") or any(key in conf for key in _ADDRESS_SETTINGS):
        return False
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    return True


def with_class_archive(conf: dict[str, str], settings: SparkSettings, java_version: str) -> None:
    """Adds the driver JVM's class archive options (``class_archive``) to a session's settings.

    Not with ``--spark_class_archive=off``, before Java 13, when this process's JVM
    already runs (its options are set), when the user's ``--spark_conf`` sets the JVM's
    default options (theirs replace the runner's), or when the class path has a directory
    Java cannot archive past (``class_archive.class_path_directory``).
    """
    if not settings.class_archive or JAVA_OPTIONS in settings.conf or _jvm_started():
        return
    executable = java.java_executable()
    if executable is None or java.java_major(java_version) < class_archive.CLASS_ARCHIVE_MIN_JAVA:
        return
    spark = java.spark_home()
    directory = class_archive.class_path_directory(spark, conf)
    if directory is not None:
        _LOGGER.info(
            "No class archive for the driver JVM: its class path has the directory %s with "
            "files in it before other entries, and Java archives no classes past one. Spark "
            "puts SPARK_CONF_DIR there; a session starts in about twice the time without.",
            directory,
        )
        return
    key = class_archive.class_archive_key(executable, spark, conf)
    options = class_archive.class_archive_options(
        class_archive.class_archive_directory(), key, spark
    )
    if options:
        conf[JAVA_OPTIONS] = " ".join([conf.get(JAVA_OPTIONS, ""), *options]).strip()


def _jvm_started() -> bool:
    """Whether this process's driver JVM is already up (spark-submit's, or a stopped session's)."""
    from pyspark import SparkContext

    return "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._gateway is not None


def without_mllib_session_functions(conf: dict[str, str]) -> bool:
    """Keeps MLlib's session functions (``spark_compat.MLLIB_FUNCTIONS_PROVIDER``) out.

    Adds ``spark_compat.SESSION_EXTENSIONS_FROM_CLASS_PATH=false`` to a session's settings
    when that provider is the only one on the driver JVM's class path, unless the user chose
    the setting (``--spark_conf``, spark-submit or spark-defaults.conf). The JVM must be up.
    Returns whether it did.
    """
    from pyspark import SparkConf, SparkContext

    key = spark_compat.SESSION_EXTENSIONS_FROM_CLASS_PATH
    if key in conf or SparkConf().contains(key):
        return False
    jvm = SparkContext._jvm  # PySpark's view of the driver JVM
    providers = spark_compat.session_extension_providers(jvm)
    if set(providers) != {spark_compat.MLLIB_FUNCTIONS_PROVIDER}:
        return False
    _LOGGER.debug("Not loading %s (Spark Connect's ML functions) in this session", providers[0])
    conf[key] = "false"
    return True


def _start(master: str, settings: SparkSettings, conf: dict[str, str]) -> SparkSession:
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    if worker_warmup.applies(conf) and not _jvm_started():
        # Just before the JVM: the worker daemon it launches is forked from this process.
        worker_zygote.start(tempfile.gettempdir())
    # The JVM first, with the session's settings, to see its class path before the session.
    launch = SparkConf().setMaster(master).setAppName(settings.app_name)
    try:
        SparkContext._ensure_initialized(conf=launch.setAll(list(conf.items())))
    except BaseException:
        worker_zygote.stop()
        raise
    finally:
        worker_zygote.withdraw()
    without_mllib_session_functions(conf)
    if worker_warmup.applies(conf):
        # The context first, so that its Python workers start while the SQL session does
        # (the builder below takes this context).
        spark_conf = SparkConf().setMaster(master).setAppName(settings.app_name)
        context = SparkContext.getOrCreate(spark_conf.setAll(list(conf.items())))
        worker_environment(context)
        worker_warmup.start(context)
    builder = SparkSession.builder.master(master).appName(settings.app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _build_session(settings: SparkSettings, streaming: bool = False) -> SparkSession:
    java_version = check_java(required_java_major())
    master = settings.master or _configured_master() or DEFAULT_MASTER
    check_master_reachable(master)
    if is_local_master(master):
        bind_to_loopback(settings.conf)
    if is_local_master(master) and not os.environ.get("PYSPARK_PYTHON"):
        # Local executors' Python workers must see the driver's packages (Beam, pyarrow,
        # this runner). PySpark takes the worker interpreter from this variable only.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    conf = session_conf(master, settings, streaming)
    with_class_archive(conf, settings, java_version)
    _LOGGER.info("Starting a Spark session (master %s, app %s)", master, settings.app_name)
    try:
        session = _start(master, settings, conf)
    except Exception:
        archive = class_archive.archive_in(conf.get(JAVA_OPTIONS, ""))
        if archive is None:
            raise
        # A JVM that cannot map its archive ignores it; one that crashed on it (a file
        # damaged after it was written) must not stop every later session from starting.
        _LOGGER.warning(
            "The driver JVM failed to start from its class archive %s; removing the archive "
            "and starting without it",
            archive,
            exc_info=True,
        )
        class_archive.discard_class_archive(archive)
        conf[JAVA_OPTIONS] = class_archive.without_class_archive(conf[JAVA_OPTIONS])
        session = _start(master, settings, conf)
    session.sparkContext.setLogLevel(settings.log_level)
    if "spark.sql.shuffle.partitions" not in conf:
        # Spark's default of 200 shuffle partitions is far too many on a laptop or a
        # small cluster; use the cluster's parallelism unless the user chose.
        session.conf.set(
            "spark.sql.shuffle.partitions", str(session.sparkContext.defaultParallelism)
        )
    if not is_local_master(master):
        session.sparkContext.addPyFile(_package_zip())
    return session


def share_driver_path(session: SparkSession) -> None:
    """Lets local executors import what the driver can: its ``sys.path`` directories.

    Beam pickles module-level user functions and classes by reference, so a Python worker
    must be able to import the user's modules (a pipeline module beside the script, a test
    module). Executors of local masters run on this machine, so the driver's import path
    is valid there. Remote clusters need the code installed or shipped instead.
    """
    _share_driver_path(session.sparkContext)


SIMPLIFIED_TRACEBACK = "SPARK_SIMPLIFIED_TRACEBACK"


def worker_environment(context: SparkContext) -> None:
    """The environment of every Python worker of a session running the runner's daemon.

    The driver's import path (``share_driver_path``), and ``SPARK_SIMPLIFIED_TRACEBACK=1``,
    which Spark gives only some kinds of task (``mapInArrow``'s, not an RDD's or
    ``transformWithState``'s): with it in every task's environment, they all fork from one
    daemon, the one ``worker_warmup`` starts. What a failure shows is unchanged: the
    workers format the user's traceback themselves (``errors.StageExecutionError``).
    """
    _share_driver_path(context)
    context.environment[SIMPLIFIED_TRACEBACK] = "1"


def _share_driver_path(context: SparkContext) -> None:
    if not is_local_master(context.master or ""):
        return
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    cwd = os.getcwd()
    if cwd not in paths:
        paths.append(cwd)
    context.environment["PYTHONPATH"] = os.pathsep.join(paths)


# How long stopping a session waits for its worker warm-up job (about a second's work).
_WARMUP_SETTLE_SECONDS = 10.0


def _stop_owned() -> None:
    global _owned, _owned_settings
    if _owned is not None:
        try:
            if not driver_jvm.running():
                return  # nothing to stop; its pipelines said how the JVM ended
            _LOGGER.info("Stopping the Spark session the runner created")
            worker_warmup.settle(_owned.sparkContext, _WARMUP_SETTLE_SECONDS)
            _owned.stop()
        finally:
            _owned = None
            _owned_settings = None


atexit.register(_stop_owned)


def obtain_session(settings: SparkSettings, streaming: bool = False) -> tuple[SparkSession, bool]:
    """The session to run on, and whether the runner created (owns) it.

    ``streaming``: for a streaming query, which a new session's JVM compiles with C2
    (``session_conf``); a session already running is kept whichever it compiles with.
    """
    global _owned, _owned_settings
    from pyspark.sql import SparkSession

    with _lock:
        ended = driver_jvm.how_it_ended()
        if ended is not None:
            _LOGGER.warning("%s Starting a new one.", ended)
            driver_jvm.forget()
            _owned = _owned_settings = None
        active = SparkSession.getActiveSession()
        if active is not None and active is not _owned:
            active_master = active.sparkContext.master
            if settings.master is not None and settings.master != active_master:
                raise ValueError(
                    f"--spark_master={settings.master} was given, but this process already has "
                    f"an active SparkSession with master {active_master}, which the runner "
                    "did not create and will not stop. Drop --spark_master to run on that "
                    "session, or stop it first."
                )
            if settings.conf:
                _LOGGER.warning(
                    "Using the active SparkSession; --spark_conf %s applies only to sessions "
                    "the runner creates and is ignored.",
                    sorted(settings.conf),
                )
            return active, False
        if _owned is not None and _owned_settings is not None:
            same = (settings.master or DEFAULT_MASTER) == (
                _owned_settings.master or DEFAULT_MASTER
            ) and settings.conf == _owned_settings.conf
            if same and not _owned.sparkContext._jsc.sc().isStopped():
                _owned.sparkContext.setLogLevel(settings.log_level)
                return _owned, True
            _stop_owned()
        _owned = _build_session(settings, streaming)
        _owned_settings = settings
        return _owned, True


def stop_owned_session() -> None:
    """Stops the session the runner created, if any (tests and long-lived drivers)."""
    with _lock:
        _stop_owned()
