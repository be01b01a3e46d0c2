"""A query's checkpoint on the local disk: the runner's file system and Spark's manager."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_spark_runner.spark.jars import LOCAL_FILE_SYSTEM
from beam_spark_runner.spark.session import settings_within
from beam_spark_runner.streaming.checkpoint_files import (
    CHECKPOINT_FILE_MANAGER_CONF,
    checkpoint_file_settings,
    spark_location,
)
from tests.conftest import SPARK_TEST_MASTER


def test_a_local_checkpoint_is_written_through_hadoops_file_system_api(
    spark_session: Any, tmp_path: Path
) -> None:
    """No ``readlink`` process per renamed checkpoint file: on the local disk only, and only
    where the session names no manager of its own; Spark finds the class it names."""
    settings = checkpoint_file_settings(spark_session, str(tmp_path))
    assert list(settings) == [CHECKPOINT_FILE_MANAGER_CONF]
    name = settings[CHECKPOINT_FILE_MANAGER_CONF]
    assert name.endswith(".FileSystemBasedCheckpointFileManager")
    jvm = spark_session.sparkContext._jvm
    assert jvm.java.lang.Class.forName(name).getSimpleName() == (
        "FileSystemBasedCheckpointFileManager"
    )
    assert checkpoint_file_settings(spark_session, f"file://{tmp_path}") == settings
    assert checkpoint_file_settings(spark_session, spark_location(spark_session, str(tmp_path)))
    # Another file system (Hadoop's HTTP one: no connection until a file is read) keeps
    # Spark's default.
    assert checkpoint_file_settings(spark_session, "http://127.0.0.1:9/checkpoint") == {}
    # One Hadoop cannot resolve (no file system for the scheme): the query will say so.
    assert checkpoint_file_settings(spark_session, "nosuchfs://host/checkpoint") == {}
    with settings_within(spark_session, {CHECKPOINT_FILE_MANAGER_CONF: "users.Manager"}):
        assert checkpoint_file_settings(spark_session, str(tmp_path)) == {}
    assert spark_session.conf.get(CHECKPOINT_FILE_MANAGER_CONF, None) is None


def test_a_session_the_runner_starts_names_local_checkpoints_with_its_file_system(
    spark_session: Any, tmp_path: Path
) -> None:
    directory = tmp_path / "check point"  # a space, which a URI escapes
    expected = f"beamlocal:{directory}"
    assert spark_location(spark_session, str(directory)) == expected
    # Hadoop reads a path in a URI as it is written (no %-escapes), as file: would.
    assert spark_location(spark_session, f"file://{directory}") == expected
    # A relative path is the driver JVM's, as it is for file:.
    jvm_directory = spark_session.sparkContext._jvm.java.lang.System.getProperty("user.dir")
    assert spark_location(spark_session, "check point") == f"beamlocal:{jvm_directory}/check point"
    for elsewhere in ("http://127.0.0.1:9/checkpoint", "nosuchfs://host/checkpoint"):
        assert spark_location(spark_session, elsewhere) == elsewhere
    # A session without the runner's file system (one the user started) keeps the location.
    hadoop_conf = spark_session.sparkContext._jsc.hadoopConfiguration()
    hadoop_conf.unset("fs.beamlocal.impl")
    try:
        assert spark_location(spark_session, str(directory)) == str(directory)
    finally:
        hadoop_conf.set("fs.beamlocal.impl", LOCAL_FILE_SYSTEM)


def test_the_file_system_sets_permissions_and_leaves_no_stale_checksums(
    spark_session: Any, tmp_path: Path
) -> None:
    """Permissions through Java, not ``chmod``; a file renamed over one that Hadoop's
    ``file:`` file system wrote loses that file's checksum, which no longer matches it."""
    jvm = spark_session.sparkContext._jvm
    hadoop_conf = spark_session.sparkContext._jsc.hadoopConfiguration()
    hadoop_path = jvm.org.apache.hadoop.fs.Path
    location = spark_location(spark_session, str(tmp_path))
    file_system = hadoop_path(location).getFileSystem(hadoop_conf)
    assert file_system.getClass().getName() == LOCAL_FILE_SYSTEM
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    directory = hadoop_path(location, "state")
    assert file_system.mkdirs(directory, permission("750"))
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o750
    written = hadoop_path(directory, "1.delta")
    file_system.create(written).close()
    file_system.setPermission(written, permission("640"))
    assert stat.S_IMODE((tmp_path / "state" / "1.delta").stat().st_mode) == 0o640
    assert sorted(path.name for path in (tmp_path / "state").iterdir()) == ["1.delta"]
    # The same file, as Hadoop's checksummed file: file system writes it, with its checksum.
    local = hadoop_path((tmp_path / "state" / "1.delta").as_uri())
    local_fs = local.getFileSystem(hadoop_conf)
    local_fs.create(local, True).close()
    checksum = tmp_path / "state" / ".1.delta.crc"
    assert checksum.exists()
    temporary = hadoop_path(directory, ".1.delta.tmp")
    file_system.create(temporary).close()
    assert file_system.rename(temporary, written)
    assert not checksum.exists()
    local_fs.create(local, True).close()
    assert checksum.exists()
    assert file_system.delete(written, False)
    assert not checksum.exists()


@pytest.mark.spark
def test_a_streaming_querys_checkpoint_is_written_through_the_runners_file_system(
    tmp_path: Path,
) -> None:
    """Hadoop's ``file:`` file system writes a ``.crc`` checksum beside each file, the
    runner's writes none: only the runner's own plan file (written before the query) has one."""
    checkpoint = tmp_path / "check point"
    options = PipelineOptions(
        [
            "--runner=SparkStructuredRunner",
            f"--spark_master={SPARK_TEST_MASTER}",
            "--streaming",
            f"--spark_checkpoint_location={checkpoint}",
        ]
    )
    with beam.Pipeline(options=options) as pipeline:
        grouped = (
            pipeline
            | beam.Create([("a", 1), ("b", 2), ("a", 3)])
            | beam.GroupByKey()
            | beam.MapTuple(lambda key, values: (key, sorted(values)))
        )
        assert_that(grouped, equal_to([("a", [1, 3]), ("b", [2])]))
    files = [path.relative_to(checkpoint) for path in checkpoint.rglob("*") if path.is_file()]
    assert Path("offsets", "0") in files and Path("commits", "0") in files
    assert any(path.parts[0] == "state" for path in files), files
    assert [path for path in files if path.suffix == ".crc"] == [Path(".beam-plan.json.crc")]


@pytest.mark.slow
def test_either_file_system_resumes_the_others_checkpoint(
    spark_session: Any, tmp_path: Path
) -> None:
    """A stateful query's checkpoint written through ``beamlocal:``, resumed through
    ``file:`` (a session without the runner's jar) and back: its state carries over."""
    from beam_spark_runner.streaming.query import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER_CONF

    source = tmp_path / "in"
    source.mkdir()
    checkpoint = tmp_path / "checkpoint"
    counts: dict[str, int] = {}

    def run(location: str, part: int, keys: list[str]) -> None:
        (source / f"{part}.json").write_text("".join(f'{{"key": "{k}"}}\n' for k in keys))
        frame = (
            spark_session.readStream.schema("key STRING").json(str(source)).groupBy("key").count()
        )

        def collect(batch: Any, _batch_id: int) -> None:
            counts.update({row["key"]: row["count"] for row in batch.collect()})

        settings = {
            STATE_STORE_PROVIDER_CONF: ROCKSDB_PROVIDER,
            **checkpoint_file_settings(spark_session, location),
        }
        with settings_within(spark_session, settings):
            query = (
                frame.writeStream.outputMode("update")
                .foreachBatch(collect)
                .option("checkpointLocation", location)
                .trigger(availableNow=True)
                .start()
            )
        assert query.awaitTermination(120), "the availableNow query did not end in 120 s"
        assert query.exception() is None

    local = spark_location(spark_session, str(checkpoint))
    assert local.startswith("beamlocal:")
    run(local, 0, ["a", "b", "a"])
    assert counts == {"a": 2, "b": 1}
    run(f"file://{checkpoint}", 1, ["a", "c"])
    assert counts == {"a": 3, "b": 1, "c": 1}
    run(local, 2, ["b", "c", "c"])
    assert counts == {"a": 3, "b": 2, "c": 3}
    assert sorted(
        path.name for path in (checkpoint / "commits").iterdir() if path.name[0] != "."
    ) == [
        "0",
        "1",
        "2",
    ]
