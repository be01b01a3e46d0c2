"""User code's log records reach the driver's log, at the harness log levels (issue 13)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner.monitoring import worker_logs
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version

needs_streaming = pytest.mark.skipif(
    pyspark_version() < OLDEST_STREAMING_SPARK, reason="streaming needs PySpark 3.5 or newer"
)

LOGGER = "tests.user_dofn"


class LogEach(beam.DoFn):
    """Logs each element at INFO and at DEBUG."""

    def process(self, element: int) -> Iterator[int]:
        logging.getLogger(LOGGER).info("saw element %d", element)
        logging.getLogger(LOGGER).debug("debug detail of %d", element)
        yield element


def _run(beam_options: list[str], extra: list[str]) -> None:
    with beam.Pipeline(options=PipelineOptions([*beam_options, *extra])) as pipeline:
        (
            pipeline
            | beam.Create([7, 8])
            | "LogEach" >> beam.ParDo(LogEach())
            | beam.LogElements(prefix="element: ", level=logging.INFO)
        )


def _messages(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def _log_elements_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    """LogElements' records: Beam 2.70+ logs them to its module's logger, older to root."""
    return _messages(caplog, "apache_beam.transforms.util") + _messages(caplog, "root")


@pytest.mark.parametrize("mode", ["batch", pytest.param("streaming", marks=needs_streaming)])
def test_info_logs_and_log_elements_reach_the_driver(
    beam_options: list[str], caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    caplog.set_level(logging.DEBUG)
    _run(beam_options, ["--streaming"] if mode == "streaming" else [])
    user = _messages(caplog, LOGGER)
    assert sorted(m for m in user if m.startswith("saw")) == [
        "saw element 7 [Beam step 'LogEach', Spark worker]",
        "saw element 8 [Beam step 'LogEach', Spark worker]",
    ]
    assert not [m for m in user if "debug detail" in m]  # INFO is the default level
    logged = _log_elements_messages(caplog)
    assert sorted(m.split(" [")[0] for m in logged if m.startswith("element")) == [
        "element: 7",
        "element: 8",
    ]


def test_harness_log_levels_are_honoured(
    beam_options: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _run(
        beam_options,
        [
            "--default_sdk_harness_log_level=WARNING",
            f'--sdk_harness_log_level_overrides={{"{LOGGER}": "DEBUG"}}',
        ],
    )
    user = _messages(caplog, LOGGER)
    assert len([m for m in user if m.startswith("debug detail")]) == 2
    assert not [m for m in _log_elements_messages(caplog) if "element" in m]


def test_an_invalid_level_fails_before_spark_starts() -> None:
    options = PipelineOptions(["--default_sdk_harness_log_level=LOUD"])
    with pytest.raises(ValueError, match="'LOUD' is not a log level"):
        worker_logs.log_levels(options)
    levels = worker_logs.log_levels(
        PipelineOptions(["--sdk_harness_log_level_overrides", '{"a.b": "ERROR", "c": "10"}'])
    )
    assert levels == worker_logs.LogLevels(logging.INFO, {"a.b": logging.ERROR, "c": 10})
