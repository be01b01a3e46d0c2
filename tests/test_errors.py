"""What a user sees when a pipeline fails: the traceback once, an unreachable master fast."""

from __future__ import annotations

import socket
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from beam_spark_runner.errors import SparkMasterUnreachableError
from beam_spark_runner.spark.master import check_master_reachable, master_addresses

FAILING_SCRIPT = textwrap.dedent(
    """
    import sys

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions


    def explode(element):
        if element == 3:
            raise ValueError(f"cannot handle element {element}")
        return element


    with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as pipeline:
        pipeline | beam.Create([1, 2, 3]) | "Explode" >> beam.Map(explode)
    """
)


def test_a_failing_dofn_shows_its_traceback_once_with_the_step(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
) -> None:
    script = tmp_path / "failing.py"
    script.write_text(FAILING_SCRIPT, encoding="utf-8")
    result = run_python([str(script), *beam_options], timeout=300)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("ValueError: cannot handle element 3") == 1, output
    assert "PipelineExecutionError: Beam stage 'Create/Map(decode) -> Explode'" in output
    assert "[while running 'Explode']" in output
    assert "\tat org.apache.spark" not in output  # no JVM frames
    assert "The above exception was the direct cause" not in output


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.spark
def test_an_unreachable_master_fails_fast_naming_it(
    run_python: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    master = f"spark://127.0.0.1:{_free_port()}"
    script = tmp_path / "pipeline.py"
    script.write_text(
        "import sys\nimport apache_beam as beam\n"
        "from apache_beam.options.pipeline_options import PipelineOptions\n"
        "with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as p:\n"
        "    p | beam.Create([1, 2])\n",
        encoding="utf-8",
    )
    started = time.monotonic()
    result = run_python(
        [str(script), "--runner=SparkStructuredRunner", f"--spark_master={master}"], timeout=120
    )
    elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert f"cannot reach the Spark master at {master}" in result.stderr
    assert "Connection refused" in result.stderr
    assert elapsed < 15, elapsed


def test_master_addresses() -> None:
    assert master_addresses("spark://a:7077,b:7078") == [("a", 7077), ("b", 7078)]
    assert master_addresses("spark://host") == [("host", 7077)]
    assert master_addresses("local[2]") == []
    check_master_reachable("local[2]")  # nothing to check
    with pytest.raises(SparkMasterUnreachableError, match="cannot reach"):
        check_master_reachable(f"spark://127.0.0.1:{_free_port()}", timeout=1)
