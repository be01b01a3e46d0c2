"""What a streaming run removes when it ends (no Spark)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window
from apache_beam.transforms.periodicsequence import PeriodicImpulse

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.run import cleanup


def _temp_dir(directory: Path, name: str, made: uuid.UUID) -> Path:
    path = directory / f"beam-temp-{name}-{made.hex}"
    path.mkdir()
    (path / "part").write_text("partial\n")
    return path


def _uuid1_at(seconds: float) -> uuid.UUID:
    ticks = int(seconds * 1e7) + 0x01B21DD213814000
    return uuid.UUID(
        fields=(ticks & 0xFFFFFFFF, (ticks >> 32) & 0xFFFF, (ticks >> 48) | 0x1000, 0x80, 1, 2)
    )


def test_a_uuid1_says_when_its_directory_was_made() -> None:
    before = time.time()
    made = cleanup.created_at(f"beam-temp-counts-{uuid.uuid1().hex}", "beam-temp-counts-")
    assert made is not None and before - 1 <= made <= time.time() + 1
    assert cleanup.created_at(f"beam-temp-counts-{uuid.uuid4().hex}", "beam-temp-counts-") is None
    assert cleanup.created_at("beam-temp-counts-notahex", "beam-temp-counts-") is None


def test_only_the_sinks_temp_dirs_made_since_the_start_are_removed(tmp_path: Path) -> None:
    start = time.time()
    older = _temp_dir(tmp_path, "counts", _uuid1_at(start - 3600))
    killed = _temp_dir(tmp_path, "counts", _uuid1_at(start + 10))
    empty = tmp_path / f"beam-temp-counts-{_uuid1_at(start + 20).hex}"
    empty.mkdir()
    other_sink = _temp_dir(tmp_path, "totals", _uuid1_at(start + 10))
    output = tmp_path / "counts-00000-of-00001"
    output.write_text("a,1\n")
    removed = cleanup.remove_abandoned_temp_dirs([f"{tmp_path}/beam-temp-counts-"], start)
    assert sorted(removed) == sorted([str(killed), str(empty)])
    assert older.exists() and other_sink.exists() and output.exists()
    assert not killed.exists() and not empty.exists()


def test_the_pipelines_file_sinks_give_their_temp_dir_prefixes(tmp_path: Path) -> None:
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    now = time.time()
    ticks = (
        pipeline
        | PeriodicImpulse(now, now + 10)
        | beam.Map(str)
        | beam.WindowInto(window.FixedWindows(5))
    )
    _ = ticks | beam.io.WriteToText(str(tmp_path / "counts"), triggering_frequency=5)
    _ = ticks | "Files" >> fileio.WriteToFiles(str(tmp_path / "files"))
    proto = pipeline.to_runner_api(default_environment=bi.default_environment())
    assert bi.file_sink_temp_prefixes(proto.components) == [f"{tmp_path}/beam-temp-counts-"]


def test_a_temporary_checkpoint_is_removed_and_registered_for_the_exit(tmp_path: Path) -> None:
    path = cleanup.temporary_checkpoint()
    assert os.path.basename(path).startswith(cleanup.CHECKPOINT_PREFIX)
    (Path(path) / "offsets").mkdir()
    assert cleanup.remove_tree(path) and not os.path.exists(path)
