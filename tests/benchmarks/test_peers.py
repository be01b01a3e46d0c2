"""The hand-written peers' Spark sessions: the settings of the runner's own session."""

from __future__ import annotations

from apache_beam.options.pipeline_options import PipelineOptions

from beam_spark_runner.options import spark_settings
from beam_spark_runner.spark import compat as spark_compat
from beam_spark_runner.spark.session import JAVA_OPTIONS, local_driver_memory, session_conf
from benchmarks import peers


def test_the_peers_settings_are_those_of_the_session_the_runner_creates() -> None:
    master = "local[2]"
    runner = session_conf(master, spark_settings(PipelineOptions([f"--spark_master={master}"])))
    conf = peers.runner_conf(master)
    assert runner.items() <= conf.items()
    assert conf["spark.sql.shuffle.partitions"] == "2"
    assert conf["spark.driver.memory"] == local_driver_memory()
    assert "-XX:TieredStopAtLevel=1" in conf[JAVA_OPTIONS].split()
    assert conf["spark.sql.adaptive.enabled"] == "false"
    if spark_compat.has_unix_domain_sockets():
        assert conf[spark_compat.UNIX_DOMAIN_SOCKETS] == "true"


def test_sparks_default_jit_drops_only_the_c1_only_option() -> None:
    conf = peers.runner_conf("local[2]")
    default = peers.with_default_jit(conf)
    assert "-XX:TieredStopAtLevel" not in default.get(JAVA_OPTIONS, "")
    assert {k: v for k, v in default.items() if k != JAVA_OPTIONS} == {
        k: v for k, v in conf.items() if k != JAVA_OPTIONS
    }
    assert peers.with_default_jit({JAVA_OPTIONS: "-XX:TieredStopAtLevel=1"}) == {}
    kept = peers.with_default_jit({JAVA_OPTIONS: "-XX:TieredStopAtLevel=1 -Dx=y"})
    assert kept == {JAVA_OPTIONS: "-Dx=y"}
