"""The batch benchmark's subprocess: its runners and the Spark session of the peers."""

from __future__ import annotations

from typing import Any

from benchmarks import peers, run, worker


def test_the_pyspark_and_sql_session_has_the_runners_settings(monkeypatch: Any) -> None:
    started: list[tuple[str, dict[str, str]]] = []

    def start(master: str, app_name: str, conf: dict[str, str]) -> object:
        started.append((master, dict(conf)))
        return object()

    monkeypatch.setattr(peers, "start_session", start)
    monkeypatch.setattr(worker, "_SPARK", None)
    session = worker.spark_session()
    assert worker.spark_session() is session  # one per process
    assert started == [(worker.SPARK_MASTER, peers.runner_conf(worker.SPARK_MASTER))]


def test_make_bench_runs_the_mapinarrow_and_two_process_direct_lines() -> None:
    assert {"direct", "direct-mp", "pyspark", "pyspark-arrow", "sql"} <= set(run.DEFAULT_RUNNERS)
    assert worker.RUNNERS["pyspark-arrow"] is worker.run_pyspark_arrow
