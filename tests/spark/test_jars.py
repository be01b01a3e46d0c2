"""The runner's jar: built from jvm/src, and on a local session's driver class path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from beam_spark_runner.options import SparkSettings
from beam_spark_runner.spark import jars, java
from beam_spark_runner.spark.jars import DRIVER_CLASS_PATH, JAR, LOCAL_FILE_SYSTEM, session_settings
from beam_spark_runner.spark.session import session_conf

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_jar_goes_on_the_driver_class_path_after_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)  # then Spark's own, under its home

    def settings(conf: dict[str, str]) -> dict[str, str]:
        return session_settings(conf, java.spark_conf_directory(tmp_path))

    added = settings({})
    assert added[DRIVER_CLASS_PATH] == str(JAR)
    assert added["spark.hadoop.fs.beamlocal.impl"] == LOCAL_FILE_SYSTEM
    assert added["spark.hadoop.fs.AbstractFileSystem.beamlocal.impl"].endswith(".LocalCheckpointFs")
    mine = os.pathsep.join(["/opt/a.jar", "/opt/b/*"])
    assert settings({DRIVER_CLASS_PATH: mine})[DRIVER_CLASS_PATH] == (
        os.pathsep.join([mine, str(JAR)])
    )
    # spark-defaults.conf's value, which the launcher would not read once the runner sets one.
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text(
        f"# defaults\nspark.driver.memory 2g\n{DRIVER_CLASS_PATH}   /opt/c.jar\n"
    )
    assert settings({})[DRIVER_CLASS_PATH] == os.pathsep.join(["/opt/c.jar", str(JAR)])
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # a conf directory without one
    assert settings({})[DRIVER_CLASS_PATH] == str(JAR)
    monkeypatch.setattr(jars, "JAR", tmp_path / "missing.jar")
    assert settings({}) == {}


def _jdk_version(text: str) -> str | None:
    match = re.search(r"(\d+(\.\d+)*)", text)
    return match.group(1) if match else None


def test_the_jar_is_built_from_its_sources(tmp_path: Path) -> None:
    """The committed jar holds exactly what ``make jar`` compiles from ``jvm/src``."""
    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac on PATH to compile jvm/src with")
    with zipfile.ZipFile(JAR) as jar:
        manifest = jar.read("META-INF/MANIFEST.MF").decode()
        built = {name: jar.read(name) for name in jar.namelist() if name.endswith(".class")}
    created_by = re.search(r"Created-By: (\S+)", manifest)
    here = subprocess.run([javac, "-version"], capture_output=True, text=True, check=True)
    ours = _jdk_version(here.stdout + here.stderr)
    if created_by is None or _jdk_version(created_by.group(1)) != ours:
        pytest.skip(f"the jar was built by JDK {created_by and created_by.group(1)}, not {ours}")
    import pyspark

    hadoop = next((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    against = re.search(r"Built-Against: (\S+)", manifest)
    if against is None or against.group(1) != hadoop.stem:
        pytest.skip(f"the jar was built against {against and against.group(1)}, not {hadoop.stem}")
    sources = sorted(str(path) for path in (ROOT / "jvm" / "src").rglob("*.java"))
    subprocess.run(
        [javac, "-Xlint:-options", "--release", "8", "-d", str(tmp_path), "-cp", str(hadoop)]
        + sources,
        check=True,
    )
    compiled = {
        str(path.relative_to(tmp_path)): path.read_bytes() for path in tmp_path.rglob("*.class")
    }
    assert built == compiled, "the jar is older than jvm/src: run `make jar` and commit it"


def test_only_a_local_session_loads_the_jar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)

    def settings(**conf: str) -> SparkSettings:
        return SparkSettings(
            master=None, conf=conf, app_name="t", default_parallelism=None, log_level="WARN"
        )

    local = session_conf("local[2]", settings())
    assert local[DRIVER_CLASS_PATH].split(os.pathsep)[-1] == str(JAR)
    assert local["spark.hadoop.fs.beamlocal.impl"] == LOCAL_FILE_SYSTEM
    mine = session_conf("local[2]", settings(**{DRIVER_CLASS_PATH: "/opt/a.jar"}))
    assert mine[DRIVER_CLASS_PATH] == os.pathsep.join(["/opt/a.jar", str(JAR)])
    remote = session_conf("spark://host:7077", settings())
    assert DRIVER_CLASS_PATH not in remote
    assert not any("beamlocal" in key for key in remote)
