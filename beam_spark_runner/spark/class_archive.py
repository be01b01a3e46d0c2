"""The driver JVM's class archive: a Spark session's JVM started fast.

A JVM of Java 13+ can write the classes it loaded to an archive at exit
(``-XX:ArchiveClassesAtExit``) and map them at the next start (``-XX:SharedArchiveFile``).
:func:`class_archive_options` gives the driver JVM of a session the runner starts one of
the two: the archive for this Java, Spark install and class path if there is one, else (one
process at a time) the option to write it. Archives live in the user's cache directory;
those of removed or changed Spark installs go, and the most recently used are kept. A JVM
that cannot use an archive starts without it, silently. An archive whose writer ran no
pipeline (:func:`note_pipeline_ran`) is written again by the next starts, twice at most.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from beam_spark_runner.spark.java import spark_conf_directory

_LOGGER = logging.getLogger(__name__)

# Java 13 added dynamic class archives (-XX:ArchiveClassesAtExit).
CLASS_ARCHIVE_MIN_JAVA = 13
# What the dynamic archive's header starts with (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC),
# in the byte order of the machine that wrote it. HotSpot writes the header last, once
# every region is written: a file without it is still being written, or was cut short
# (a JVM killed while writing), and mapping a cut-short archive crashes the JVM.
_DYNAMIC_ARCHIVE_MAGIC = 0xF00BABA8
# Without this, a JVM that writes an archive logs a warning per class it leaves out
# (classes of signed jars, generated accessors) to the user's console when it exits, and
# one that cannot use an archive says so at its start.
_QUIET_CDS_LOG = "-Xlog:cds*=off"
# A process whose JVM will write an archive holds a claim on it for this long; the others
# start without an archive meanwhile rather than write the same one. Short, because the
# JVM writes only when it exits: a process that runs for ten minutes (a test suite) would
# otherwise keep every process started meanwhile (its tests' drivers) from an archive.
# A later, shorter-lived writer then puts its archive in place first; the larger archive
# (more classes) replaces a smaller one when it is finished.
_CLAIM_SECONDS = 2 * 60
# A partial file without its header this old was left by a JVM that died while writing.
_STALE_PARTIAL_SECONDS = 15 * 60
# Partial and claim files of any key this old are removed (_prune) when a start is about to
# write an archive and when one is put in place.
_LEFTOVER_SECONDS = 24 * 3600
# Archives of Spark installs that no longer exist as they were go first (``_dead``); of the
# others, the most recently used are kept: enough for a test matrix's environments (a key
# each) not to push out the archive of the environment used every day.
_ARCHIVES_KEPT = 8
# Finished partial files of keys no start has asked for again: kept for a key's second
# start to put in place, but most such keys are one-off environments.
_PARTIALS_KEPT = 3
# An archive whose writer ran no pipeline holds Spark's start-up classes only, too few to
# help a first pipeline: starts write it again (each one slower) this many times, then keep it.
_THIN_REWRITES = 2
# Settings of a session that decide whether a JVM can map an archive: its class path and
# its options. Its heap size matters only from 32 GiB, where the JVM stops compressing
# pointers (an archive written with -Xmx6g mapped under -Xmx1g to -Xmx31g, not -Xmx40g).
_ARCHIVE_CONF = ("spark.driver.extraClassPath", "spark.driver.extraJavaOptions")
_HEAP = "spark.driver.memory"
_COMPRESSED_POINTERS_MAX_BYTES = 32 << 30
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# An archive is 100-200 MB; the runner writes none where the disk has less than this free.
_MIN_FREE_BYTES = 2 << 30
_ARCHIVE_ENV = ("SPARK_DIST_CLASSPATH", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR")


def class_archive_directory() -> Path:
    """Where the driver JVM's class archives are kept: the user's cache directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "beam-spark-runner" / "jvm"


def class_path_directory(spark: Path, conf: Mapping[str, str]) -> Path | None:
    """A non-empty directory with more of the driver JVM's class path after it, if any.

    HotSpot writes no archive for such a class path: the JVM ends with "Cannot have
    non-empty directory in paths" instead, once it has loaded classes from an entry after
    the directory, and a conf directory with files in it (``SPARK_CONF_DIR``, or
    ``SPARK_HOME/conf``) comes before Spark's jars. The entries are those Spark's launcher
    puts on the class path, in its order (``AbstractCommandBuilder.buildClassPath``):
    ``spark.driver.extraClassPath``, the conf directory, Spark's jars, ``HADOOP_CONF_DIR``,
    ``YARN_CONF_DIR`` and ``SPARK_DIST_CLASSPATH``.
    """
    groups = [
        conf.get("spark.driver.extraClassPath"),
        str(spark_conf_directory(spark)),
        str(spark / "jars" / "*"),
        *(os.environ.get(name) for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")),
        os.environ.get("SPARK_DIST_CLASSPATH"),
    ]
    entries = [Path(entry) for group in groups if group for entry in group.split(os.pathsep)]
    present = [entry for entry in entries if entry.name and _present(entry)]
    for entry in present[:-1]:
        if entry.is_dir() and any(entry.iterdir()):
            return entry
    return None


def _present(entry: Path) -> bool:
    """Whether a class path entry (a jar, a directory, or ``dir/*``) is there to load from."""
    return entry.parent.is_dir() if entry.name == "*" else entry.exists()


def class_archive_key(java: str, spark: Path, conf: Mapping[str, str]) -> str:
    """A name for the archive of this Java, Spark install and class path."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        digest.update(repr(parts).encode())

    binary = Path(java).resolve()
    add(str(binary), _stamp(binary), _stamp(binary.parent.parent / "lib" / "modules"))
    add(install_digest(spark))
    add(str(spark.resolve()))
    for name in _ARCHIVE_CONF:
        add(name, conf.get(name))
    # A jar replaced under the same name (the runner's own, on an upgrade) needs a new
    # archive: the JVM refuses one whose jars changed.
    for entry in (conf.get("spark.driver.extraClassPath") or "").split(os.pathsep):
        if entry.endswith(".jar"):
            add(entry, _stamp(Path(entry)))
    add(_HEAP, _large_heap(conf.get(_HEAP)))
    for name in _ARCHIVE_ENV:
        add(name, os.environ.get(name))
    return digest.hexdigest()[:20]


def install_digest(spark: Path) -> str:
    """What the class archive key reads of a Spark install: its jars' names, sizes and times.

    An archive made for an install whose digest is no longer this can never be mapped again.
    """
    digest = hashlib.sha256()
    jars = spark / "jars"
    for jar in sorted(jars.glob("*.jar")) if jars.is_dir() else ():
        digest.update(repr((jar.name, _stamp(jar))).encode())
    return digest.hexdigest()


def _large_heap(memory: str | None) -> bool | str:
    """Whether a driver heap of ``memory`` (``6144m``, ``8g``) is too large for compressed pointers.

    Spark's default (unset) is 1 GiB; a setting that does not parse is returned as it is.
    """
    if memory is None:
        return False
    match = re.fullmatch(r"(\d+)\s*([kmgt]?)b?", memory.strip().lower())
    if match is None:
        return memory
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2) or "m"]
    return size >= _COMPRESSED_POINTERS_MAX_BYTES


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_size, status.st_mtime_ns


def _age_seconds(stamp: tuple[int, int]) -> float:
    """How long ago a file with ``_stamp`` ``stamp`` was last modified."""
    return time.time() - stamp[1] / 1e9


def is_complete_archive(path: Path) -> bool:
    """Whether ``path`` starts with a dynamic archive's header (HotSpot writes it last)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, sys.byteorder) == _DYNAMIC_ARCHIVE_MAGIC


def class_archive_options(directory: Path, key: str, spark: Path | None = None) -> list[str]:
    """The driver JVM's options for its class archive ``key`` in ``directory``.

    ``-XX:SharedArchiveFile`` when the archive is there, whole; else, if no other process
    is writing it, ``-XX:ArchiveClassesAtExit`` to a file of this process's own, which a
    later start checks and renames into place. An archive whose writer ran no pipeline is
    written again the same way, ``_THIN_REWRITES`` times at most. ``spark``, the install
    the key was made for, is noted beside the archive (``<key>.install``) so that pruning
    can tell when it is gone. Never raises: without a usable cache directory the JVM starts
    as it would have.
    """
    mapped: list[str] = []
    rewrites = 0  # of a thin archive (see ``_THIN_REWRITES``), when one is mapped
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if spark is not None:
            _note_install(directory, key, spark)
        archive = _finished_archive(directory, key, _usable_archive(directory, key))
        if archive is not None:
            with contextlib.suppress(OSError):
                os.utime(archive)  # most recently used: kept when old ones are pruned
            mapped = [f"-XX:SharedArchiveFile={archive}", _QUIET_CDS_LOG]
            thin_rewrites = _thin_rewrites(directory, key)
            if thin_rewrites is None or thin_rewrites >= _THIN_REWRITES:
                return mapped
            rewrites = thin_rewrites
        if shutil.disk_usage(directory).free < _MIN_FREE_BYTES:
            _LOGGER.info("No class archive for the driver JVM: under 2 GiB free in %s", directory)
            return mapped
        _prune(directory)
        if not _claim(directory / f"{key}.claim"):
            return mapped
        if mapped:
            (directory / f"{key}.thin").write_text(str(rewrites + 1), encoding="utf-8")
            _LOGGER.info(
                "The driver JVM's class archive in %s was written by a process that ran no "
                "pipeline; this one writes it again",
                directory,
            )
    except OSError as error:
        _LOGGER.debug("No class archive for the driver JVM (%s): %s", directory, error)
        return mapped
    global _writing
    partial = _writing = directory / f"{key}.{os.getpid()}.partial"
    _LOGGER.info(
        "The driver JVM writes its class archive to %s when it exits; later Spark sessions "
        "start from it, in about half the time",
        directory,
    )
    return [f"-XX:ArchiveClassesAtExit={partial}", _QUIET_CDS_LOG]


def archive_in(options: str) -> Path | None:
    """The class archive a JVM options string maps, if any."""
    match = re.search(r"-XX:SharedArchiveFile=(\S+)", options)
    return Path(match.group(1)) if match else None


def without_class_archive(options: str) -> str:
    """A JVM options string without the class archive's options."""
    kept = [
        option
        for option in options.split()
        if not option.startswith(("-XX:SharedArchiveFile=", "-XX:ArchiveClassesAtExit="))
        and option != _QUIET_CDS_LOG
    ]
    return " ".join(kept)


# The partial file this process's driver JVM writes its archive to when it exits, if any.
_writing: Path | None = None


def note_pipeline_ran() -> None:
    """Notes that this process's JVM, if it writes a class archive, has run a pipeline.

    Its archive then holds the classes a pipeline loads, not only Spark's start-up ones:
    see ``_THIN_REWRITES``. Never raises.
    """
    global _writing
    if _writing is not None:
        with contextlib.suppress(OSError):
            _ran_marker(_writing).touch()
        _writing = None


def _ran_marker(partial: Path) -> Path:
    """The file beside a partial archive saying its JVM ran a pipeline (``<key>.<pid>.ran``)."""
    return partial.with_suffix(".ran")


def _thin_rewrites(directory: Path, key: str) -> int | None:
    """How often ``key``'s thin archive was written again; None if it is not thin."""
    try:
        return int((directory / f"{key}.thin").read_text(encoding="utf-8") or 0)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return _THIN_REWRITES


def discard_class_archive(archive: Path) -> None:
    """Removes an archive a JVM failed to start from, so the next start writes a new one."""
    with contextlib.suppress(OSError):
        archive.unlink()


def _usable_archive(directory: Path, key: str) -> Path | None:
    # An archive is named after its size when it is put in place; one of another size
    # now was cut short or changed since, and mapping it could crash the JVM.
    for archive in directory.glob(f"{key}-*.jsa"):
        size = archive.stem.rpartition("-")[2]
        stamp = _stamp(archive)
        if stamp is not None and size.isdigit() and stamp[0] == int(size):
            return archive
        discard_class_archive(archive)
    return None


def _finished_archive(directory: Path, key: str, current: Path | None) -> Path | None:
    """The archive to use: ``current``, or a finished one put in place instead.

    A finished archive replaces ``current`` when it is larger, or when ``current`` is thin
    and its own writer ran a pipeline; of several, those whose writers ran a pipeline come
    first, then the largest. Other partial files go once an archive is in place: finished
    ones not chosen, and unfinished ones older than ``_STALE_PARTIAL_SECONDS``.
    """
    # (its writer ran a pipeline, its size, the partial file)
    finished: list[tuple[bool, int, Path]] = []
    for partial in directory.glob(f"{key}.*.partial"):
        stamp = _stamp(partial)
        if stamp is None:
            continue
        if is_complete_archive(partial):
            finished.append((_ran_marker(partial).exists(), stamp[0], partial))
        elif _age_seconds(stamp) > _STALE_PARTIAL_SECONDS:
            discard_class_archive(partial)
    finished.sort(reverse=True)
    current_stamp = _stamp(current) if current is not None else None
    current_size = current_stamp[0] if current_stamp is not None else 0
    thin_note = directory / f"{key}.thin"
    if finished and (
        finished[0][1] > current_size
        or (finished[0][0] and current is not None and thin_note.exists())
    ):
        ran, size, partial = finished.pop(0)
        placed = directory / f"{key}-{size}.jsa"
        try:
            os.replace(partial, placed)
        except FileNotFoundError:  # another start put it in place first
            return _usable_archive(directory, key)
        with contextlib.suppress(OSError):
            _ran_marker(partial).unlink(missing_ok=True)
            if ran:
                thin_note.unlink(missing_ok=True)
            elif not thin_note.exists():
                thin_note.write_text("0", encoding="utf-8")
        if current is not None and current != placed:
            discard_class_archive(current)  # JVMs that mapped it keep their mapping
        with contextlib.suppress(OSError):
            (directory / f"{key}.claim").unlink()
        _prune(directory)
        current = placed
    if current is not None and finished:
        for _, _, partial in finished:
            discard_class_archive(partial)
            discard_class_archive(_ran_marker(partial))
        # Their writers are done: the claim goes if one of them held it.
        claim = directory / f"{key}.claim"
        with contextlib.suppress(OSError, IndexError):
            writers = {partial.suffixes[-2].lstrip(".") for _, _, partial in finished}
            if claim.read_text(encoding="utf-8").strip() in writers:
                claim.unlink()
    return current


def _claim(claim: Path) -> bool:
    """Whether this process may write the archive: no other one has claimed it lately."""
    try:
        handle = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        stamp = _stamp(claim)
        if stamp is not None and _age_seconds(stamp) < _CLAIM_SECONDS:
            return False
        claim.unlink(missing_ok=True)  # its writer died or failed: claim it afresh
        try:
            handle = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
    with os.fdopen(handle, "w") as file:
        file.write(str(os.getpid()))
    return True


def _newest_first(paths: Iterable[Path]) -> list[Path]:
    return sorted(paths, key=lambda path: (_stamp(path) or (0, 0))[1], reverse=True)


def _note_install(directory: Path, key: str, spark: Path) -> None:
    """Notes which Spark install (its path and ``install_digest``) ``key`` was made for.

    Once per key: the key hashes the digest, so a key's install never changes (a changed
    install makes another key). A start that finds the note reads no jar again for it.
    """
    note = directory / f"{key}.install"
    if note.exists():
        return
    text = json.dumps({"spark": str(spark.resolve()), "digest": install_digest(spark)})
    with contextlib.suppress(OSError):
        note.write_text(text, encoding="utf-8")


def _dead(directory: Path, key: str) -> bool:
    """Whether ``key``'s Spark install is gone or changed: its archive can never be used.

    False where no note says (an archive of an earlier runner version, a note unreadable).
    """
    try:
        noted = json.loads((directory / f"{key}.install").read_text(encoding="utf-8"))
        spark = Path(noted["spark"])
        return not spark.is_dir() or install_digest(spark) != noted["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _key_of(path: Path) -> str:
    """The key an archive (``<key>-<size>.jsa``) or other file (``<key>.<...>``) is for."""
    return path.name.partition(".")[0].partition("-")[0]


def _prune(directory: Path) -> None:
    """Keeps the most recently used archives, and few leftovers of other keys.

    Archives, and finished partial files, of a Spark install that is gone or changed since
    (``_dead``: a deleted CI clone or temporary ``SPARK_HOME``, a reinstalled PySpark) go
    first, with their notes; of the others the ``_ARCHIVES_KEPT`` most recently used stay.

    A key's own start cleans its partial files, but a key no start asks for again (a
    Spark install since removed, a temporary ``SPARK_HOME``, every fresh virtual
    environment) leaves its files here. Of those, finished partial files (whole archives
    that no start has put in place) are capped as archives are, the ``_PARTIALS_KEPT``
    newest: a tox or CI matrix makes a new key per environment and run, ~160 MB each.
    Unfinished ones go once stale (their writer died), anything at all once a day old.
    """
    for key in {_key_of(path) for path in directory.glob("*.install")}:
        if _dead(directory, key):
            for path in directory.glob(f"{key}[.-]*"):
                discard_class_archive(path)
    for old in _newest_first(directory.glob("*.jsa"))[_ARCHIVES_KEPT:]:
        discard_class_archive(old)
    finished: list[Path] = []
    leftovers = [*directory.glob("*.partial"), *directory.glob("*.claim")]
    # A pipeline-ran marker stays as long as its partial file.
    leftovers += [r for r in directory.glob("*.ran") if not r.with_suffix(".partial").exists()]
    # A note stays as long as its key's archive; without one it is a leftover like the others.
    leftovers += [
        note
        for note in [*directory.glob("*.install"), *directory.glob("*.thin")]
        if not any(directory.glob(f"{_key_of(note)}-*.jsa"))
    ]
    for leftover in _newest_first(leftovers):
        stamp = _stamp(leftover)
        if stamp is None:
            continue
        age = _age_seconds(stamp)
        if age > _LEFTOVER_SECONDS:
            discard_class_archive(leftover)
        elif leftover.suffix == ".partial":
            if is_complete_archive(leftover):
                finished.append(leftover)
            elif age > _STALE_PARTIAL_SECONDS:
                discard_class_archive(leftover)
    for old in finished[_PARTIALS_KEPT:]:
        discard_class_archive(old)
        discard_class_archive(_ran_marker(old))
