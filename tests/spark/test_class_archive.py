"""The driver JVM's class archive: written once, checked, put in place, used, pruned."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from beam_spark_runner.options import SparkSettings
from beam_spark_runner.spark import class_archive, java, session

KEY = "k" * 20
MAGIC = (0xF00BABA8).to_bytes(4, sys.byteorder)


def _written(path: Path, size: int = 4096, magic: bytes = MAGIC) -> Path:
    """A file as HotSpot leaves it: the header (magic first) written last, or not yet."""
    path.write_bytes(magic + b"\0" * (size - len(magic)))
    return path


def _ran(partial: Path) -> Path:
    """Marks a partial archive's writer as having run a pipeline (``note_pipeline_ran``)."""
    partial.with_suffix(".ran").touch()
    return partial


@pytest.fixture(autouse=True)
def _no_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's starts set the process's partial file afresh, and leave it unset."""
    monkeypatch.setattr(class_archive, "_writing", None)


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_the_first_start_writes_the_archive_and_the_next_one_uses_it(tmp_path: Path) -> None:
    options = class_archive.class_archive_options(tmp_path, KEY)
    partial = tmp_path / f"{KEY}.{os.getpid()}.partial"
    assert options == [f"-XX:ArchiveClassesAtExit={partial}", "-Xlog:cds*=off"]
    assert (tmp_path / f"{KEY}.claim").read_text() == str(os.getpid())
    # While that JVM runs (and writes), other starts neither use nor write an archive.
    assert class_archive.class_archive_options(tmp_path, KEY) == []
    class_archive.note_pipeline_ran()  # the writing process ran a pipeline
    _written(partial, size=8192)
    options = class_archive.class_archive_options(tmp_path, KEY)
    archive = tmp_path / f"{KEY}-8192.jsa"
    assert options == [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds*=off"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name]
    assert class_archive.class_archive_options(tmp_path, KEY) == options


def test_an_archive_being_written_or_cut_short_is_not_used(tmp_path: Path) -> None:
    partial = _written(tmp_path / f"{KEY}.1.partial", magic=b"\0\0\0\0")
    (tmp_path / f"{KEY}.claim").write_text("1")
    assert class_archive.class_archive_options(tmp_path, KEY) == []
    assert partial.exists()
    # Long after: its writer died. This start writes the archive, and once it is in place
    # the dead writer's file is removed.
    _age(partial, 3600)
    _age(tmp_path / f"{KEY}.claim", 3600)
    options = class_archive.class_archive_options(tmp_path, KEY)
    mine = tmp_path / f"{KEY}.{os.getpid()}.partial"
    assert options[0] == f"-XX:ArchiveClassesAtExit={mine}"
    _ran(_written(mine))
    assert class_archive.class_archive_options(tmp_path, KEY)[0].endswith(f"{KEY}-4096.jsa")
    assert not partial.exists()


def test_the_largest_finished_archive_is_used(tmp_path: Path) -> None:
    """A long-lived writer (more classes) replaces the archive a short-lived one put first."""
    _ran(_written(tmp_path / f"{KEY}.1.partial", size=4096))
    _ran(_written(tmp_path / f"{KEY}.2.partial", size=8192))
    options = class_archive.class_archive_options(tmp_path, KEY)
    assert options[0] == f"-XX:SharedArchiveFile={tmp_path / KEY}-8192.jsa"
    assert [p.name for p in tmp_path.iterdir()] == [f"{KEY}-8192.jsa"]
    _ran(_written(tmp_path / f"{KEY}.3.partial", size=12288))
    _ran(_written(tmp_path / f"{KEY}.4.partial", size=4096))
    options = class_archive.class_archive_options(tmp_path, KEY)
    assert options[0] == f"-XX:SharedArchiveFile={tmp_path / KEY}-12288.jsa"
    assert [p.name for p in tmp_path.iterdir()] == [f"{KEY}-12288.jsa"]


def test_an_archive_whose_writer_ran_no_pipeline_is_written_again_twice_at_most(
    tmp_path: Path,
) -> None:
    """A short JVM's archive holds Spark's start-up classes only: later starts write it
    again (without mapping it) until one that ran a pipeline replaces it, twice at most."""
    thin = _written(tmp_path / f"{KEY}.1.partial", size=8192)
    options = class_archive.class_archive_options(tmp_path, KEY)
    mine = tmp_path / f"{KEY}.{os.getpid()}.partial"
    assert options[0] == f"-XX:ArchiveClassesAtExit={mine}"  # the thin one is put in place
    assert (tmp_path / f"{KEY}-8192.jsa").exists() and not thin.exists()
    assert (tmp_path / f"{KEY}.thin").read_text() == "1"
    # While that start writes, others map the thin archive rather than none.
    mapped = [f"-XX:SharedArchiveFile={tmp_path / KEY}-8192.jsa", "-Xlog:cds*=off"]
    assert class_archive.class_archive_options(tmp_path, KEY) == mapped
    # Its writer ran no pipeline either, and wrote a smaller file: a second rewrite.
    _written(mine, size=4096)
    assert (
        class_archive.class_archive_options(tmp_path, KEY)[0] == f"-XX:ArchiveClassesAtExit={mine}"
    )
    assert (tmp_path / f"{KEY}.thin").read_text() == "2"
    # The second writer ran a pipeline: its archive replaces the thin one, smaller or not.
    class_archive.note_pipeline_ran()
    _written(mine, size=4096)
    full = [f"-XX:SharedArchiveFile={tmp_path / KEY}-4096.jsa", "-Xlog:cds*=off"]
    assert class_archive.class_archive_options(tmp_path, KEY) == full
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{KEY}-4096.jsa"]
    assert class_archive.class_archive_options(tmp_path, KEY) == full


def test_a_discarded_archive_frees_the_claim_only_if_its_writer_held_it(tmp_path: Path) -> None:
    _ran(_written(tmp_path / f"{KEY}.1.partial", size=8192))
    assert class_archive.class_archive_options(tmp_path, KEY)[0].endswith(f"{KEY}-8192.jsa")
    claim = tmp_path / f"{KEY}.claim"
    claim.write_text("2")  # process 2 writes an archive
    _written(tmp_path / f"{KEY}.1.partial", size=4096)  # process 1's, smaller: discarded
    class_archive.class_archive_options(tmp_path, KEY)
    assert claim.read_text() == "2"
    _written(tmp_path / f"{KEY}.2.partial", size=4096)  # process 2's, done and smaller
    class_archive.class_archive_options(tmp_path, KEY)
    assert not claim.exists()


def test_a_thin_archive_is_kept_after_two_rewrites(tmp_path: Path) -> None:
    _written(tmp_path / f"{KEY}.1.partial", size=8192)
    (tmp_path / f"{KEY}.thin").write_text("2")
    (tmp_path / f"{KEY}-4096.jsa").unlink(missing_ok=True)
    mapped = [f"-XX:SharedArchiveFile={tmp_path / KEY}-8192.jsa", "-Xlog:cds*=off"]
    assert class_archive.class_archive_options(tmp_path, KEY) == mapped
    assert class_archive.class_archive_options(tmp_path, KEY) == mapped


def test_a_claim_lasts_two_minutes(tmp_path: Path) -> None:
    assert class_archive.class_archive_options(tmp_path, KEY)[0].startswith(
        "-XX:ArchiveClassesAtExit="
    )
    assert class_archive.class_archive_options(tmp_path, KEY) == []
    _age(tmp_path / f"{KEY}.claim", 121)
    assert class_archive.class_archive_options(tmp_path, KEY)[0].startswith(
        "-XX:ArchiveClassesAtExit="
    )


def test_an_archive_whose_size_changed_is_removed(tmp_path: Path) -> None:
    damaged = _written(tmp_path / f"{KEY}-9999.jsa", size=4096)
    options = class_archive.class_archive_options(tmp_path, KEY)
    assert not damaged.exists()
    assert options[0].startswith("-XX:ArchiveClassesAtExit=")


def test_the_eight_most_recently_used_archives_are_kept(tmp_path: Path) -> None:
    """Other keys' archives (a CI run's environments, six here) do not push out the ninth's."""
    for age, key in enumerate("abcdefgh"):
        _age(_written(tmp_path / f"{key * 20}-4096.jsa"), 100 + age)
    _ran(_written(tmp_path / f"{KEY}.1.partial"))
    assert class_archive.class_archive_options(tmp_path, KEY)[0].endswith(f"{KEY}-4096.jsa")
    kept = sorted(p.name[:2] for p in tmp_path.glob("*.jsa"))
    assert kept == ["aa", "bb", "cc", "dd", "ee", "ff", "gg", "kk"]
    # A start that maps its archive makes it the most recently used one.
    _age(tmp_path / ("a" * 20 + "-4096.jsa"), 200)
    assert class_archive.class_archive_options(tmp_path, "a" * 20)[0].endswith(
        "a" * 20 + "-4096.jsa"
    )
    _ran(_written(tmp_path / ("x" * 20 + ".1.partial")))
    class_archive.class_archive_options(tmp_path, "x" * 20)
    kept = sorted(p.name[:2] for p in tmp_path.glob("*.jsa"))
    assert kept == ["aa", "bb", "cc", "dd", "ee", "ff", "kk", "xx"]


def _install(path: Path) -> Path:
    """A Spark install as the key reads it: a directory of jars."""
    (path / "jars").mkdir(parents=True)
    (path / "jars" / "spark-core.jar").write_text("1")
    return path


def test_archives_of_spark_installs_since_removed_or_changed_go_first(tmp_path: Path) -> None:
    """A deleted CI clone's or temporary ``SPARK_HOME``'s archive, or one of a PySpark
    reinstalled since, can never be mapped again: it goes before any live one, note and all."""
    cache = tmp_path / "jvm"
    cache.mkdir()
    installs = {key: _install(tmp_path / key) for key in ("a" * 20, "b" * 20, "c" * 20)}
    for age, (key, spark) in enumerate(installs.items()):
        _ran(_written(cache / f"{key}.1.partial"))
        class_archive.class_archive_options(
            cache, key, spark
        )  # puts it in place, notes its install
        _age(cache / f"{key}-4096.jsa", 1000 - age)  # "a" the least recently used
        assert (cache / f"{key}.install").exists()
    shutil.rmtree(installs["b" * 20])
    (installs["c" * 20] / "jars" / "spark-core.jar").write_text("22")  # reinstalled
    _ran(_written(cache / f"{KEY}.1.partial"))
    class_archive.class_archive_options(cache, KEY, _install(tmp_path / "k"))
    assert sorted(p.name[:2] for p in cache.glob("*.jsa")) == ["aa", "kk"]
    assert sorted(p.name[:2] for p in cache.glob("*.install")) == ["aa", "kk"]


def test_another_keys_leftovers_go_after_a_day(tmp_path: Path) -> None:
    """A key no start asks for again (a temporary SPARK_HOME) leaves no files for ever."""
    old = [_written(tmp_path / ("o" * 20 + ".1.partial")), tmp_path / ("o" * 20 + ".claim")]
    old[1].write_text("1")
    recent = _written(tmp_path / ("r" * 20 + ".2.partial"))
    for path in old:
        _age(path, 25 * 3600)
    class_archive.class_archive_options(tmp_path, KEY)
    assert not any(path.exists() for path in old)
    assert recent.exists()


def test_other_keys_finished_partial_files_are_kept_as_archives_are(tmp_path: Path) -> None:
    """A tox or CI matrix leaves a whole archive per environment that no start puts in place
    (seen: 11 of ~160 MB in a day); only the three newest stay, and dead writers' files go."""
    finished = []
    for age, key in enumerate("abcde"):
        finished.append(_ran(_written(tmp_path / f"{key * 20}.{age}.partial")))
        _age(finished[-1], 60 + age)
    dead = _written(tmp_path / ("x" * 20 + ".9.partial"), magic=b"\0\0\0\0")
    _age(dead, 16 * 60)
    being_written = _written(tmp_path / ("w" * 20 + ".8.partial"), magic=b"\0\0\0\0")
    class_archive.class_archive_options(tmp_path, KEY)
    assert [path.exists() for path in finished] == [True, True, True, False, False]
    assert not dead.exists()
    assert being_written.exists()
    # The newest kept one is still put in place by its own key's next start.
    assert class_archive.class_archive_options(tmp_path, "a" * 20)[0].endswith(
        "a" * 20 + "-4096.jsa"
    )


def test_no_archive_is_written_on_a_full_disk(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(class_archive, "_MIN_FREE_BYTES", 1 << 62)
    assert class_archive.class_archive_options(tmp_path, KEY) == []
    assert not (tmp_path / f"{KEY}.claim").exists()


def test_no_cache_directory_means_no_archive(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert class_archive.class_archive_options(blocker / "jvm", KEY) == []


def test_the_key_follows_java_spark_and_the_class_path(tmp_path: Path, monkeypatch) -> None:
    binary = tmp_path / "jdk" / "bin" / "java"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_text("1")
    monkeypatch.delenv("SPARK_DIST_CLASSPATH", raising=False)
    key = class_archive.class_archive_key(
        str(binary), jars.parent, {"spark.driver.memory": "6144m"}
    )
    for same in [{}, {"spark.app.name": "x"}, {"spark.driver.memory": "31g"}]:
        assert key == class_archive.class_archive_key(str(binary), jars.parent, same)
    changed = [
        class_archive.class_archive_key(str(binary), jars.parent, {"spark.driver.memory": "40g"})
    ]
    changed.append(
        class_archive.class_archive_key(
            str(binary), jars.parent, {"spark.driver.extraClassPath": "a.jar"}
        )
    )
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", "/opt/hadoop/*")
    changed.append(class_archive.class_archive_key(str(binary), jars.parent, {}))
    monkeypatch.delenv("SPARK_DIST_CLASSPATH")
    (jars / "spark-sql.jar").write_text("2")
    changed.append(class_archive.class_archive_key(str(binary), jars.parent, {}))
    extra = tmp_path / "extra.jar"
    extra.write_text("1")
    class_path = {"spark.driver.extraClassPath": str(extra)}
    changed.append(class_archive.class_archive_key(str(binary), jars.parent, class_path))
    extra.write_text("22")  # the same jar's name, other classes
    changed.append(class_archive.class_archive_key(str(binary), jars.parent, class_path))
    assert len({key, *changed}) == 7


def test_options_without_the_archive() -> None:
    options = "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile=/c/k-1.jsa -Xlog:cds*=off -Dx=y"
    assert class_archive.archive_in(options) == Path("/c/k-1.jsa")
    assert class_archive.without_class_archive(options) == "-XX:TieredStopAtLevel=1 -Dx=y"
    assert class_archive.archive_in("-XX:ArchiveClassesAtExit=/c/k.1.partial") is None


def _archiving_java() -> str:
    """The java executable, skipping the test where it cannot write class archives."""
    executable = java.java_executable()
    version = java.java_version(executable) if executable else None
    if version is None or java.java_major(version) < class_archive.CLASS_ARCHIVE_MIN_JAVA:
        pytest.skip(f"needs Java {class_archive.CLASS_ARCHIVE_MIN_JAVA}+ (found {version})")
    assert executable is not None
    return executable


def test_a_real_jvm_writes_an_archive_that_another_maps(tmp_path: Path) -> None:
    """The magic number and the file names against HotSpot itself (``java -version``)."""
    executable = _archiving_java()
    writing = class_archive.class_archive_options(tmp_path, KEY)
    class_archive.note_pipeline_ran()  # as the runner notes it after a pipeline
    subprocess.run([executable, *writing, "-version"], check=True, capture_output=True)
    using = class_archive.class_archive_options(tmp_path, KEY)
    assert using[0].startswith(f"-XX:SharedArchiveFile={tmp_path / KEY}-")
    # -Xshare:on makes a JVM that cannot map the archive fail instead of ignoring it.
    mapped = subprocess.run(
        [executable, *using, "-Xshare:on", "-version"], capture_output=True, text=True
    )
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr


def _settings(**conf: str) -> SparkSettings:
    return SparkSettings(
        master=None, conf=dict(conf), app_name="t", default_parallelism=None, log_level="WARN"
    )


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(class_archive, "class_archive_directory", lambda: tmp_path)
    monkeypatch.setattr(session, "_jvm_started", lambda: False)
    return tmp_path


def test_a_session_the_runner_starts_gets_the_archive_options(archive_dir: Path) -> None:
    conf = {session.JAVA_OPTIONS: "-XX:TieredStopAtLevel=1"}
    session.with_class_archive(conf, _settings(), "17.0.15")
    options = conf[session.JAVA_OPTIONS].split()
    assert options[0] == "-XX:TieredStopAtLevel=1"
    assert options[1].startswith(f"-XX:ArchiveClassesAtExit={archive_dir}/")
    assert options[2] == "-Xlog:cds*=off"


@pytest.mark.parametrize(
    ("settings", "version"),
    [
        (SparkSettings(None, {}, "t", None, "WARN", class_archive=False), "17.0.15"),
        (_settings(**{session.JAVA_OPTIONS: "-Xss4m"}), "17.0.15"),
        (_settings(), "11.0.22"),
    ],
    ids=["turned-off", "users-java-options", "java-11"],
)
def test_no_archive_options(archive_dir: Path, settings: SparkSettings, version: str) -> None:
    conf: dict[str, str] = {}
    session.with_class_archive(conf, settings, version)
    assert conf == {}
    assert list(archive_dir.iterdir()) == []


def test_a_jvm_that_fails_on_its_archive_starts_again_without_it(
    archive_dir: Path, monkeypatch
) -> None:
    archive = _written(archive_dir / f"{KEY}-4096.jsa")
    monkeypatch.setattr(class_archive, "class_archive_key", lambda *_: KEY)
    monkeypatch.setattr(session, "check_java", lambda _: "17.0.15")
    monkeypatch.setattr(session, "check_master_reachable", lambda _: None)
    started: list[str] = []

    class FakeSession:
        class sparkContext:  # noqa: N801 - PySpark's attribute name
            defaultParallelism = 2

            @staticmethod
            def setLogLevel(_: str) -> None:  # noqa: N802 - PySpark's method name
                pass

        class conf:  # noqa: N801
            @staticmethod
            def set(*_: Any) -> None:
                pass

    def start(master: str, settings: SparkSettings, conf: dict[str, str]) -> Any:
        started.append(conf[session.JAVA_OPTIONS])
        if "SharedArchiveFile" in conf[session.JAVA_OPTIONS]:
            raise RuntimeError("Java gateway process exited before sending its port number")
        return FakeSession

    monkeypatch.setattr(session, "_start", start)
    settings = SparkSettings("local[2]", {}, "t", None, "WARN")
    assert session._build_session(settings) is FakeSession
    assert f"-XX:SharedArchiveFile={archive}" in started[0]
    assert "SharedArchiveFile" not in started[1]
    assert "-Xlog:cds*=off" not in started[1]
    assert "-XX:TieredStopAtLevel=1" in started[1]
    assert not archive.exists()


def test_a_pipeline_run_notes_it_beside_the_archive_its_jvm_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark_session: Any, beam_options: list[str]
) -> None:
    """After a pipeline, the partial archive of this process's JVM is marked as a full one."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    partial = tmp_path / f"{KEY}.1.partial"
    monkeypatch.setattr(class_archive, "_writing", partial)
    with beam.Pipeline(options=PipelineOptions(beam_options)) as pipeline:
        _ = pipeline | beam.Create([1, 2]) | beam.Map(str)
    assert partial.with_suffix(".ran").exists()
    assert class_archive._writing is None  # noted once


def _files(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "spark-defaults.conf").write_text("spark.ui.enabled false\n", encoding="utf-8")
    return directory


@pytest.fixture
def spark_install(tmp_path: Path, monkeypatch) -> Path:
    """A Spark install with its jars, and no class path settings of the user's."""
    for name in ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    spark = tmp_path / "spark"
    (spark / "jars").mkdir(parents=True)
    (spark / "jars" / "spark-core.jar").write_bytes(b"PK")
    return spark


def test_a_class_path_with_only_jars_and_trailing_or_empty_directories_can_be_archived(
    spark_install: Path, tmp_path: Path, monkeypatch
) -> None:
    assert class_archive.class_path_directory(spark_install, {}) is None  # SPARK_HOME/conf absent
    (spark_install / "conf").mkdir()
    assert class_archive.class_path_directory(spark_install, {}) is None  # empty
    # HADOOP_CONF_DIR after Spark's jars, with nothing after it: HotSpot archives past none.
    monkeypatch.setenv("HADOOP_CONF_DIR", str(_files(tmp_path / "hadoop")))
    assert class_archive.class_path_directory(spark_install, {}) is None
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", f"{tmp_path / 'gone.jar'}:{tmp_path / 'gone'}/*")
    assert class_archive.class_path_directory(spark_install, {}) is None  # entries not there


def test_a_non_empty_directory_before_other_class_path_entries_is_found(
    spark_install: Path, tmp_path: Path, monkeypatch
) -> None:
    home_conf = _files(spark_install / "conf")
    assert class_archive.class_path_directory(spark_install, {}) == home_conf
    conf_dir = _files(tmp_path / "conf")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    assert class_archive.class_path_directory(spark_install, {}) == conf_dir
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    classes = _files(tmp_path / "classes")
    assert class_archive.class_path_directory(
        spark_install, {"spark.driver.extraClassPath": str(classes)}
    )
    hadoop = _files(tmp_path / "hadoop")
    monkeypatch.setenv("HADOOP_CONF_DIR", str(hadoop))
    jar = tmp_path / "hadoop-common.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("SPARK_DIST_CLASSPATH", str(jar))
    assert class_archive.class_path_directory(spark_install, {}) == hadoop


def test_no_archive_options_where_the_conf_directory_has_files(
    archive_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch
) -> None:
    monkeypatch.setenv("SPARK_CONF_DIR", str(_files(tmp_path_factory.mktemp("conf"))))
    conf: dict[str, str] = {}
    session.with_class_archive(conf, _settings(), "17.0.15")
    assert conf == {}
    assert list(archive_dir.iterdir()) == []


def test_hotspot_archives_no_classes_past_a_non_empty_directory(tmp_path: Path) -> None:
    """What ``class_path_directory`` is for, against HotSpot itself."""
    executable = _archiving_java()
    launcher = next((java.spark_home() / "jars").glob("spark-launcher_*.jar"))
    conf = _files(tmp_path / "conf")

    def archived(class_path: str, name: str) -> bool:
        archive = tmp_path / name
        command = [executable, f"-XX:ArchiveClassesAtExit={archive}", "-cp", class_path]
        subprocess.run([*command, "org.apache.spark.launcher.Main"], capture_output=True)
        return archive.exists()

    assert not archived(f"{conf}{os.pathsep}{launcher}", "before.jsa")
    assert archived(f"{launcher}{os.pathsep}{conf}", "after.jsa")
