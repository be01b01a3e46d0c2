"""On a standalone cluster: a main script's classes with --save_main_session, and its
DoFn's log records in the driver's log (issue 13). Executors are separate processes that
cannot import the script, so nothing here may depend on the driver's memory or sys.path.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .support import (
    PYTHON,
    STANDALONE_SPARK_CONF,
    StandaloneCluster,
    driver_env,
    run_logged,
    spark_conf_args,
)

pytestmark = pytest.mark.cluster

SCRIPT = textwrap.dedent(
    """
    import dataclasses
    import logging
    import sys

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions


    @dataclasses.dataclass(frozen=True)
    class Event:
        user: str
        amount: int


    class Announce(beam.DoFn):
        def process(self, event):
            logging.getLogger("first_hour.announce").info("saw event of %s", event.user)
            yield event.user, event


    if __name__ == "__main__":
        logging.basicConfig(level=logging.INFO, force=True)
        output = sys.argv[1]
        with beam.Pipeline(options=PipelineOptions(sys.argv[2:])) as pipeline:
            (
                pipeline
                | beam.Create([("a", 1), ("b", 2), ("a", 3)])
                | beam.MapTuple(Event)
                | "Announce" >> beam.ParDo(Announce())
                | beam.GroupByKey()
                | beam.MapTuple(lambda user, events: f"{user}:{sum(e.amount for e in events)}")
                | beam.io.WriteToText(output)
            )
    """
)


@pytest.mark.parametrize("pickle_library", ["cloudpickle", "dill"])
def test_main_script_classes_and_logs_on_a_standalone_cluster(
    standalone_cluster: StandaloneCluster, tmp_path: Path, pickle_library: str
) -> None:
    script = tmp_path / "pipeline.py"
    script.write_text(SCRIPT, encoding="utf-8")
    output = tmp_path / "out" / "totals"
    run = run_logged(
        [
            PYTHON,
            str(script),
            str(output),
            "--runner=SparkStructuredRunner",
            f"--spark_master={standalone_cluster.master_url}",
            "--save_main_session",
            f"--pickle_library={pickle_library}",
            *spark_conf_args(STANDALONE_SPARK_CONF),
        ],
        tmp_path / "driver.log",
        driver_env(),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.log_tail()
    lines = sorted(
        line for path in output.parent.glob("totals*") for line in path.read_text().splitlines()
    )
    assert lines == ["a:4", "b:2"]
    log = run.log.read_text(errors="replace")
    assert log.count("INFO:first_hour.announce:saw event of a [Beam step 'Announce'") == 2
