"""A streaming run as a person running it sees it: a failing DoFn's error once."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

FAILING_STREAM = textwrap.dedent(
    """
    import sys

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream

    stream = (
        TestStream().add_elements(["1", "2"]).advance_watermark_to(10).add_elements(["oops"])
    )
    pipeline = beam.Pipeline(options=PipelineOptions(sys.argv[1:]))
    _ = pipeline | stream | "ToInt" >> beam.Map(int)
    pipeline.run().wait_until_finish()
    """
)


def test_a_failing_dofn_in_a_streaming_query_shows_its_traceback_once_with_the_step(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
) -> None:
    """Neither Py4J's log of the ``foreachBatch`` error nor Spark's of the query repeats it."""
    script = tmp_path / "failing_stream.py"
    script.write_text(FAILING_STREAM, encoding="utf-8")
    result = run_python([str(script), *beam_options, "--streaming"], timeout=300)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("ValueError: invalid literal for int()") == 1, output
    assert "PipelineExecutionError: Beam stage 'ToInt' failed on Spark" in output
    assert "[while running 'ToInt']" in output
    assert "at org.apache.spark" not in output  # no JVM frames
    assert "Python Proxy" not in output, output  # Py4J's log of the callback's error
