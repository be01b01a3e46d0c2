"""A streaming checkpoint written by an earlier runner version restores (issue 64).

``fixtures/checkpoint_v1/`` was written at commit c38b814, before the package moved into
subpackages (``fixtures/make_checkpoint_v1.py`` says how): the pipeline of
``fixtures/checkpoint_pipeline.py`` stopped mid-stream, its first elements in state only.
Its state values are pickles naming the runner's classes by module path
(``fixtures/checkpoint_v1.json`` lists them): a class moved without its old path kept
loadable fails this test, as does any change to how state is encoded that cannot read
the old one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState

from beam_spark_runner.spark.compat import has_row_state
from beam_spark_runner.streaming.checkpoint_files import spark_location
from tests.conftest import SPARK_TEST_MASTER
from tests.fixtures.checkpoint_pipeline import (
    ELEMENTS,
    build,
    expected_lines,
    written_lines,
)

# Slow (8 s or more, the repository's measure) and so left out of the other lines' smoke
# sessions: a restart must run the same graph, and Beam's own transform names in it
# (``Create``'s ``FlatMap(<lambda at core.py:NNNN>)``) vary with Beam's version.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.skipif(
        not has_row_state(),
        reason="the fixture's levels ran on transformWithState on rows (PySpark 4.1+), whose "
        "state Spark does not resume on 4.0's transformWithStateInPandas",
    ),
]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CHECKPOINT = FIXTURES / "checkpoint_v1"
METADATA = json.loads((FIXTURES / "checkpoint_v1.json").read_text())
# How long the restored run may take (it fires everything in its first micro-batches).
_TIMEOUT_MS = 300_000


def _batch_ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _relocate(checkpoint: Path, location: str) -> None:
    """Points the copy's operator metadata at the copy's state schema files.

    Spark 4 records each ``transformWithState`` operator's state schema file by absolute
    URI (``state/<op>/_metadata/v2/0``) and reads it on restart: a checkpoint moved
    elsewhere fails with "File ... does not exist" unless they are rewritten. Nothing else
    in the fixture names where it was written (``make_checkpoint_v1.py`` checks).
    """
    for name in METADATA["files_naming_location"]:
        path = checkpoint / name
        path.write_text(path.read_text().replace(METADATA["location"], location))
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)


def _run(runner: list[str], output: Path) -> Any:
    options = PipelineOptions([*runner, "--streaming"])
    pipeline = beam.Pipeline(options=options)
    build(pipeline, METADATA["start"], str(output))
    result = pipeline.run()
    state = result.wait_until_finish(duration=_TIMEOUT_MS)
    if state == PipelineState.RUNNING:
        result.cancel()
    assert state == PipelineState.DONE
    return result


def test_a_checkpoint_written_before_the_move_restores_and_finishes(
    spark_session: Any, tmp_path: Path
) -> None:
    """Restored elsewhere, the query resumes after the fixture's last batch and writes
    exactly what an uninterrupted run writes.

    The fixture's run wrote nothing; its Impulse fired in micro-batch 0 only, and the
    splittable DoFn's residual holds the sequence from element ``emitted_before_stop``. So
    the elements before it reach the output only through the restored state of each
    stateful node, and the rest only through the restored residual.
    """
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(CHECKPOINT, checkpoint)
    output = tmp_path / "output"
    output.mkdir()
    last = METADATA["last_committed_batch"]
    assert _batch_ids(checkpoint / "commits")[-1] == last
    _relocate(checkpoint, spark_location(spark_session, str(checkpoint)))

    _run(
        [
            "--runner=SparkStructuredRunner",
            f"--spark_master={SPARK_TEST_MASTER}",
            f"--spark_checkpoint_location={checkpoint}",
        ],
        output,
    )

    # Spark resumed the checkpoint's query: its batches follow the fixture's.
    assert _batch_ids(checkpoint / "commits")[-1] > last
    written = written_lines(output)
    # The elements only the fixture's state held, in each node's aggregates.
    emitted = METADATA["emitted_before_stop"]
    assert 0 < emitted < ELEMENTS
    in_state = range(emitted)
    for branch in ("fixed", "triggered", "sessions", "timer"):
        grouped = [line for line in written if line.startswith(f"{branch},")]
        values = {int(v) for line in grouped for v in line.split("[")[1].strip("]").split(",")}
        assert set(in_state) <= values, f"{branch}: elements in the restored state are lost"
    waiting = {int(line.split(",")[1]) for line in written if line.startswith("side,")}
    assert set(in_state) <= waiting, "main elements waiting for their side input are lost"
    assert written == sorted(expected_lines())
