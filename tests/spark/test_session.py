"""The settings of the sessions the runner creates (Spark started by the last test only)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from beam_spark_runner.options import SparkSettings
from beam_spark_runner.spark import compat as spark_compat
from beam_spark_runner.spark import session
from beam_spark_runner.spark.session import (
    LOCAL_DRIVER_JAVA_OPTIONS,
    QUIET_LOG4J_PROFILE,
    session_conf,
)

QUIET = f"-Dlog4j2.configurationFile={QUIET_LOG4J_PROFILE.as_uri()}"


def _settings(log_level: str = "WARN", **conf: str) -> SparkSettings:
    return SparkSettings(
        master=None, conf=dict(conf), app_name="t", default_parallelism=None, log_level=log_level
    )


def test_local_sessions_compile_with_c1_only() -> None:
    conf = session_conf("local[2]", _settings())
    assert conf["spark.driver.defaultJavaOptions"] == f"{LOCAL_DRIVER_JAVA_OPTIONS} {QUIET}"
    assert "-XX:TieredStopAtLevel=1" in LOCAL_DRIVER_JAVA_OPTIONS
    assert conf["spark.python.daemon.module"] == "beam_spark_runner.spark.worker_daemon"


def test_a_local_session_for_a_streaming_query_compiles_with_c2_too() -> None:
    conf = session_conf("local[2]", _settings(), streaming=True)
    assert conf["spark.driver.defaultJavaOptions"] == QUIET
    assert "TieredStopAtLevel" not in conf["spark.driver.defaultJavaOptions"]
    info = session_conf("local[2]", _settings(log_level="INFO"), streaming=True)
    assert "spark.driver.defaultJavaOptions" not in info
    # The user's options still win.
    mine = {"spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1"}
    chosen = session_conf("local[2]", _settings(**mine), streaming=True)
    assert chosen["spark.driver.defaultJavaOptions"] == "-XX:TieredStopAtLevel=1"


def test_a_local_sessions_settings_include_a_shuffle_partition_per_core() -> None:
    conf = session.local_session_conf("local[2]", _settings())
    assert conf == {**session_conf("local[2]", _settings()), "spark.sql.shuffle.partitions": "2"}
    chosen = session.local_session_conf(
        "local[3]", _settings(**{"spark.sql.shuffle.partitions": "7"})
    )
    assert chosen["spark.sql.shuffle.partitions"] == "7"
    assert session.local_cores("local") == 1
    assert session.local_cores("local[4,2]") == 4
    assert session.local_cores("local[*]") == (os.cpu_count() or 1)
    with pytest.raises(ValueError, match="not a local"):
        session.local_cores("local-cluster[2,1,1024]")


def test_users_java_options_win_and_remote_masters_keep_the_jvm_default() -> None:
    mine = {"spark.driver.defaultJavaOptions": "-Xss4m"}
    assert session_conf("local[*]", _settings(**mine))["spark.driver.defaultJavaOptions"] == (
        "-Xss4m"
    )
    remote = session_conf("spark://host:7077", _settings())
    assert remote["spark.driver.defaultJavaOptions"] == QUIET
    assert "spark.python.daemon.module" not in remote


def test_the_quiet_log_profile_only_at_the_default_log_level() -> None:
    assert QUIET_LOG4J_PROFILE.is_file()
    profile = QUIET_LOG4J_PROFILE.read_text(encoding="utf-8")
    assert "org.apache.spark.executor.Executor" in profile
    info = session_conf("local[2]", _settings(log_level="INFO"))
    assert info["spark.driver.defaultJavaOptions"] == LOCAL_DRIVER_JAVA_OPTIONS
    assert "spark.driver.defaultJavaOptions" not in session_conf(
        "yarn", _settings(log_level="DEBUG")
    )


def test_local_sessions_get_a_quarter_of_the_memory_within_bounds(monkeypatch) -> None:
    from beam_spark_runner.spark import session

    sizes = {"SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(session.os, "sysconf", lambda name: sizes[name])
    for physical_gib, expected in [(24, "6144m"), (2, "1024m"), (256, "8192m")]:
        sizes["SC_PHYS_PAGES"] = physical_gib * (1 << 30) // 4096
        assert session_conf("local[2]", _settings())["spark.driver.memory"] == expected
    assert (
        session_conf("local[2]", _settings(**{"spark.driver.memory": "2g"}))["spark.driver.memory"]
        == "2g"
    )
    assert "spark.driver.memory" not in session_conf("spark://host:7077", _settings())


@pytest.mark.parametrize(
    ("key", "older", "first", "value", "other"),
    [
        # Python workers over Unix domain sockets (Spark 4.1+).
        (spark_compat.UNIX_DOMAIN_SOCKETS, (4, 0), (4, 1), "true", "false"),
        # No DataFrame call sites recorded (Spark 4.0+).
        (spark_compat.DATAFRAME_DEBUGGING, (3, 5), (4, 0), "false", "true"),
    ],
)
def test_version_gated_settings_apply_where_pyspark_has_them(
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    older: tuple[int, int],
    first: tuple[int, int],
    value: str,
    other: str,
) -> None:
    monkeypatch.setattr(spark_compat, "pyspark_version", lambda: older)
    assert key not in session_conf("local[2]", _settings())
    monkeypatch.setattr(spark_compat, "pyspark_version", lambda: first)
    assert session_conf("local[2]", _settings())[key] == value
    assert session_conf("spark://host:7077", _settings())[key] == value
    assert session_conf("local[2]", _settings(**{key: other}))[key] == other  # the user's


def test_an_embedded_session_binds_to_loopback_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert session.bind_to_loopback({})
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.5")
    assert not session.bind_to_loopback({})
    assert os.environ["SPARK_LOCAL_IP"] == "10.0.0.5"
    monkeypatch.delenv("SPARK_LOCAL_IP")
    assert not session.bind_to_loopback({"spark.driver.bindAddress": "0.0.0.0"})
    assert "SPARK_LOCAL_IP" not in os.environ


def test_sessions_the_runner_creates_run_without_adaptive_execution() -> None:
    key = session.ADAPTIVE_EXECUTION
    assert session_conf("local[2]", _settings())[key] == "false"
    assert session_conf("spark://host:7077", _settings())[key] == "false"
    assert session_conf("local[2]", _settings(**{key: "true"}))[key] == "true"  # the user's


def _job_groups(spark: Any) -> list[str]:
    """The job group of every job the session ran (Spark's status store)."""
    jobs = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    groups = (jobs.apply(i).jobGroup() for i in range(jobs.size()))
    return [group.get() for group in groups if group.isDefined()]


def test_a_pipeline_with_several_shuffles_is_one_spark_job(beam_options: list[str]) -> None:
    # With adaptive execution each shuffle's map side was a Spark job of its own (here,
    # four: two GroupByKeys and assert_that's CoGroupByKey over two inputs).
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from beam_spark_runner.options import spark_settings

    options = PipelineOptions([*beam_options, "--job_name=one-spark-job"])
    spark, _ = session.obtain_session(spark_settings(options))
    before = len([g for g in _job_groups(spark) if g.startswith("beam-one-spark-job-")])
    with beam.Pipeline(options=options) as pipeline:
        grouped = (
            pipeline
            | beam.Create(range(20))
            | "ByTens" >> beam.Map(lambda n: (n // 10, n))
            | "Group" >> beam.GroupByKey()
            | "Sizes" >> beam.MapTuple(lambda key, values: (key % 2, len(list(values))))
            | "Regroup" >> beam.GroupByKey()
            | "Sum" >> beam.MapTuple(lambda key, sizes: (key, sum(sizes)))
        )
        assert_that(grouped, equal_to([(0, 10), (1, 10)]))
    groups = [g for g in _job_groups(spark) if g.startswith("beam-one-spark-job-")]
    assert len(groups) - before == 1, groups


def test_the_test_sessions_ui_listens_on_loopback(beam_options: list[str]) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_spark_runner.options import spark_settings

    spark, _ = session.obtain_session(spark_settings(PipelineOptions(beam_options)))
    url = spark.sparkContext.uiWebUrl
    if url is None:
        pytest.skip("the Spark UI is disabled in this session")
    if os.environ.get("SPARK_LOCAL_IP") != session.LOOPBACK:
        pytest.skip("this environment chose its own SPARK_LOCAL_IP")
    assert "127.0.0.1" in url or "localhost" in url, url


def test_the_test_session_talks_to_its_workers_as_the_runner_chose(spark_session: Any) -> None:
    # The runner's own session, as every Spark test here runs on it.
    expected = "true" if spark_compat.has_unix_domain_sockets() else "false"
    setting = spark_session.sparkContext.getConf().get(spark_compat.UNIX_DOMAIN_SOCKETS, "false")
    assert setting == expected


def test_the_test_session_records_no_dataframe_call_sites(spark_session: Any) -> None:
    from pyspark.errors import utils as pyspark_error_utils

    if not spark_compat.has_dataframe_debugging():
        pytest.skip("this PySpark records no DataFrame call sites")
    conf = spark_session.sparkContext.getConf()
    assert conf.get(spark_compat.DATAFRAME_DEBUGGING) == "false"
    assert not pyspark_error_utils.is_debugging_enabled()


def test_a_services_files_class_names_are_read_without_comments_or_blank_lines() -> None:
    text = "# licence\n\n org.example.First  # the first\norg.example.Second\n#\n"
    assert spark_compat.provider_names(text) == ["org.example.First", "org.example.Second"]


def test_the_extension_providers_are_read_from_the_jvms_class_path(
    spark_session: Any, tmp_path: Any
) -> None:
    # The installed Spark's own, through Spark's class loader, then one more in a loader of
    # its own: a jar or directory a user adds (--jars) names its provider the same way.
    jvm = spark_session.sparkContext._jvm
    own = spark_compat.session_extension_providers(jvm)
    if spark_compat.pyspark_version() >= (4, 0):
        assert spark_compat.MLLIB_FUNCTIONS_PROVIDER in own
    services = tmp_path / "META-INF" / "services"
    services.mkdir(parents=True)
    (services / "org.apache.spark.sql.SparkSessionExtensionsProvider").write_text(
        "org.example.Extensions\n", encoding="utf-8"
    )
    gateway = spark_session.sparkContext._gateway
    urls = gateway.new_array(jvm.java.net.URL, 1)
    urls[0] = jvm.java.io.File(str(tmp_path)).toURI().toURL()
    parent = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    loader = jvm.java.net.URLClassLoader(urls, parent)
    assert spark_compat.session_extension_providers(jvm, loader) == [
        *own,
        "org.example.Extensions",
    ]


@pytest.mark.parametrize(
    ("providers", "conf", "skipped"),
    [
        ([spark_compat.MLLIB_FUNCTIONS_PROVIDER], {}, True),
        ([spark_compat.MLLIB_FUNCTIONS_PROVIDER, "org.example.Extensions"], {}, False),
        ([], {}, False),
        (
            [spark_compat.MLLIB_FUNCTIONS_PROVIDER],
            {spark_compat.SESSION_EXTENSIONS_FROM_CLASS_PATH: "true"},
            False,
        ),
    ],
    ids=["mllib-only", "with-another", "none", "the-users-choice"],
)
def test_mllibs_session_functions_stay_out_only_when_no_other_provider_needs_loading(
    spark_session: Any, monkeypatch: Any, providers: list[str], conf: dict[str, str], skipped: bool
) -> None:
    monkeypatch.setattr(spark_compat, "session_extension_providers", lambda jvm: providers)
    chosen = dict(conf)
    assert session.without_mllib_session_functions(chosen) is skipped
    key = spark_compat.SESSION_EXTENSIONS_FROM_CLASS_PATH
    assert chosen == ({**conf, key: "false"} if skipped else conf)


def test_the_test_sessions_jvm_never_registered_mllibs_session_functions(
    spark_session: Any,
) -> None:
    # 1.6 s of a process's first session went to this registration (docs/performance.md).
    if spark_compat.pyspark_version() < (4, 0):
        pytest.skip("MLlib registers no session functions before Spark 4")
    conf = spark_session.sparkContext.getConf()
    assert conf.get(spark_compat.SESSION_EXTENSIONS_FROM_CLASS_PATH) == "false"
    jvm = spark_session.sparkContext._jvm
    catalyst = jvm.org.apache.spark.sql.catalyst
    name = getattr(getattr(catalyst, "FunctionIdentifier$"), "MODULE$").apply("vector_to_array")
    registry = getattr(getattr(catalyst.analysis, "FunctionRegistry$"), "MODULE$").internal()
    assert not registry.functionExists(name)
    # What the runner skipped is there to be loaded: the check above can fail.
    jvm.java.lang.Class.forName("org.apache.spark.sql.ml.InternalFunctionRegistration$")
    assert registry.functionExists(name)


def test_interpreted_sql_applies_within_and_restores_the_sessions_own_values(
    spark_session: Any,
) -> None:
    conf = spark_session.conf
    whole_stage, factory = session.WHOLE_STAGE_CODEGEN, session.CODEGEN_FACTORY_MODE
    conf.set(whole_stage, "true")  # the session's own value, to come back
    conf.unset(factory)
    try:
        with session.interpreted_sql(spark_session, _settings(), owned=True):
            assert conf.get(whole_stage) == "false"
            assert conf.get(factory) == "NO_CODEGEN"
        assert conf.get(whole_stage) == "true"
        assert conf.get(factory, None) is None
        # Not on a session the runner did not create, nor over a setting the user chose.
        with session.interpreted_sql(spark_session, _settings(), owned=False):
            assert conf.get(factory, None) is None
        with session.interpreted_sql(spark_session, _settings(**{factory: "FALLBACK"}), True):
            assert conf.get(factory, None) is None
            assert conf.get(whole_stage) == "false"
        assert conf.get(whole_stage) == "true"
    finally:
        conf.unset(whole_stage)
        conf.unset(factory)


def _sql_plans(spark: Any, description_prefix: str) -> list[str]:
    store = spark._jsparkSession.sharedState().statusStore()
    executions = store.executionsList()
    found = (executions.apply(i) for i in range(executions.size()))
    return [
        e.physicalPlanDescription() for e in found if e.description().startswith(description_prefix)
    ]


def _owned_session(beam_options: list[str], job_name: str) -> tuple[Any, Any]:
    """Pipeline options named ``job_name`` and the session the runner created for them."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_spark_runner.options import spark_settings

    options = PipelineOptions([*beam_options, f"--job_name={job_name}"])
    spark, owned = session.obtain_session(spark_settings(options))
    assert owned
    return options, spark


def test_a_batch_pipelines_job_runs_spark_operators_interpreted(beam_options: list[str]) -> None:
    # Without interpreted_sql the sort before the GroupByKey's stage and the projection
    # after the first stage are whole-stage code generated ("[codegen id : 1]" in the plan).
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    options, spark = _owned_session(beam_options, "interpreted-sql")
    before = len(_sql_plans(spark, "Beam pipeline interpreted-sql"))
    with beam.Pipeline(options=options) as pipeline:
        grouped = (
            pipeline
            | beam.Create(range(20))
            | beam.Map(lambda n: (n % 2, n))
            | beam.GroupByKey()
            | beam.MapTuple(lambda key, values: (key, len(list(values))))
        )
        assert_that(grouped, equal_to([(0, 10), (1, 10)]))
    plans = _sql_plans(spark, "Beam pipeline interpreted-sql")[before:]
    assert plans and all("Sort" in plan for plan in plans), plans
    assert not any("codegen id" in plan for plan in plans), plans
    assert spark.conf.get(session.CODEGEN_FACTORY_MODE, None) is None
    assert spark.conf.get(session.WHOLE_STAGE_CODEGEN) == "true"


def test_a_streaming_pipelines_query_runs_spark_operators_interpreted(
    beam_options: list[str],
) -> None:
    # A micro-batch's plan sorts each stateful level's input: whole-stage code generated
    # ("[codegen id : 1]") without the query's settings. The session keeps its own.
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    from apache_beam.transforms.window import FixedWindows
    from apache_beam.utils.timestamp import Timestamp

    options, spark = _owned_session(beam_options, "interpreted-streaming")
    before = len(_sql_plans(spark, "beam-"))
    with beam.Pipeline(options=options) as pipeline:
        counted = (
            pipeline
            | PeriodicImpulse(
                data=[(Timestamp(t), v) for t, v in [(1, 1), (2, 2), (7, 3)]], fire_interval=1
            )
            | beam.WindowInto(FixedWindows(5))
            | beam.Map(lambda value: ("key", value))
            | beam.GroupByKey()
            | beam.MapTuple(lambda key, values: sorted(values))
        )
        assert_that(counted, equal_to([[1, 2], [3]]))
    plans = _sql_plans(spark, "beam-")[before:]
    # transformWithState (its pandas form on 4.0), applyInPandasWithState on 3.5.
    operators = ("TransformWithState", "FlatMapGroupsInPandasWithState")
    micro_batches = [plan for plan in plans if any(name in plan for name in operators)]
    assert micro_batches and all("Sort" in plan for plan in micro_batches), plans
    assert not any("codegen id" in plan for plan in plans), plans
    assert spark.conf.get(session.CODEGEN_FACTORY_MODE, None) is None
    assert spark.conf.get(session.WHOLE_STAGE_CODEGEN) == "true"
