"""streaming.driver_processes: PySpark's driver-side processes of a query, kept quiet."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest

from beam_spark_runner.streaming import driver_processes
from beam_spark_runner.streaming.driver_processes import (
    PLAIN_DAEMON_MODULE,
    PRE_INIT_MODULE,
    quiet_daemon_child,
    quiet_pre_init,
)
from beam_spark_runner.workers.closed_socket import closed_socket, quiet_on_closed_socket


@pytest.fixture
def main_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Makes this process look as if it ran ``python -m <name>``; restores its hooks."""

    def run_as(name: str) -> None:
        main = types.ModuleType("__main__")
        main.__spec__ = ModuleSpec(name, None)
        main.worker = _closed  # type: ignore[attr-defined] - as PySpark's daemon has one
        monkeypatch.setitem(sys.modules, "__main__", main)

    stdout, excepthook = sys.stdout, sys.excepthook
    yield run_as
    sys.stdout, sys.excepthook = stdout, excepthook


def _chain(*errors: BaseException) -> BaseException:
    """The last error, raised while handling the one before, and so on."""
    for earlier, later in zip(errors, errors[1:], strict=False):
        later.__context__ = earlier
    return errors[-1]


def _closed(sock: object, authenticated: bool) -> int:
    """A daemon's worker whose socket the JVM closed."""
    raise _chain(EOFError(), BrokenPipeError())


def test_closed_socket_errors_are_told_from_others() -> None:
    assert closed_socket(_chain(EOFError(), BrokenPipeError(), BrokenPipeError()))
    assert closed_socket(ConnectionResetError())
    assert not closed_socket(_chain(ValueError("the source failed"), BrokenPipeError()))
    assert not closed_socket(_chain(EOFError(), KeyError("x")))
    assert not closed_socket(None)


def test_pre_init_prints_go_nowhere(
    main_module: Callable[[str], None], capsys: pytest.CaptureFixture[str]
) -> None:
    main_module(PRE_INIT_MODULE)
    quiet_pre_init()
    print("Streaming TransformWithStateInPandas Python worker finish init stage")
    sys.stdout.flush()
    assert capsys.readouterr().out == ""


def test_other_processes_are_left_alone(main_module: Callable[[str], None]) -> None:
    main_module("beam_spark_runner.spark.worker_daemon")
    stdout, excepthook = sys.stdout, sys.excepthook
    quiet_pre_init()
    quiet_daemon_child()
    assert (sys.stdout, sys.excepthook) == (stdout, excepthook)
    assert sys.modules["__main__"].worker is _closed


def test_a_daemon_worker_ends_on_a_closed_socket_without_a_traceback() -> None:
    """PySpark's daemon prints what its ``worker`` raises; a closed socket is not raised."""

    def failing(sock: object, authenticated: bool) -> int:
        raise _chain(BrokenPipeError(), MemoryError())

    assert quiet_on_closed_socket(_closed)(None, True) == 1
    assert quiet_on_closed_socket(lambda sock, authenticated: 0)(None, True) == 0
    with pytest.raises(MemoryError):
        quiet_on_closed_socket(failing)(None, True)


def test_a_worker_of_pysparks_own_daemon_is_wrapped_once(
    main_module: Callable[[str], None],
) -> None:
    """Imported in a worker forked by ``pyspark.daemon``: the daemon's worker is wrapped once."""
    main_module(PLAIN_DAEMON_MODULE)
    quiet_daemon_child()
    wrapped = sys.modules["__main__"].worker
    assert wrapped is not _closed
    assert wrapped(None, True) == 1
    quiet_daemon_child()  # imported again in the same worker
    assert sys.modules["__main__"].worker is wrapped


def test_pysparks_data_source_lookup_imports_the_quieting_module_and_registers_nothing(
    main_module: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup worker runs none of the runner's code but the top-level module it imports.

    PySpark's own lookup (``lookup_data_sources._main``) finds ``pyspark_beam_spark_runner``
    by its name, registers no data source from it, and its worker is wrapped after.
    """
    pytest.importorskip("pyspark.sql.datasource", reason="Python data sources: PySpark 4.0+")
    import importlib
    import io
    import pkgutil

    from pyspark.sql.worker import lookup_data_sources

    main_module(PLAIN_DAEMON_MODULE)
    monkeypatch.delitem(sys.modules, "pyspark_beam_spark_runner", raising=False)
    lookup = getattr(lookup_data_sources, "_main", None)
    if lookup is not None:  # PySpark 4.1 and later: the lookup apart from the worker's protocol
        lookup(io.BytesIO(), io.BytesIO())
    else:  # PySpark 4.0: the same rule, inside its worker's ``main``
        for info in pkgutil.iter_modules():
            if info.name.startswith("pyspark_"):
                importlib.import_module(info.name)
    assert "pyspark_beam_spark_runner" in sys.modules
    assert not hasattr(sys.modules["pyspark_beam_spark_runner"], "DefaultSource")
    assert sys.modules["__main__"].worker is not _closed
    assert sys.modules["__main__"].worker(None, True) == 1
    main_module("some_program")  # imported anywhere else, it changes nothing
    monkeypatch.delitem(sys.modules, "pyspark_beam_spark_runner")
    import pyspark_beam_spark_runner  # noqa: F401

    assert sys.modules["__main__"].worker is _closed


def test_the_module_imports_no_beam(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    code = f"import sys, {driver_processes.__name__}; print('apache_beam' in sys.modules)"
    result = run_python(["-c", code])
    assert result.stdout.strip() == "False", result.stderr


STREAMING_SCRIPT = textwrap.dedent(
    """
    import sys

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    from apache_beam.utils.timestamp import Timestamp

    with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as pipeline:
        ticks = pipeline | PeriodicImpulse(
            data=[(Timestamp(i), i) for i in range(3)], fire_interval=1
        )
        assert_that(ticks | beam.Map(lambda i: i * 2), equal_to([0, 2, 4]))
    """
)


@pytest.mark.slow
def test_a_streaming_pipeline_prints_no_noise(
    run_python: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    beam_options: list[str],
) -> None:
    """What a streaming pipeline's run leaves on the console: none of PySpark's chatter.

    Nor a traceback from a Python process ending on its closed socket when the query or the
    session stops, nor the error of the next micro-batch's broadcast that the stop
    interrupts (the quiet log profile drops it).
    """
    script = tmp_path / "streaming.py"
    script.write_text(STREAMING_SCRIPT, encoding="utf-8")
    result = run_python([str(script), *beam_options], timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    for noise in (
        "TransformWithStateInPandas Python worker",  # the pre-init's prints
        "Disabling AQE",
        "No more data to read from the socket",
        "Cannot find active jobs",
        "Store broadcast",  # the next batch's broadcast, interrupted by the stop
    ):
        assert noise not in output, output
