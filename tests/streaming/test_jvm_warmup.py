"""Tests for jvm_warmup: RocksDB and Janino loaded while a local query plans, once per JVM."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from beam_spark_runner.streaming import jvm_warmup
from beam_spark_runner.workers.warmup import OncePerContext


@pytest.mark.parametrize(
    ("master", "in_driver"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local[4, 2]", True),
        ("local-cluster[2, 1, 1024]", False),
        ("spark://host:7077", False),
        ("yarn", False),
        ("k8s://https://host:6443", False),
    ],
)
def test_only_masters_whose_tasks_run_in_the_drivers_jvm_warm_it(
    master: str, in_driver: bool
) -> None:
    assert jvm_warmup.runs_tasks_in_driver(master) is in_driver


class _UnusableJvm:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the warm-up touched the JVM ({name}) on a cluster")


def test_a_cluster_sessions_driver_jvm_is_left_alone() -> None:
    context = _Context("spark://host:7077", _UnusableJvm())
    assert jvm_warmup.start(context) is None  # type: ignore[arg-type]


class _Context:
    """Stands for a SparkContext: the warm-up keeps the contexts it warmed weakly."""

    def __init__(self, master: str, jvm: Any) -> None:
        self.master = master
        self._jvm = jvm


class _FailingJvm:
    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("Py4J: the JVM has gone")


def test_a_failed_load_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(jvm_warmup, "_warmed", OncePerContext("test"))
    context = _Context("local[2]", _FailingJvm())
    caplog.set_level(logging.DEBUG, logger=jvm_warmup.__name__)
    thread = jvm_warmup.start(context)  # type: ignore[arg-type]
    assert thread is not None
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert any("the JVM has gone" in record.getMessage() for record in caplog.records)


def test_a_local_sessions_jvm_loads_rocksdb_and_janino_once(
    spark_session: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(jvm_warmup, "_warmed", OncePerContext("test"))
    caplog.set_level(logging.DEBUG, logger=jvm_warmup.__name__)
    context = spark_session.sparkContext
    thread = jvm_warmup.start(context)
    assert thread is not None
    thread.join(timeout=120)
    assert not thread.is_alive()
    messages = [record.getMessage() for record in caplog.records]
    # The classes and calls it names are still Spark's (a Spark upgrade could move them).
    assert any(message.startswith("RocksDB and Janino loaded in") for message in messages), messages
    assert jvm_warmup.start(context) is None
