"""Zip archives on sys.path are read again only when they changed."""

from __future__ import annotations

import importlib
import sys
import zipfile
import zipimport
from pathlib import Path
from typing import Any

import pytest

from beam_spark_runner.workers import zip_directories


def _without_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's own method for this test, whether or not this process installed the memo
    (the stage worker's tests run ``beam_globals.enter_run`` here); restored after it."""
    method = zipimport.zipimporter.invalidate_caches
    monkeypatch.setattr(
        zipimport.zipimporter, "invalidate_caches", getattr(method, "__wrapped__", method)
    )


def _counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The archives whose directory is read from now on, one entry per read."""
    reads: list[str] = []
    read_directory = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(archive: str) -> Any:
        reads.append(archive)
        return read_directory(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    return reads


@pytest.fixture
def remembering(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Installs the memo (undone after the test); lists the archives whose directory is read."""
    _without_memo(monkeypatch)
    reads = _counted_reads(monkeypatch)
    zip_directories.remember_zip_directories()
    return reads


def _archive(path: Path, modules: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, source in modules.items():
            archive.writestr(f"{name}.py", source)
    return str(path)


def _on_path(monkeypatch: pytest.MonkeyPatch, path: Path, modules: dict[str, str]) -> str:
    """An archive of ``modules`` first on ``sys.path``, none of them imported yet."""
    archive = _archive(path, modules)
    monkeypatch.syspath_prepend(archive)
    for name in modules:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return archive


def test_an_unchanged_archive_is_not_read_again(
    tmp_path: Path, remembering: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _on_path(monkeypatch, tmp_path / "lib.zip", {"zd_first": "VALUE = 1\n"})
    assert importlib.import_module("zd_first").VALUE == 1
    importlib.invalidate_caches()  # the first time: read, and remembered
    reads_before = remembering.count(archive)
    for _ in range(5):
        importlib.invalidate_caches()  # what PySpark 3.5 and 4.0 do before every task
    assert remembering.count(archive) == reads_before
    zip_directories.remember_zip_directories()  # a second install changes nothing
    importlib.invalidate_caches()
    assert remembering.count(archive) == reads_before


def test_a_changed_archive_is_read_again(
    tmp_path: Path, remembering: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _on_path(monkeypatch, tmp_path / "lib.zip", {"zd_second": "VALUE = 1\n"})
    monkeypatch.delitem(sys.modules, "zd_added", raising=False)
    assert importlib.import_module("zd_second").VALUE == 1
    importlib.invalidate_caches()
    # A new file in its place (PySpark's files directory gets a new zip of the same name).
    (tmp_path / "lib.zip").unlink()
    _archive(tmp_path / "lib.zip", {"zd_second": "VALUE = 2\n", "zd_added": "VALUE = 3\n"})
    reads_before = remembering.count(archive)
    importlib.invalidate_caches()
    assert remembering.count(archive) == reads_before + 1
    assert importlib.import_module("zd_added").VALUE == 3


def test_importers_made_before_the_install_are_remembered_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without_memo(monkeypatch)
    archive = _on_path(monkeypatch, tmp_path / "early.zip", {"zd_early": "VALUE = 1\n"})
    importlib.import_module("zd_early")  # its importer is made before the install
    reads = _counted_reads(monkeypatch)
    zip_directories.remember_zip_directories()
    assert reads.count(archive) == 1  # read once by the install: forks inherit it
    importlib.invalidate_caches()
    assert reads.count(archive) == 1


def test_a_workers_first_task_of_a_run_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A cluster's workers run PySpark's own daemon, not the runner's: enter_run installs it.
    from beam_spark_runner.execution import beam_globals

    _without_memo(monkeypatch)
    monkeypatch.setattr(beam_globals, "_current_run", None)
    beam_globals.enter_run("zip-directories-test", beam_globals.DEFAULT_PICKLE_LIBRARY)
    # Python's own method has no __wrapped__; the memo keeps it there.
    assert hasattr(zipimport.zipimporter.invalidate_caches, "__wrapped__")
