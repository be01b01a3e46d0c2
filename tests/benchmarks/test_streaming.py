"""The streaming benchmark's pure parts: when a trial keeps up, percentiles, the table."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.streaming import Trial, highest_kept_up, keeps_up, markdown_table, percentile


def test_steady_micro_batches_keep_up_and_growing_ones_do_not() -> None:
    assert keeps_up([1.2, 1.0, 1.1, 0.9, 1.0, 1.1, 1.0, 1.2, 0.9])
    # Each batch holds the rows that arrived during the last: a backlog grows.
    assert not keeps_up([1.0, 1.3, 1.7, 2.2, 2.9, 3.8, 4.9, 6.4, 8.3])
    # Steady but too slow to call it streaming.
    assert not keeps_up([12.0] * 9)
    assert not keeps_up([1.0] * 5)  # too few to tell


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_the_highest_rate_kept_up_with_and_the_table() -> None:
    steady = [(1000, 1.0)] * 9
    growing = [(1000, d) for d in (1.0, 1.3, 1.7, 2.2, 2.9, 3.8, 4.9, 6.4, 8.3)]
    trials = [
        Trial("ours", 5, 1000, steady, latencies=[1.5, 2.5]),
        Trial("ours", 5, 2000, steady, latencies=[3.0], watermark_latencies=[0.5, 1.25]),
        Trial("ours", 5, 4000, growing),
        Trial("pyspark", 0, 1000, [], error="boom"),
    ]
    assert highest_kept_up(trials, "ours", 5) == 2000
    assert highest_kept_up(trials, "pyspark", 0) is None
    table = markdown_table(trials).splitlines()
    assert table[2] == "| q5 | ours | 1000 | yes | 9 | 1.0 | 1.0 | 1.5 | 2.5 | - | - |"
    assert table[3].endswith("| 3.0 | 3.0 | 0.5 | 1.25 |")
    assert table[4].startswith("| q5 | ours | 4000 | no |")
    assert "error: boom" in table[5]


def test_the_chart_is_drawn(tmp_path: object) -> None:
    import pytest

    pytest.importorskip("matplotlib")
    from pathlib import Path

    from benchmarks.streaming import chart

    path = Path(str(tmp_path)) / "chart.png"
    trials = [
        Trial("ours", 5, 500, [(500, 1.0)] * 9, latencies=[1.5, 2.5]),
        Trial("ours", 0, 2000, [(2000, 1.0)] * 9),
        Trial("pyspark", 0, 8000, [(8000, 0.2)] * 9),
    ]
    assert chart([t.summary() for t in trials], str(path))
    assert path.stat().st_size > 1000


def test_pane_latencies_leave_out_windows_that_ended_while_it_warmed_up(tmp_path: object) -> None:
    from pathlib import Path

    from benchmarks.streaming import pane_latencies

    directory = Path(str(tmp_path))
    (directory / "1.txt").write_text("100.0 130.0\n110.0 111.5\n")
    (directory / "2.txt").write_text("120.0 122.0\n")
    assert sorted(pane_latencies(str(directory), warm=105.0)) == [1.5, 2.0]


def test_a_panes_latency_past_the_watermark_counts_from_the_first_watermark_past_its_end() -> None:
    from benchmarks.streaming import watermark_latencies

    # (watermark, wall time it was seen): it reached 110 at 111.0 (not 112.0, seen later).
    passes = [(105.0, 106.0), (112.0, 112.0), (110.0, 111.0), (125.0, 126.0)]
    # Window ends 110 and 120 (counted), 100 (warming up), 130 (no watermark past it).
    panes = [(110.0, 111.5), (110.0, 113.0), (120.0, 126.5), (100.0, 101.0), (130.0, 131.0)]
    assert watermark_latencies(panes, passes, warm=105.0) == [0.5, 2.0, 0.5]
    # A window's last timestamp is a microsecond before its end: a watermark there passed it.
    assert watermark_latencies([(110.0, 111.0)], [(110.0 - 1e-6, 110.5)], warm=0.0) == [0.5]
    assert watermark_latencies([(110.0, 111.0)], [(110.0 - 2e-6, 110.5)], warm=0.0) == []


def test_the_event_step_records_a_bundles_latest_event_time_and_when_it_read_it(
    tmp_path: object,
) -> None:
    from pathlib import Path
    from types import SimpleNamespace
    from unittest import mock

    from apache_beam.utils.timestamp import Timestamp

    from benchmarks import nexmark
    from benchmarks.streaming import _Events, _pairs

    events = _Events(str(tmp_path))
    events.start_bundle()
    times = iter([50.0, 51.0, 52.0])
    with mock.patch("benchmarks.streaming.time.time", lambda: next(times)):
        rows = [
            SimpleNamespace(value=n, timestamp=Timestamp(seconds))
            for n, seconds in ((0, 10.5), (1, 12.0), (2, 11.0))
        ]
        out = [next(iter(events.process(row))).__dict__ for row in rows]
    assert out == [nexmark.event(n).__dict__ for n in range(3)]
    assert list(Path(str(tmp_path)).iterdir()) == [], "written before the bundle ended"
    events.finish_bundle()
    events.start_bundle()
    events.finish_bundle()  # an empty bundle writes nothing
    assert _pairs(str(tmp_path)) == [(12.0, 52.0)]


def test_the_event_step_reads_the_time_of_rows_stamped_alike_once(tmp_path: object) -> None:
    """Ours gives the rows of a run of equal event times one ``Timestamp``: its
    microseconds (a property computed on each read) are read once, not once a row."""
    from types import SimpleNamespace

    from benchmarks.streaming import _Events, _pairs

    class Counted:
        reads = 0

        def __init__(self, micros: int) -> None:
            self._micros = micros

        @property
        def micros(self) -> int:
            Counted.reads += 1
            return self._micros

    shared, later = Counted(12_000_000), Counted(13_000_000)
    events = _Events(str(tmp_path))
    events.start_bundle()
    for n, stamp in enumerate([shared] * 5 + [later] * 3):
        list(events.process(SimpleNamespace(value=n, timestamp=stamp)))
    events.finish_bundle()
    assert Counted.reads == 2
    assert [latest for latest, _ in _pairs(str(tmp_path))] == [13.0]


def test_pyspark_watermark_passes_are_each_batchs_latest_event_time_at_its_end() -> None:
    from types import SimpleNamespace

    from benchmarks.streaming import _batch_watermark_passes

    query = SimpleNamespace(
        recentProgress=[
            {"timestamp": "2026-12-04T00:00:00.000Z", "durationMs": {"triggerExecution": 500}},
            {
                "timestamp": "2026-12-04T00:00:02.000Z",
                "durationMs": {"triggerExecution": 1500},
                "eventTime": {
                    "max": "2026-12-04T00:00:01.750Z",
                    "watermark": "1970-01-01T00:00:00.000Z",
                },
            },
        ]
    )
    midnight = 1796342400.0  # 2026-12-04T00:00:00Z
    assert _batch_watermark_passes(query) == [(midnight + 1.75, midnight + 3.5)]


def test_the_pane_sink_writes_a_bundles_lines_at_its_end(tmp_path: object) -> None:
    """One append per bundle, in the format ``pane_latencies`` reads."""
    import builtins
    from pathlib import Path
    from unittest import mock

    from apache_beam.transforms import window

    from benchmarks.streaming import _Panes, pane_latencies

    def written_lines() -> int:
        return sum(len(path.read_text().splitlines()) for path in Path(str(tmp_path)).iterdir())

    panes = _Panes(str(tmp_path))
    opened = mock.Mock(side_effect=builtins.open)
    for bundle in range(2):
        with mock.patch("builtins.open", opened):
            panes.start_bundle()
            for start in (100, 110, 120):
                panes.process(None, window.IntervalWindow(start + bundle, start + bundle + 10))
        assert written_lines() == 3 * bundle, "written before the bundle ended"
        with mock.patch("builtins.open", opened):
            panes.finish_bundle()
    assert opened.call_count == 2
    (written,) = Path(str(tmp_path)).iterdir()
    ends = [float(line.split()[0]) for line in written.read_text().splitlines()]
    assert ends == [110.0, 120.0, 130.0, 111.0, 121.0, 131.0]
    assert len(pane_latencies(str(tmp_path), warm=0.0)) == 6


def test_direct_runner_keeps_up_when_it_ends_soon_after_its_last_event() -> None:
    assert Trial("direct", 0, 1000, [], overrun=2.0).keeps_up
    assert not Trial("direct", 0, 1000, [], overrun=30.0).keeps_up


def test_a_direct_runner_trial_that_ends_before_its_last_event_is_due_does_not_keep_up() -> None:
    # Its events were not run at their times (DirectRunner's multi-processing mode did so).
    assert not Trial("direct-mp", 0, 1000, [], overrun=-33.0).keeps_up


@pytest.mark.parametrize("query", [1, 2, 5, 7, 8, 11])
def test_the_hand_written_structured_streaming_queries_give_beams_results(
    spark_session: Any, query: int
) -> None:
    """Each query of :func:`pyspark_query` over a batch frame of events, their event times
    the generator's (``nexmark.millis``), gives the plain-Python reference's results (which
    match Beam's queries on FnApiRunner: test_benchmark_nexmark)."""
    from pyspark.sql import functions as F

    from benchmarks import nexmark
    from benchmarks.streaming import pyspark_query

    total = 25_000
    spark = spark_session
    numbered = spark.range(0, total, 1, 2).withColumn(
        "t", F.timestamp_millis(F.lit(nexmark.BASE_TIME_MS) + F.col("id"))
    )
    rows = pyspark_query(query, nexmark.event_columns(numbered, keep=("t",))).collect()
    fingerprint = {
        1: lambda r: int(r.p),
        2: lambda r: r.auction + r.price,
        5: lambda r: r.top.auction * 100_000 + r.top["count"],
        7: lambda r: r.bid.auction * 1_000_003 + r.bid.bidder * 1_009 + r.bid.price,
        8: lambda r: r.person_id * 10_000 + r.reserve,
        11: lambda r: r.bidder * 1_000_000 + r["count"] * r["count"],
    }[query]
    expected = nexmark.python_query(query, nexmark.events(0, total)) if query > 2 else None
    if expected is None:  # q1, q2: the RDD versions' reference
        items = list(nexmark.events(0, total))
        expected_prints = sorted(
            nexmark.FINGERPRINTS[query](out) for out in _stateless_reference(query, items)
        )
    else:
        expected_prints = sorted(nexmark.FINGERPRINTS[query](out) for out in expected)
    assert expected_prints, "the reference has results to compare"
    assert sorted(fingerprint(r) for r in rows) == expected_prints


def _stateless_reference(query: int, items: list[object]) -> list[object]:
    from benchmarks import nexmark

    bids = [b for b in items if nexmark._is_bid(b)]
    if query == 1:
        return [nexmark._to_euro(b) for b in bids]
    return [nexmark._q2_project(b) for b in bids if nexmark._q2_keep(b)]


def test_ours_conf_entries_reach_our_runners_trials(tmp_path: object, monkeypatch: object) -> None:
    from pathlib import Path

    from benchmarks import streaming

    seen: list[list[str]] = []

    def fake(query: int, rate: int, seconds: float, trigger: float) -> Trial:
        seen.append(list(streaming.OURS_CONF))
        return Trial("ours", query, rate, [(rate, 1.0)] * 9)

    monkeypatch.setitem(streaming.RUNNERS, "ours", fake)  # type: ignore[attr-defined]
    monkeypatch.setattr(streaming, "OURS_CONF", [])  # type: ignore[attr-defined]
    output = Path(str(tmp_path)) / "streaming.json"
    argv = [
        "--queries",
        "0",
        "--rates",
        "4000",
        "--runners",
        "ours",
        "--output",
        str(output),
        "--in-process",
    ]
    conf = ["--ours-conf", "spark.a=1", "--ours-conf", "spark.b=2"]
    assert streaming.main(argv + conf) == 0
    assert seen == [["spark.a=1", "spark.b=2"]]


def test_queries_without_windows_make_their_events_with_a_plain_map() -> None:
    from benchmarks import nexmark
    from benchmarks.streaming import event_of_row

    row = type("Row", (), {"value": 51})()
    assert nexmark.FINGERPRINTS[0](event_of_row(row)) == nexmark.FINGERPRINTS[0](nexmark.event(51))


def test_the_python_floor_runs_only_on_its_queries(tmp_path: object, monkeypatch: object) -> None:
    from pathlib import Path

    from benchmarks import streaming

    seen: list[tuple[str, int]] = []

    def fake(runner: str) -> Any:
        def run(query: int, rate: int, seconds: float, trigger: float) -> Trial:
            seen.append((runner, query))
            return Trial(runner, query, rate, [(rate, 1.0)] * 9)

        return run

    for runner in ("ours", "pyspark-python"):
        monkeypatch.setitem(streaming.RUNNERS, runner, fake(runner))  # type: ignore[attr-defined]
    output = Path(str(tmp_path)) / "streaming.json"
    argv = ["--queries", "1,3", "--rates", "4000", "--runners", "ours,pyspark-python"]
    assert streaming.main([*argv, "--output", str(output), "--in-process"]) == 0
    assert seen == [("ours", 1), ("pyspark-python", 1), ("ours", 3)]


def test_a_failing_trial_is_an_error_in_the_table_and_the_run_goes_on(
    tmp_path: object, monkeypatch: object
) -> None:
    import json
    from pathlib import Path

    from benchmarks import streaming

    def run(query: int, rate: int, seconds: float, trigger: float) -> Trial:
        if rate > 4000:
            raise ConnectionRefusedError("the JVM has ended")
        return Trial("pyspark", query, rate, [(rate, 1.0)] * 9)

    monkeypatch.setitem(streaming.RUNNERS, "pyspark", run)  # type: ignore[attr-defined]
    output = Path(str(tmp_path)) / "streaming.json"
    argv = ["--queries", "7,8", "--rates", "4000,16000", "--runners", "pyspark", "--within", "0"]
    assert streaming.main([*argv, "--output", str(output), "--in-process"]) == 0
    rows = json.loads(output.read_text())
    assert [(r["query"], r["rate"], r["keeps_up"]) for r in rows] == [
        (7, 4000, True),
        (7, 16000, False),
        (8, 4000, True),
        (8, 16000, False),
    ]
    assert rows[1]["error"] == "ConnectionRefusedError: the JVM has ended"


def test_each_trial_runs_in_a_process_of_its_own(tmp_path: object, monkeypatch: object) -> None:
    """Each runner starts its own Spark session: ours its runner's, the hand-written
    queries theirs (Spark's JVM flags), never one another's."""
    from pathlib import Path

    from benchmarks import streaming

    launched: list[tuple[str, int, int, str]] = []

    def launch(
        runner: str, query: int, rate: int, seconds: float, trigger: float, log_dir: str
    ) -> Trial:
        launched.append((runner, query, rate, log_dir))
        return Trial(runner, query, rate, [(rate, 1.0)] * 9)

    def here(*args: object) -> Trial:
        raise AssertionError("a trial ran in the benchmark's own process")

    monkeypatch.setattr(streaming, "run_in_subprocess", launch)  # type: ignore[attr-defined]
    for runner in ("ours", "pyspark"):
        monkeypatch.setitem(streaming.RUNNERS, runner, here)  # type: ignore[attr-defined]
    output = Path(str(tmp_path)) / "streaming.json"
    argv = ["--queries", "5", "--rates", "4000", "--runners", "ours,pyspark", "--within", "0"]
    assert streaming.main([*argv, "--output", str(output)]) == 0
    logs = str(Path(str(tmp_path)) / "logs" / "streaming")
    assert launched == [("ours", 5, 4000, logs), ("pyspark", 5, 4000, logs)]


def test_a_trials_process_hands_its_trial_back_as_json(tmp_path: object) -> None:
    import dataclasses
    import json

    from benchmarks import streaming

    trial = Trial("pyspark", 7, 2000, [(2000, 1.5), (1900, 1.25)], [0.5], [0.25], trigger=1.0)
    assert streaming.trial_from_json(json.loads(json.dumps(dataclasses.asdict(trial)))) == trial
    command = streaming.trial_command("direct-mp", 7, 2000, 30.0, 2.0, "/tmp/t.json")
    assert command[1:4] == ["-m", "benchmarks.streaming", "--trial=direct-mp,7,2000"]
    assert "--trial-output=/tmp/t.json" in command


def test_the_hand_written_queries_session_has_the_runners_settings_and_sparks_jit(
    monkeypatch: object,
) -> None:
    from beam_spark_runner.spark.session import JAVA_OPTIONS
    from benchmarks import peers, streaming

    started: list[dict[str, str]] = []

    class Conf:
        def set(self, key: str, value: str) -> None:
            pass

    def start(master: str, app_name: str, conf: dict[str, str]) -> object:
        started.append(dict(conf))
        return type("Session", (), {"conf": Conf()})()

    monkeypatch.setattr(peers, "start_session", start)  # type: ignore[attr-defined]
    streaming.peer_session()
    runner = peers.runner_conf("local[2]")
    (conf,) = started
    assert "-XX:TieredStopAtLevel=1" in runner[JAVA_OPTIONS]
    assert "-XX:TieredStopAtLevel" not in conf.get(JAVA_OPTIONS, "")
    assert {k: v for k, v in conf.items() if k != JAVA_OPTIONS} == {
        k: v for k, v in runner.items() if k != JAVA_OPTIONS
    }


def test_the_run_bisects_each_runners_bracket(tmp_path: object, monkeypatch: object) -> None:
    import json
    from pathlib import Path

    from benchmarks import streaming

    def run(query: int, rate: int, seconds: float, trigger: float) -> Trial:
        durations = [1.0] * 9 if rate <= 5000 else [1.0 + i for i in range(9)]
        return Trial("pyspark", query, rate, [(rate, d) for d in durations])

    monkeypatch.setitem(streaming.RUNNERS, "pyspark", run)  # type: ignore[attr-defined]
    output = Path(str(tmp_path)) / "streaming.json"
    argv = ["--queries", "5", "--rates", "4000,16000", "--runners", "pyspark", "--in-process"]
    assert streaming.main([*argv, "--output", str(output)]) == 0
    rows = json.loads(output.read_text())
    assert [(r["rate"], r["keeps_up"]) for r in rows] == [
        (4000, True),
        (16000, False),
        (8000, False),
        (5657, False),
        (4757, True),
        (5188, False),
    ]
