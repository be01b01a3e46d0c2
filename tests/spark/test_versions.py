"""What differs between the Spark lines we support, checked on whichever line is installed.

The nox matrix (``noxfile.py``) runs this file on PySpark 3.5, 4.0 and the newest 4.x, and
on the oldest apache-beam we support; each session says which versions it pinned in
``BEAM_SPARK_RUNNER_EXPECT_PYSPARK`` / ``BEAM_SPARK_RUNNER_EXPECT_BEAM``, and the first tests
prove the session really runs on them.
"""

from __future__ import annotations

import os
from importlib import metadata

import pyspark
import pytest

from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.spark import compat as spark_compat
from beam_spark_runner.spark.java import required_java_major

INSTALLED = spark_compat.pyspark_version()

require_spark = getattr(spark_compat, "require_spark", None)
needs_require_spark = pytest.mark.skipif(
    require_spark is None, reason="beam_spark_runner.spark.compat.require_spark is missing"
)


@pytest.mark.parametrize(
    ("variable", "distribution"),
    [
        ("BEAM_SPARK_RUNNER_EXPECT_PYSPARK", "pyspark"),
        ("BEAM_SPARK_RUNNER_EXPECT_BEAM", "apache-beam"),
    ],
)
def test_session_runs_on_the_versions_it_pinned(variable, distribution):
    expected = os.environ.get(variable)
    if not expected:
        pytest.skip(f"{variable} is not set (set by the nox sessions)")
    assert metadata.version(distribution) == expected


def test_pyspark_version_is_the_installed_major_and_minor():
    major, minor = (int(part) for part in metadata.version("pyspark").split(".")[:2])
    assert INSTALLED == (major, minor)
    assert INSTALLED >= (3, 5), "the runner supports Spark 3.5 and later"


@pytest.mark.parametrize(
    ("version", "parsed"),
    [
        ("3.5.9", (3, 5)),
        ("3.5.0", (3, 5)),
        ("4.0.5", (4, 0)),
        ("4.3.0", (4, 3)),
        ("4.1.0.dev1", (4, 1)),
        ("4.2.0rc1", (4, 2)),
        ("10.0.0", (10, 0)),
    ],
)
def test_pyspark_version_parsing(monkeypatch, version, parsed):
    monkeypatch.setattr(pyspark, "__version__", version)
    assert spark_compat.pyspark_version() == parsed


@pytest.mark.parametrize(
    ("version", "java"),
    [("3.5.0", 8), ("3.5.9", 8), ("4.0.0", 17), ("4.0.5", 17), ("4.3.0", 17)],
)
def test_required_java_per_spark_line(monkeypatch, version, java):
    monkeypatch.setattr(pyspark, "__version__", version)
    assert required_java_major() == java


def test_required_java_of_the_installed_line():
    assert required_java_major() == (17 if INSTALLED >= (4, 0) else 8)


@needs_require_spark
def test_require_spark_accepts_the_installed_line():
    require_spark("anything", (3, 5))
    require_spark("anything", INSTALLED)


@needs_require_spark
def test_require_spark_names_the_version_a_feature_needs():
    with pytest.raises(UnsupportedFeatureError) as error:
        require_spark("Teleporting shuffles", (99, 1))
    message = str(error.value)
    assert "Teleporting shuffles" in message
    assert "Spark 99.1" in message
    assert pyspark.__version__ in message
    assert isinstance(error.value, NotImplementedError)


@needs_require_spark
def test_require_spark_on_this_line_for_a_spark_4_feature():
    """The per-line proof: a Spark 4.0 feature fails on 3.5, naming the version it needs."""
    if INSTALLED >= (4, 0):
        require_spark("A Spark 4 feature", (4, 0))
        return
    with pytest.raises(UnsupportedFeatureError, match=r"A Spark 4 feature needs Spark 4\.0"):
        require_spark("A Spark 4 feature", (4, 0))


def test_require_state_protocol_names_protobuf_when_its_runtime_is_too_old(monkeypatch):
    """A protobuf runtime older than PySpark's generated state protocol (Beam <= 2.68
    caps protobuf < 6) is refused before Spark starts, naming protobuf and what to do."""
    import sys

    if INSTALLED < (4, 0):
        pytest.skip("PySpark before 4.0 has no transformWithState state protocol")
    from google.protobuf import runtime_version

    def too_old(*args, **kwargs):
        raise runtime_version.VersionError("gencode 6.33.5 runtime 5.29.6")

    # Imported already in a process that ran streaming: make the import run again.
    import pyspark.sql.streaming.proto as proto_package

    monkeypatch.delitem(sys.modules, "pyspark.sql.streaming.proto.StateMessage_pb2", raising=False)
    monkeypatch.delattr(proto_package, "StateMessage_pb2", raising=False)
    monkeypatch.setattr(runtime_version, "ValidateProtobufRuntimeVersion", too_old)
    with pytest.raises(UnsupportedFeatureError, match=r"protobuf .*gencode 6\.33\.5") as error:
        spark_compat.require_state_protocol("Streaming")
    assert "apache-beam 2.69" in str(error.value)


def test_require_state_protocol_accepts_the_installed_protobuf():
    spark_compat.require_state_protocol("Streaming")


@pytest.mark.spark
def test_a_streaming_run_on_a_pyspark_without_it_is_refused_naming_the_version(run_python):
    """On a PySpark older than 3.5 (no ``pyspark.sql.datasource``, no transformWithState)
    a streaming run is refused before Spark starts, naming Spark 3.5 (which streams on
    applyInPandasWithState), not failed by an import. Run in a fresh interpreter with the
    missing module and the version stood in on newer lines."""
    code = (
        "import sys\n"
        "sys.modules['pyspark.sql.datasource'] = None\n"
        "import pyspark\n"
        "pyspark.__version__ = '3.4.3'\n"
        "import apache_beam as beam\n"
        "from apache_beam.options.pipeline_options import PipelineOptions\n"
        "from apache_beam.testing.test_stream import TestStream\n"
        "from beam_spark_runner import beam_internals as bi\n"
        "from beam_spark_runner.errors import UnsupportedFeatureError\n"
        "from beam_spark_runner.runner import SparkStructuredRunner\n"
        "options = PipelineOptions(['--streaming'])\n"
        "pipeline = beam.Pipeline(options=options)\n"
        "_ = pipeline | TestStream().add_elements([1]) | beam.Map(str)\n"
        "proto = pipeline.to_runner_api(default_environment=bi.default_environment())\n"
        "try:\n"
        "    SparkStructuredRunner().run_streaming(proto, options)\n"
        "except UnsupportedFeatureError as error:\n"
        "    print(error)\n"
        "print('spark started' if 'pyspark.sql.session' in sys.modules and "
        "pyspark.sql.SparkSession._instantiatedSession else 'no spark')\n"
    )
    completed = run_python(["-c", code])
    out = completed.stdout
    assert completed.returncode == 0, completed.stderr
    assert "needs Spark 3.5" in out, out
    assert "3.4.3" in out, out
    assert out.strip().endswith("no spark"), out
