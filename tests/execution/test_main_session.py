"""--save_main_session: classes defined in the main script reach Spark's workers."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from beam_spark_runner.execution import main_session
from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version

needs_streaming = pytest.mark.skipif(
    pyspark_version() < OLDEST_STREAMING_SPARK, reason="streaming needs PySpark 3.5 or newer"
)

# A main script whose dataclass and NamedTuple go between steps and through a GroupByKey.
SCRIPT = textwrap.dedent(
    """
    import dataclasses
    import sys
    import typing

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions


    @dataclasses.dataclass(frozen=True)
    class Event:
        user: str
        amount: int


    class Key(typing.NamedTuple):
        user: str


    def main(argv):
        output = argv.pop(0)
        with beam.Pipeline(options=PipelineOptions(argv)) as pipeline:
            (
                pipeline
                | beam.Create([("a", 1), ("b", 2), ("a", 3)])
                | beam.MapTuple(Event)
                | beam.Map(lambda event: (Key(event.user), event))
                | beam.GroupByKey()
                | beam.MapTuple(lambda key, events: f"{key.user}:{sum(e.amount for e in events)}")
                | beam.io.WriteToText(output)
            )


    if __name__ == "__main__":
        main(sys.argv[1:])
    """
)


def _run_script(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
    extra: list[str],
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    script = tmp_path / "pipeline.py"
    script.write_text(SCRIPT, encoding="utf-8")
    output = tmp_path / "out"
    result = run_python([str(script), str(output), *beam_options, *extra], timeout=300)
    lines = sorted(
        line for path in tmp_path.glob("out-*") for line in path.read_text().splitlines()
    )
    return result, lines


@pytest.mark.parametrize(
    ("pickle_library", "mode"),
    [
        pytest.param("cloudpickle", "batch", marks=pytest.mark.slow),
        ("dill", "batch"),
        pytest.param("cloudpickle", "streaming", marks=[needs_streaming, pytest.mark.slow]),
    ],
)
def test_main_script_classes_with_save_main_session(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
    pickle_library: str,
    mode: str,
) -> None:
    result, lines = _run_script(
        run_python,
        tmp_path,
        beam_options,
        ["--save_main_session", f"--pickle_library={pickle_library}"]
        + (["--streaming"] if mode == "streaming" else []),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert lines == ["a:4", "b:2"]


@pytest.mark.parametrize(
    "pickle_library", [pytest.param("cloudpickle", marks=pytest.mark.slow), "dill"]
)
def test_without_save_main_session_the_error_says_to_use_it(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
    pickle_library: str,
) -> None:
    result, _ = _run_script(
        run_python, tmp_path, beam_options, [f"--pickle_library={pickle_library}"]
    )
    assert result.returncode != 0
    assert "PipelineExecutionError" in result.stderr
    assert main_session.SAVE_MAIN_SESSION_HINT in result.stderr


def test_worker_failures_on_main_script_names_are_recognised() -> None:
    assert main_session.missing_main_names(
        "_pickle.PicklingError: Can't pickle <class '__main__.Event'>: attribute lookup "
        "Event on __main__ failed",
        "cloudpickle",
    )
    assert main_session.missing_main_names(
        "AttributeError: Can't get attribute 'Event' on <module '__main__'>", "default"
    )
    assert main_session.missing_main_names("NameError: name 'Event' is not defined", "dill")
    assert not main_session.missing_main_names(
        "NameError: name 'Event' is not defined", "cloudpickle"
    )
    assert not main_session.missing_main_names("ZeroDivisionError: division by zero", "dill")
    assert not main_session.missing_main_names("ValueError: <__main__.Event object>", "default")
