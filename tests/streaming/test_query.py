"""The query's driver side without Spark: how a stopped query's interrupted batch ends."""

from __future__ import annotations

import re
from typing import Any

import pytest

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.spark.session import SIMPLIFIED_TRACEBACK, settings_within

if pyspark_version() < OLDEST_STREAMING_SPARK:
    pytest.skip("the query module needs PySpark 3.5+", allow_module_level=True)

from beam_spark_runner.streaming.query import (
    ROCKSDB_PROVIDER,
    SIMPLIFIED_TRACEBACK_CONF,
    STATE_STORE_PROVIDER_CONF,
    ensure_state_store,
    one_worker_daemon,
)
from beam_spark_runner.streaming.sink_watch import QueryInterrupted, is_interruption

# A session's own setting the runner leaves alone (query.ensure_state_store says why).
CHANGELOG_CHECKPOINTING_CONF = (
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
)

# Spark's StreamExecution.PROXY_ERROR, which it matches against a foreachBatch error's text
# to tell an interruption by stop() from a failure.
SPARK_PROXY_ERROR = re.compile(
    r"py4j\.protocol\.Py4JJavaError: An error occurred while calling"
    r"((.|\r\n|\r|\n)*)(java\.lang\.InterruptedException|java\.io\.InterruptedIOException|"
    r"java\.nio\.channels\.ClosedByInterruptException)"
)
# Spark 3.5's: the exception's name after a line break and ": ".
SPARK_3_5_PROXY_ERROR = re.compile(
    r"py4j\.protocol\.Py4JJavaError: An error occurred while calling"
    r".+(\r\n|\r|\n): (java\.lang\.InterruptedException|java\.io\.InterruptedIOException|"
    r"java\.nio\.channels\.ClosedByInterruptException)"
)


class Py4JJavaError(Exception):  # noqa: N818 - Py4J's name, which is_interruption reads
    """Stands in for py4j's error: its text starts with the Java exception."""


def test_an_interrupted_collect_is_told_from_a_failure() -> None:
    stack = "".join(f"\tat org.apache.spark.Frame{i}(Frame.scala:{i})\n" for i in range(3000))
    assert is_interruption(
        Py4JJavaError(
            f"An error occurred while calling o227.collectToPython.\n: "
            f"java.lang.InterruptedException\n{stack}"
        )
    )
    assert not is_interruption(
        Py4JJavaError(f"An error occurred while calling o1.collectToPython.\n: boom\n{stack}")
    )
    assert not is_interruption(RuntimeError("java.lang.InterruptedException"))


def test_a_job_cancelled_by_the_query_stopping_is_an_interruption() -> None:
    """``query.stop()`` cancels the running job by the query's job group: no failure either.

    Re-raised as it was, its text (a Java stack trace) overflowed the stack of Spark's
    stream thread matching ``PROXY_ERROR`` against it, on about every other cancel.
    """
    stack = "".join(f"\tat org.apache.spark.Frame{i}(Frame.scala:{i})\n" for i in range(3000))
    query = "beam-beam_spark_runner-406ede63ab89 [id = cae9cfb1, runId = a65be969]"
    assert is_interruption(
        Py4JJavaError(
            "An error occurred while calling o552.collectToPython.\n: "
            f"org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 16 cancelled Query "
            f"{query} was stopped SQLSTATE: XXKDA\n{stack}"
        )
    )
    # Cancelled otherwise (the UI's kill, a user's job group): a failure.
    assert not is_interruption(
        Py4JJavaError(
            "An error occurred while calling o552.collectToPython.\n: "
            "org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 16 cancelled "
            f"killed via the Web UI\n{stack}"
        )
    )


def test_the_error_it_raises_instead_is_short_and_reads_as_an_interruption_to_spark() -> None:
    message = str(QueryInterrupted(7))
    assert len(message) < 300 and "micro-batch 7" in message
    assert SPARK_PROXY_ERROR.search(message)
    assert SPARK_3_5_PROXY_ERROR.search(message)


@pytest.mark.parametrize("logger_name", ["py4j.clientserver", "py4j.java_gateway"])
def test_py4j_logs_the_runners_callback_errors_at_debug_while_a_run_holds_it(
    caplog: pytest.LogCaptureFixture, logger_name: str
) -> None:
    import logging

    from beam_spark_runner.streaming.sink_watch import MicroBatchFailed, quiet_callback_errors

    logger = logging.getLogger(logger_name)

    def log_errors() -> None:
        for error in (QueryInterrupted(3), MicroBatchFailed(4), ValueError("a real failure")):
            try:
                raise error
            except Exception:
                logger.exception("There was an exception while executing the Python Proxy")

    release_one, release_two = quiet_callback_errors(), quiet_callback_errors()
    with caplog.at_level(logging.INFO, logger=logger_name):
        log_errors()
    assert "a real failure" in caplog.text
    assert "QueryInterrupted" not in caplog.text
    assert "MicroBatchFailed" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=logger_name):
        log_errors()
    levels = {r.exc_info[0].__name__: r.levelname for r in caplog.records if r.exc_info}
    assert levels == {
        "QueryInterrupted": "DEBUG",
        "MicroBatchFailed": "DEBUG",
        "ValueError": "ERROR",
    }
    release_one()
    release_one()  # once per holder
    assert logger.filters
    release_two()
    assert not logger.filters  # Py4J's own behaviour once no run holds it
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=logger_name):
        log_errors()
    assert "MicroBatchFailed" in caplog.text


class _Conf:
    """``spark.conf``: what a session has explicitly set."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        del self.values[key]


class _Session:
    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


def test_state_stores_are_rocksdb_and_changelog_checkpointing_is_the_sessions() -> None:
    spark = _Session({STATE_STORE_PROVIDER_CONF: "HDFSBackedStateStoreProvider"})
    ensure_state_store(spark)  # type: ignore[arg-type]
    assert spark.conf.values == {STATE_STORE_PROVIDER_CONF: ROCKSDB_PROVIDER}
    spark = _Session({CHANGELOG_CHECKPOINTING_CONF: "true"})
    ensure_state_store(spark)  # type: ignore[arg-type]
    assert spark.conf.values[CHANGELOG_CHECKPOINTING_CONF] == "true"


@pytest.mark.parametrize("before", [{}, {SIMPLIFIED_TRACEBACK_CONF: "true"}])
def test_a_query_starts_without_simplified_tracebacks_and_the_session_keeps_its_setting(
    before: dict[str, str],
) -> None:
    spark = _Session(before)
    with settings_within(spark, one_worker_daemon()):  # type: ignore[arg-type]
        assert spark.conf.values == {SIMPLIFIED_TRACEBACK_CONF: "false"}
    assert spark.conf.values == before
    with pytest.raises(RuntimeError), settings_within(spark, one_worker_daemon()):  # type: ignore[arg-type]
        raise RuntimeError("start() failed")
    assert spark.conf.values == before


def test_without_simplified_tracebacks_arrow_workers_get_transform_with_states_environment(
    spark_session: Any,
) -> None:
    """Spark's ``mapInArrow`` workers get ``SPARK_SIMPLIFIED_TRACEBACK`` from the setting,
    its ``transformWithState`` workers never: with it off, both run in one daemon's forks.

    That is Spark's own behaviour, in a session the runner did not create. The runner's
    sessions give every worker the variable (``session.worker_environment``)."""

    def environment(batches: Any) -> Any:
        import os

        import pyarrow as pa

        for _ in batches:
            value = os.environ.get("SPARK_SIMPLIFIED_TRACEBACK", "")
            yield pa.RecordBatch.from_pylist([{"value": value}])

    def worker_setting() -> str:
        frame = spark_session.range(1, numPartitions=1).mapInArrow(environment, "value string")
        return frame.collect()[0]["value"]

    worker_env = spark_session.sparkContext.environment
    runners = worker_env.pop(SIMPLIFIED_TRACEBACK)
    try:
        assert worker_setting() == "1", "Spark no longer sets it: one_worker_daemon is not needed"
        with settings_within(spark_session, one_worker_daemon()):
            assert worker_setting() == ""
    finally:
        worker_env[SIMPLIFIED_TRACEBACK] = runners
    with settings_within(spark_session, one_worker_daemon()):
        assert worker_setting() == "1"
