"""A named checkpoint records its pipeline graph; a restart with another graph is refused."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from beam_spark_runner.spark.compat import OLDEST_STREAMING_SPARK, pyspark_version
from beam_spark_runner.streaming.checkpoint import (
    PLACED_OVER,
    PLAN_FILE,
    CheckpointMismatchError,
    check_checkpoint,
    differences,
    fingerprint,
)
from beam_spark_runner.streaming.topology import GROUP, STAGE, NodeSpec, Topology, build_topology

SCRIPT = Path(__file__).resolve().parent.parent / "plan_fingerprint_script.py"
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoint_v1"


def _topology(middle: str = "count", shards: int = 2) -> Topology:
    return build_topology(
        [
            NodeSpec("read", STAGE, False, (("root", "impulse"),), (((GROUP, "g"),),)),
            NodeSpec("g", GROUP, True, ((STAGE, "read"),), (((STAGE, middle),),)),
            NodeSpec(middle, STAGE, False, ((GROUP, "g"),), ()),
        ],
        shards=shards,
    )


def test_the_first_start_records_the_graph_and_a_restart_with_it_resumes(
    spark_session: Any, tmp_path: Path
) -> None:
    check_checkpoint(spark_session, str(tmp_path), _topology())
    recorded = json.loads((tmp_path / PLAN_FILE).read_text())
    assert [node[1] for node in recorded["nodes"]] == ["read", "g", "count"]
    assert recorded["shards"] == 2
    check_checkpoint(spark_session, str(tmp_path), _topology())  # the same graph: no error


def test_a_restart_places_shards_over_the_partitions_its_first_start_recorded(
    spark_session: Any, tmp_path: Path
) -> None:
    """Spark keys a level's state by (target, slot): a restart places as the first start
    did, and one of a checkpoint written before placement keeps every shard in its slot."""
    assert check_checkpoint(spark_session, str(tmp_path / "new"), _topology(), 2) == 2
    assert json.loads((tmp_path / "new" / PLAN_FILE).read_text())[PLACED_OVER] == 2
    assert check_checkpoint(spark_session, str(tmp_path / "new"), _topology(), 5) == 2
    check_checkpoint(spark_session, str(tmp_path / "old"), _topology())
    assert PLACED_OVER not in json.loads((tmp_path / "old" / PLAN_FILE).read_text())
    assert check_checkpoint(spark_session, str(tmp_path / "old"), _topology(), 2) is None


def test_a_changed_stage_is_refused_naming_it(spark_session: Any, tmp_path: Path) -> None:
    check_checkpoint(spark_session, str(tmp_path), _topology())
    with pytest.raises(
        CheckpointMismatchError, match="transforms: added: 'total'; removed: 'count'"
    ) as error:
        check_checkpoint(spark_session, str(tmp_path), _topology(middle="total"))
    assert "--spark_checkpoint_location" in str(error.value)


def test_another_parallelism_is_refused(spark_session: Any, tmp_path: Path) -> None:
    check_checkpoint(spark_session, str(tmp_path), _topology(shards=2))
    with pytest.raises(CheckpointMismatchError, match="shards: the checkpoint has 2, this run 3"):
        check_checkpoint(spark_session, str(tmp_path), _topology(shards=3))


def test_a_checkpoint_of_an_earlier_runner_version_is_refused(
    spark_session: Any, tmp_path: Path
) -> None:
    """Format 2 checkpoints hold the Python data source's offsets, which this one cannot read."""
    check_checkpoint(spark_session, str(tmp_path), _topology())
    recorded = json.loads((tmp_path / PLAN_FILE).read_text())
    (tmp_path / PLAN_FILE).write_text(json.dumps({**recorded, "format": 2}))
    (tmp_path / f".{PLAN_FILE}.crc").unlink()  # Hadoop's checksum of the file as written
    with pytest.raises(CheckpointMismatchError, match="format 2, this one in 3"):
        check_checkpoint(spark_session, str(tmp_path), _topology())


def test_a_checkpoint_of_the_other_stateful_operator_form_is_refused(
    spark_session: Any, tmp_path: Path
) -> None:
    """PySpark 4.0's levels run on transformWithStateInPandas, 4.1+'s on rows, 3.5's on
    applyInPandasWithState: Spark resumes none's state as another's, so a checkpoint moved
    between them is refused, naming both."""
    check_checkpoint(spark_session, str(tmp_path), _topology())
    recorded = json.loads((tmp_path / PLAN_FILE).read_text())
    other = dict(recorded)
    this_line = other.pop("state", None)
    if this_line is None:
        other["state"] = "pandas"
    (tmp_path / PLAN_FILE).write_text(json.dumps(other))
    (tmp_path / f".{PLAN_FILE}.crc").unlink()
    with pytest.raises(CheckpointMismatchError, match="the PySpark line that wrote it") as error:
        check_checkpoint(spark_session, str(tmp_path), _topology())
    operators = {
        None: "transformWithState on rows",
        "pandas": "transformWithStateInPandas",
        "group-state": "applyInPandasWithState",
    }
    assert operators[this_line] in str(error.value)
    assert operators[other.get("state")] in str(error.value)


def test_a_pyspark_3_5_checkpoint_records_its_operator_and_refuses_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3.5's levels run on applyInPandasWithState, whose state no other line resumes."""
    from beam_spark_runner.streaming import checkpoint

    monkeypatch.setattr(checkpoint, "has_row_state", lambda: False)
    monkeypatch.setattr(checkpoint, "has_state_processor", lambda: False)
    on_3_5 = fingerprint(_topology())
    assert on_3_5["state"] == "group-state"
    monkeypatch.setattr(checkpoint, "has_state_processor", lambda: True)
    on_4_0 = fingerprint(_topology())
    assert on_4_0["state"] == "pandas"
    (difference,) = differences(on_3_5, on_4_0)
    assert "applyInPandasWithState (PySpark 3.5)" in difference, difference
    assert "transformWithStateInPandas (PySpark 4.0)" in difference, difference
    on_rows = {key: value for key, value in on_4_0.items() if key != "state"}
    (difference,) = differences(on_rows, on_3_5)
    assert "applyInPandasWithState (PySpark 3.5)" in difference, difference


needs_query_module = pytest.mark.skipif(
    pyspark_version() < OLDEST_STREAMING_SPARK, reason="the query module needs PySpark 3.5+"
)


def _windowed_counts(filtered: bool) -> dict[str, Any]:
    """The fingerprint of a small streaming pipeline, with or without a Filter (no Spark)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms import window

    from beam_spark_runner import beam_internals as bi
    from beam_spark_runner.planning import build_plan
    from beam_spark_runner.streaming.bounded_side_inputs import plan_broadcasts
    from beam_spark_runner.streaming.query import plan_topology

    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    stream = TestStream().add_elements(["a", "b"]).advance_watermark_to_infinity()
    words = pipeline | stream | "Pair" >> beam.Map(lambda word: (word, 1))
    if filtered:
        words = words | beam.Filter(lambda pair: pair[0] != "z")
    _ = (
        words
        | "Window" >> beam.WindowInto(window.FixedWindows(5))
        | "Count" >> beam.CombinePerKey(sum)
        | "Show" >> beam.Map(str)
    )
    pipeline.visit(bi.group_by_key_input_visitor(True))
    proto = pipeline.to_runner_api(default_environment=bi.default_environment())
    plan = build_plan(bi.prepare_pipeline_proto(proto), streaming=True)
    return fingerprint(plan_topology(plan, 2, plan_broadcasts(plan)))


@needs_query_module
def test_an_added_filter_is_named_as_the_pipeline_names_it_and_nothing_else() -> None:
    """Not Beam's internal stage names, whose counters an added transform shifts."""
    plain, filtered = _windowed_counts(False), _windowed_counts(True)
    assert [n[1] for n in plain["nodes"]] != [n[1] for n in filtered["nodes"]]
    (changed,) = differences(plain, filtered)
    assert re.fullmatch(
        r"transforms: added: 'Filter\(<lambda at test_checkpoint\.py:\d+>\)'", changed
    ), changed
    assert differences(filtered, plain) == [changed.replace("added", "removed")]
    assert differences(plain, _windowed_counts(False)) == []


def test_beams_line_numbers_and_component_counters_do_not_refuse_a_checkpoint() -> None:
    """Another Beam version moves its lambdas (``Create``'s ``FlatMap(<lambda at
    core.py:NNNN>)``) and may make more components before the user's: the same graph."""
    recorded = json.loads((FIXTURE / PLAN_FILE).read_text())
    text = json.dumps(recorded)
    assert "<lambda at core.py:4094>" in text and "ref_PCollection_PCollection_19" in text
    upgraded = json.loads(
        re.sub(
            r"(ref_\w+?_)(\d+)\b",
            lambda m: f"{m.group(1)}{int(m.group(2)) + 3}",
            text.replace("core.py:4094", "core.py:4117"),
        )
    )
    assert upgraded != recorded
    assert differences(recorded, upgraded) == []
    # Whereas a node of another kind is still refused.
    upgraded["nodes"][1][3] = not upgraded["nodes"][1][3]
    assert differences(recorded, upgraded) != []


@pytest.mark.spark
@needs_query_module
@pytest.mark.parametrize(
    ("sink", "processes"), [("text", 3), pytest.param("files", 6, marks=pytest.mark.slow)]
)
def test_the_streaming_plan_is_the_same_in_every_process(
    run_python: Callable[..., subprocess.CompletedProcess[str]], sink: str, processes: int
) -> None:
    """Hash seeds and protobuf's map order differ between a run and its restart: the plan
    must not depend on them. It did: a protobuf map gave a stage's side inputs another order
    in each process, and fileio.WriteToFiles's fused stage its parts (a third of processes
    here named it otherwise, and the restart test was refused its own checkpoint)."""
    plans = set()
    for seed in range(1, processes + 1):
        result = run_python([str(SCRIPT), sink], env={"PYTHONHASHSEED": str(seed)}, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        plans.add(result.stdout.strip().splitlines()[-1])
    assert len(plans) == 1


RESTARTED_SCRIPT = """
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream

filtered = sys.argv[1] == "filtered"
stream = TestStream().add_elements(["a", "b"]).advance_watermark_to_infinity()
pipeline = beam.Pipeline(options=PipelineOptions(sys.argv[2:]))
words = pipeline | stream | "Pair" >> beam.Map(lambda word: (word, 1))
if filtered:
    words = words | "DropZ" >> beam.Filter(lambda pair: pair[0] != "z")
_ = (
    words
    | "Window" >> beam.WindowInto(beam.window.FixedWindows(5))
    | "Count" >> beam.CombinePerKey(sum)
)
print(pipeline.run().wait_until_finish())
"""


@pytest.mark.spark
@pytest.mark.slow
@needs_query_module
def test_a_restart_with_an_added_filter_is_refused_naming_it_and_spark_stays_quiet(
    run_python: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """The refusal comes moments after the session started: Spark's ERROR that a task's
    broadcast is gone (the worker warm-up's, cut short by the session stopping) followed it."""
    script = tmp_path / "restarted.py"
    script.write_text(RESTARTED_SCRIPT, encoding="utf-8")
    options = [
        "--runner=SparkStructuredRunner",
        "--spark_master=local[2]",
        "--streaming",
        f"--spark_checkpoint_location={tmp_path / 'checkpoint'}",
    ]
    first = run_python([str(script), "plain", *options], timeout=300)
    assert first.returncode == 0 and "DONE" in first.stdout, first.stderr[-3000:]
    restarted = run_python([str(script), "filtered", *options], timeout=300)
    assert restarted.returncode != 0
    output = restarted.stdout + restarted.stderr
    assert "(transforms: added: 'DropZ')" in output, output[-3000:]
    assert "ref_" not in output, output[-3000:]
    assert "at org.apache.spark" not in output, output[-3000:]
    assert " ERROR " not in output, output[-3000:]
