"""Validation of the runner's pipeline options (no Spark needed)."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner.options import (
    DEFAULT_MASTER,
    SPARK_LOG_LEVELS,
    SparkRunnerOptions,
    spark_settings,
)


def settings(*args: str):
    return spark_settings(PipelineOptions(list(args)))


@pytest.mark.parametrize(
    "master",
    [
        "local",
        "local[1]",
        "local[4]",
        "local[*]",
        "local[4,2]",
        "local[4, 2]",
        "local[*,3]",
        "local-cluster[2,1,1024]",
        "local-cluster[2, 1, 1024]",
        "spark://host:7077",
        "spark://10.0.0.1:7077,10.0.0.2:7077",
        "yarn",
        "k8s://https://host:443",
    ],
)
def test_valid_masters_are_accepted(master):
    assert settings(f"--spark_master={master}").master == master


def test_master_is_stripped():
    assert settings("--spark_master= local[2] ").master == "local[2]"


def test_master_defaults_to_none_meaning_active_or_embedded_session():
    assert settings().master is None
    assert DEFAULT_MASTER == "local[*]"


@pytest.mark.parametrize(
    "master",
    [
        "localhost",
        "local[]",
        "local[x]",
        "local[-1]",
        "local-cluster[2,1]",
        "spark://",
        "spark:/host:7077",
        "host:7077",
        "YARN-cluster",
        "k8s://",
        "",
    ],
)
def test_invalid_master_is_rejected_with_the_allowed_forms(master):
    with pytest.raises(ValueError) as error:
        settings(f"--spark_master={master}")
    message = str(error.value)
    assert f"--spark_master={master.strip()!r}" in message
    for form in (
        "local[4]",
        "local[*]",
        "local-cluster[2,1,1024]",
        "spark://host:7077",
        "yarn",
        "k8s://",
    ):
        assert form in message
    assert "mesos" not in message
    assert "Leave it unset" in message


def test_mesos_masters_are_refused_naming_the_alternatives():
    with pytest.raises(ValueError, match="Mesos masters are not supported") as error:
        settings("--spark_master=mesos://host:5050")
    assert "spark://host:7077" in str(error.value)


def test_spark_conf_is_parsed_into_a_dict():
    result = settings(
        "--spark_conf",
        "spark.executor.memory=4g",
        "--spark_conf=spark.sql.shuffle.partitions = 8",
        "--spark_conf",
        "spark.driver.extraJavaOptions=-Da=b -Dc=d",
        "--spark_conf",
        "spark.empty=",
    )
    assert result.conf == {
        "spark.executor.memory": "4g",
        "spark.sql.shuffle.partitions": "8",
        # Only the first '=' separates key and value.
        "spark.driver.extraJavaOptions": "-Da=b -Dc=d",
        "spark.empty": "",
    }


def test_spark_conf_defaults_to_empty():
    assert settings().conf == {}


def test_later_spark_conf_entry_wins():
    assert settings("--spark_conf=a=1", "--spark_conf=a=2").conf == {"a": "2"}


@pytest.mark.parametrize("entry", ["spark.executor.memory", "=4g", " =4g"])
def test_spark_conf_without_key_and_equals_is_rejected(entry):
    with pytest.raises(ValueError) as error:
        settings(f"--spark_conf={entry}")
    message = str(error.value)
    assert repr(entry) in message
    assert "KEY=VALUE" in message


def test_log_level_defaults_to_warn_and_is_case_insensitive():
    assert settings().log_level == "WARN"
    assert settings("--spark_log_level=info").log_level == "INFO"
    for level in SPARK_LOG_LEVELS:
        assert settings(f"--spark_log_level={level}").log_level == level


@pytest.mark.parametrize("level", ["verbose", "WARNING", "5"])
def test_invalid_log_level_lists_the_allowed_values(level):
    with pytest.raises(ValueError) as error:
        settings(f"--spark_log_level={level}")
    message = str(error.value)
    assert repr(level) in message
    for allowed in ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN"):
        assert allowed in message


@pytest.mark.parametrize("parallelism", [0, -1, -8])
def test_parallelism_below_one_is_rejected(parallelism):
    with pytest.raises(ValueError, match="must be a positive number of partitions"):
        settings(f"--spark_default_parallelism={parallelism}")


def test_parallelism():
    assert settings().default_parallelism is None
    assert settings("--spark_default_parallelism=1").default_parallelism == 1
    assert settings("--spark_default_parallelism=16").default_parallelism == 16


def test_app_name_defaults_to_the_job_name_then_to_the_package_name():
    assert settings().app_name == "beam-spark-runner"
    assert settings("--job_name=wordcount").app_name == "wordcount"
    assert settings("--job_name=wordcount", "--spark_app_name=mine").app_name == "mine"
    assert settings("--spark_app_name=mine").app_name == "mine"


def test_options_are_visible_through_the_options_view():
    options = PipelineOptions(["--spark_master=local[2]", "--spark_conf=a=b"])
    view = options.view_as(SparkRunnerOptions)
    assert view.spark_master == "local[2]"
    assert view.spark_conf == ["a=b"]
    assert options.get_all_options()["spark_master"] == "local[2]"


def test_drain_is_off_by_default_and_adds_the_sdf_truncate_step() -> None:
    import apache_beam as beam

    from beam_spark_runner import beam_internals as bi
    from beam_spark_runner.planning import build_plan

    assert settings().drain is False
    assert settings("--spark_drain").drain is True

    p = beam.Pipeline()
    _ = p | beam.io.ReadFromText("/nonexistent/input*.txt", validate=False)
    proto = bi.prepare_pipeline_proto(p.to_runner_api())
    truncate = bi.common_urns.sdf_components.TRUNCATE_SIZED_RESTRICTION.urn

    def urns(drain: bool) -> set[str]:
        plan = build_plan(proto, is_drain=drain)
        return {t.spec.urn for s in plan.stages for t in s.descriptor.transforms.values()}

    assert truncate not in urns(False)
    assert truncate in urns(True)
