"""``--runner=SparkStructuredRunner`` works in a fresh interpreter, with nothing imported.

Beam resolves runner names from a table built when ``apache_beam.runners.runner`` is
imported. The ``beam_spark_runner_startup.pth`` file installed with the package adds our
entry to that table, so these tests must run in a new interpreter: in this one, pytest has
already imported everything. They run outside the source tree, so that they see the
installed package as users do.
"""

from __future__ import annotations

import json
import textwrap
import types

from beam_spark_runner import _startup_hook
from beam_spark_runner._version import __version__

RUNNER_CLASS = "beam_spark_runner.runner.SparkStructuredRunner"


def run_fresh(run_python, tmp_path, code: str) -> dict:
    """Runs ``code`` in a new interpreter; it must print one JSON object as its last line."""
    completed = run_python(["-c", textwrap.dedent(code)], timeout=120, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_create_runner_resolves_our_runner_without_importing_it_first(run_python, tmp_path):
    result = run_fresh(
        run_python,
        tmp_path,
        """
        import json, sys
        imported_before = "beam_spark_runner.runner" in sys.modules
        from apache_beam.runners.runner import create_runner
        classes = {}
        for name in (
            "SparkStructuredRunner",
            "sparkstructuredrunner",
            "SparkStructured",
            "beam_spark_runner.runner.SparkStructuredRunner",
        ):
            runner = create_runner(name)
            classes[name] = type(runner).__module__ + "." + type(runner).__qualname__
        print(json.dumps({"imported_before": imported_before, "classes": classes}))
        """,
    )
    assert result == {
        "imported_before": False,
        "classes": {
            "SparkStructuredRunner": RUNNER_CLASS,
            "sparkstructuredrunner": RUNNER_CLASS,
            "SparkStructured": RUNNER_CLASS,
            RUNNER_CLASS: RUNNER_CLASS,
        },
    }


def test_pipeline_options_runner_name_resolves(run_python, tmp_path):
    """What users write: ``Pipeline(options=PipelineOptions(['--runner=...']))``."""
    result = run_fresh(
        run_python,
        tmp_path,
        """
        import json
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions

        pipeline = beam.Pipeline(options=PipelineOptions(["--runner=SparkStructuredRunner"]))
        runner = type(pipeline.runner)
        print(json.dumps({"class": runner.__module__ + "." + runner.__qualname__}))
        """,
    )
    assert result == {"class": RUNNER_CLASS}


def test_interpreter_start_and_package_import_load_neither_spark_nor_beam(run_python, tmp_path):
    """Nor ``typing`` and ``importlib.abc``: every Python process of the environment runs the
    hook, and those two made a bare interpreter start take 43-53 ms instead of 16-20 ms."""
    result = run_fresh(
        run_python,
        tmp_path,
        """
        import json, sys

        def heavy():
            return sorted(
                name for name in sys.modules
                if name.split(".")[0] in ("pyspark", "py4j", "apache_beam", "pyarrow")
                or name in ("typing", "importlib.abc")
            )

        at_start = heavy()
        hook_installed = any(
            type(finder).__name__ == "_RunnerTableFinder" for finder in sys.meta_path
        )
        import beam_spark_runner
        print(json.dumps({
            "at_start": at_start,
            "hook_installed": hook_installed,
            "after_import": heavy(),
            "version": beam_spark_runner.__version__,
        }))
        """,
    )
    assert result == {
        "at_start": [],
        "hook_installed": True,
        "after_import": [],
        "version": __version__,
    }


def test_register_adds_our_entry_and_keeps_existing_ones():
    runner_map = {"directrunner": "apache_beam.runners.direct.direct_runner.DirectRunner"}
    module = types.ModuleType("fake_runner_module")
    module.__dict__["_RUNNER_MAP"] = runner_map
    _startup_hook.register(module)
    assert runner_map == {
        "directrunner": "apache_beam.runners.direct.direct_runner.DirectRunner",
        "sparkstructuredrunner": RUNNER_CLASS,
    }

    runner_map["sparkstructuredrunner"] = "somebody.else.Runner"
    _startup_hook.register(module)
    assert runner_map["sparkstructuredrunner"] == "somebody.else.Runner"


def _spark_home_layout(site, py4j_installed="0.10.9.9"):
    """A pip-installed PySpark under ``site``: the package, its zips, and py4j."""
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    lib = site / "pyspark" / "python" / "lib"
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / "py4j-0.10.9.9-src.zip").write_bytes(b"")
    (site / f"py4j-{py4j_installed}.dist-info").mkdir()
    return str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")


def test_sparks_zips_give_way_to_the_same_installed_packages(tmp_path):
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _spark_home_layout(site)
    other = str(tmp_path / "elsewhere" / "pyspark.zip")
    path = [pyspark_zip, py4j_zip, other, "/tmp", str(site)]
    assert _startup_hook.prefer_installed_pyspark(path) == [pyspark_zip, py4j_zip]
    assert path == [other, "/tmp", str(site)]


def test_sparks_zips_stay_where_the_installed_copy_differs_or_is_not_on_the_path(tmp_path):
    site = tmp_path / "site-packages"
    pyspark_zip, py4j_zip = _spark_home_layout(site, py4j_installed="0.10.9.7")
    path = [pyspark_zip, py4j_zip, str(site)]
    # Another py4j is installed: its zip stays.
    assert _startup_hook.prefer_installed_pyspark(path) == [pyspark_zip]
    assert path == [py4j_zip, str(site)]
    # The site directory is not on the path: nothing would replace the zips.
    path = [pyspark_zip, py4j_zip]
    assert _startup_hook.prefer_installed_pyspark(path) == []
    assert path == [pyspark_zip, py4j_zip]


def test_spark_python_workers_import_the_installed_pyspark(spark_session):
    """Spark puts pyspark.zip first on its workers' path; they import the installed copy."""

    def where(_):
        import pyspark

        return pyspark.__file__

    (found,) = spark_session.sparkContext.parallelize([0], 1).map(where).collect()
    assert ".zip" not in found
    assert found.endswith("pyspark/__init__.py")


def test_a_streaming_pre_init_process_prints_nothing_from_its_start(run_python, tmp_path):
    """PySpark's pre-init process of a stateful level printed to the driver's console.

    Its first line ("Starting Streaming TransformWithStateInPandas Python worker.") came
    before anything of the runner's was unpickled there: the start-up hook silences the
    process's standard output as it starts. A stand-in module of the same name prints it.
    """
    package = tmp_path / "pyspark" / "sql" / "streaming"
    package.mkdir(parents=True)
    for directory in (tmp_path / "pyspark", tmp_path / "pyspark" / "sql", package):
        (directory / "__init__.py").write_text("", encoding="utf-8")
    (package / "transform_with_state_driver_worker.py").write_text(
        "import sys\n"
        'print("Starting Streaming TransformWithStateInPandas Python worker.")\n'
        'print("still running", file=sys.stderr)\n',
        encoding="utf-8",
    )
    completed = run_python(["-m", _startup_hook.PRE_INIT_MODULE], cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "still running" in completed.stderr
    assert completed.stdout == ""
    # Any other module keeps its output.
    (tmp_path / "other.py").write_text('print("kept")\n', encoding="utf-8")
    assert run_python(["-m", "other"], cwd=tmp_path).stdout == "kept\n"


def test_only_the_module_run_with_dash_m_counts_as_the_pre_init():
    module = _startup_hook.PRE_INIT_MODULE
    assert _startup_hook.runs_module(["python", "-u", "-m", module], module)
    assert not _startup_hook.runs_module(["python", "-m", "other", "-m", module], module)
    assert not _startup_hook.runs_module(["python", "-c", "pass", module], module)
    assert not _startup_hook.runs_module(["python", "-m"], module)
    assert not _startup_hook.runs_module([], module)
