"""DoFn and CombineFn lifecycle: setup, bundles and teardown as Beam users expect in batch.

Beam's own ``dofn_lifecycle_test`` and ``combinefn_lifecycle_test`` (run by
``make validates-runner``) check the order of the calls inside one instance, but their
instances live in Spark's Python workers, so they cannot see whether ``teardown`` ran at all.
Here every instance writes a marker file from ``setup`` and one from ``teardown``, and the
test checks that each instance set up is torn down after the run, with balanced bundles.

The unit tests drive the stage worker cache of ``execution/stage_cache.py`` with stand-in
workers: tearing down a previous run's workers, and tearing down idle DoFns only when idle.
"""

from __future__ import annotations

import collections
import json
import os
import time
import typing
import uuid
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_spark_runner.execution import stage_cache
from beam_spark_runner.execution import stage_worker as sw
from beam_spark_runner.execution.beam_globals import TaskEnvironment

SPARK_ARGS = ["--runner=SparkStructuredRunner", "--spark_master=local[2]"]
# Teardown follows a worker process's last bundle by the idle delay plus one poll; allow
# for a loaded machine.
TEARDOWN_DEADLINE_SECONDS = 60.0


class Markers:
    """Marker files an instance writes: ``setup-<id>`` and ``teardown-<id>`` (JSON)."""

    def __init__(self, directory: Path) -> None:
        self.directory = str(directory)
        self.instance = ""

    def write(self, kind: str, **fields: typing.Any) -> None:
        if kind == "setup":
            self.instance = f"{os.getpid()}-{uuid.uuid4().hex}"
        path = os.path.join(self.directory, f"{kind}-{self.instance}")
        # Written beside it, then renamed: the test polls the directory while workers
        # write, and once read an empty marker (created, not yet written).
        partial = os.path.join(self.directory, f".partial-{kind}-{self.instance}")
        with open(partial, "w", encoding="utf-8") as out:
            json.dump(fields, out)
        os.replace(partial, path)


def instances(directory: Path, kind: str) -> dict[str, dict[str, typing.Any]]:
    """The instances that wrote a ``kind`` marker, with what they wrote."""
    return {
        path.name.split("-", 1)[1]: json.loads(path.read_text(encoding="utf-8"))
        for path in directory.glob(f"{kind}-*")
    }


def wait_for_teardowns(directory: Path) -> tuple[dict[str, typing.Any], dict[str, typing.Any]]:
    """Waits until every instance set up has been torn down; returns both marker sets."""
    deadline = time.monotonic() + TEARDOWN_DEADLINE_SECONDS
    while True:
        setups, teardowns = instances(directory, "setup"), instances(directory, "teardown")
        if setups and setups.keys() == teardowns.keys() or time.monotonic() > deadline:
            return setups, teardowns
        time.sleep(0.5)


class LifecycleDoFn(beam.DoFn):
    """Counts its bundles; its teardown records the counts."""

    def __init__(self, directory: Path) -> None:
        self.markers = Markers(directory)
        self.setups = self.starts = self.finishes = self.elements = 0
        self.torn_down = False

    def setup(self) -> None:
        self.setups += 1
        self.markers.write("setup")

    def start_bundle(self) -> None:
        assert self.setups == 1 and not self.torn_down
        self.starts += 1

    def process(self, element: int) -> typing.Iterator[int]:
        assert self.starts == self.finishes + 1 and not self.torn_down
        self.elements += 1
        yield element * element

    def finish_bundle(self) -> None:
        self.finishes += 1

    def teardown(self) -> None:
        self.torn_down = True
        self.markers.write(
            "teardown",
            setups=self.setups,
            starts=self.starts,
            finishes=self.finishes,
            elements=self.elements,
        )


class LifecycleCombineFn(beam.CombineFn):
    """A sum whose setup and teardown write markers."""

    def __init__(self, directory: Path) -> None:
        self.markers = Markers(directory)
        self.set_up = self.torn_down = False

    def setup(self) -> None:
        assert not self.set_up
        self.set_up = True
        self.markers.write("setup")

    def create_accumulator(self) -> int:
        assert self.set_up and not self.torn_down
        return 0

    def add_input(self, accumulator: int, element: int) -> int:
        return accumulator + element

    def merge_accumulators(self, accumulators: typing.Iterable[int]) -> int:
        assert self.set_up and not self.torn_down
        return sum(accumulators)

    def extract_output(self, accumulator: int) -> int:
        return accumulator

    def teardown(self) -> None:
        assert self.set_up and not self.torn_down
        self.torn_down = True
        self.markers.write("teardown", set_up=self.set_up)


@pytest.mark.spark
def test_dofn_teardown_after_the_run(tmp_path: Path) -> None:
    with beam.Pipeline(options=PipelineOptions(SPARK_ARGS)) as p:
        squares = (
            p | beam.Create(range(100)) | beam.Reshuffle() | beam.ParDo(LifecycleDoFn(tmp_path))
        )
        assert_that(squares, equal_to([i * i for i in range(100)]))

    setups, teardowns = wait_for_teardowns(tmp_path)
    assert setups, "no DoFn instance was set up"
    assert teardowns.keys() == setups.keys(), "some DoFn instances were never torn down"
    assert sum(t["elements"] for t in teardowns.values()) == 100
    for counts in teardowns.values():
        assert counts["setups"] == 1
        assert counts["starts"] == counts["finishes"] >= 1


@pytest.mark.spark
def test_combinefn_teardown_after_the_run(tmp_path: Path) -> None:
    with beam.Pipeline(options=PipelineOptions(SPARK_ARGS)) as p:
        total = p | beam.Create(range(10)) | beam.CombineGlobally(LifecycleCombineFn(tmp_path))
        assert_that(total, equal_to([45]))

    setups, teardowns = wait_for_teardowns(tmp_path)
    assert setups, "no CombineFn instance was set up"
    assert teardowns.keys() == setups.keys(), "some CombineFn instances were never torn down"


# Unit tests of the stage worker cache, with stand-ins for StageWorker and Beam's
# BundleProcessorCache: only what stage_cache.py's lifecycle code touches.


class FakeProcessor:
    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


class FakeProcessorCache:
    def __init__(self, last_access: float) -> None:
        self.active_bundle_processors: dict[str, typing.Any] = {}
        self.processors_being_created: dict[str, typing.Any] = {}
        self.processors = [FakeProcessor(), FakeProcessor()]
        self.cached_bundle_processors = collections.defaultdict(
            list, {"descriptor": list(self.processors)}
        )
        self.last_access_times = {"descriptor": last_access}
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


class FakeSpec(typing.NamedTuple):
    run_id: str
    name: str
    idle_teardown_seconds: float = sw.IDLE_TEARDOWN_SECONDS

    @property
    def environment(self) -> TaskEnvironment:
        return TaskEnvironment(self.run_id)

    @property
    def cache_key(self) -> str:
        return f"{self.run_id}/{self.name}"

    @property
    def display_name(self) -> str:
        return self.name


class FakeStageWorker:
    def __init__(self, spec: FakeSpec) -> None:
        self.spec = spec
        self.worker = type("FakeSdkWorker", (), {})()
        self.worker.bundle_processor_cache = FakeProcessorCache(time.time())


@pytest.fixture
def fake_workers(monkeypatch: pytest.MonkeyPatch) -> collections.OrderedDict[str, typing.Any]:
    workers: collections.OrderedDict[str, typing.Any] = collections.OrderedDict()
    monkeypatch.setattr(stage_cache, "_WORKERS", workers)
    monkeypatch.setattr(stage_cache, "StageWorker", FakeStageWorker)
    return workers


def get_worker(spec: FakeSpec) -> FakeStageWorker:
    return typing.cast(FakeStageWorker, sw.stage_worker(typing.cast(sw.StageSpec, spec)))


def test_a_new_run_tears_down_the_previous_runs_workers(
    fake_workers: collections.OrderedDict[str, typing.Any],
) -> None:
    first_a = get_worker(FakeSpec("run-1", "a"))
    first_b = get_worker(FakeSpec("run-1", "b"))
    assert get_worker(FakeSpec("run-1", "a")) is first_a
    assert not first_a.worker.bundle_processor_cache.shut_down

    second_a = get_worker(FakeSpec("run-2", "a"))

    assert first_a.worker.bundle_processor_cache.shut_down
    assert first_b.worker.bundle_processor_cache.shut_down
    assert not second_a.worker.bundle_processor_cache.shut_down
    assert list(fake_workers) == ["run-2/a"]


def test_exit_tears_down_every_worker(
    fake_workers: collections.OrderedDict[str, typing.Any],
) -> None:
    workers = [get_worker(FakeSpec("run-1", name)) for name in "abc"]
    sw.tear_down_stage_workers()
    assert all(w.worker.bundle_processor_cache.shut_down for w in workers)
    assert not fake_workers


def test_eviction_tears_down_the_least_recently_used_worker(
    fake_workers: collections.OrderedDict[str, typing.Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage_cache, "_MAX_CACHED_STAGES", 2)
    a, b = get_worker(FakeSpec("run-1", "a")), get_worker(FakeSpec("run-1", "b"))
    get_worker(FakeSpec("run-1", "a"))
    get_worker(FakeSpec("run-1", "c"))
    assert b.worker.bundle_processor_cache.shut_down
    assert not a.worker.bundle_processor_cache.shut_down
    assert list(fake_workers) == ["run-1/a", "run-1/c"]


def test_idle_dofns_are_torn_down_only_when_the_process_is_idle(
    fake_workers: collections.OrderedDict[str, typing.Any],
) -> None:
    worker = get_worker(FakeSpec("run-1", "a"))
    cache = worker.worker.bundle_processor_cache
    now = time.time()

    # Just used: nothing is torn down.
    assert sw.tear_down_idle_dofns(now, idle_seconds=5.0) == 0
    # A bundle is running: nothing is torn down, however long ago the last one ended.
    cache.active_bundle_processors["bundle-1"] = ("descriptor", FakeProcessor())
    assert sw.tear_down_idle_dofns(now + 60, idle_seconds=5.0) == 0
    assert not any(p.shut_down for p in cache.processors)

    # Idle: the cached processors are torn down, the worker itself stays cached.
    del cache.active_bundle_processors["bundle-1"]
    assert sw.tear_down_idle_dofns(now + 60, idle_seconds=5.0) == 2
    assert all(p.shut_down for p in cache.processors)
    assert not cache.cached_bundle_processors["descriptor"]
    assert not cache.shut_down
    assert list(fake_workers) == ["run-1/a"]
    # Nothing left to tear down.
    assert sw.tear_down_idle_dofns(now + 120, idle_seconds=5.0) == 0


def test_a_streaming_querys_dofns_outlive_the_gaps_between_a_processs_tasks(
    fake_workers: collections.OrderedDict[str, typing.Any],
) -> None:
    """Without an explicit delay the process uses its run's own (its specs')."""
    spec = FakeSpec("run-1", "a", idle_teardown_seconds=sw.STREAMING_IDLE_TEARDOWN_SECONDS)
    cache = get_worker(spec).worker.bundle_processor_cache
    now = time.time()
    # A gap between micro-batches' tasks longer than batch's delay: nothing torn down.
    assert sw.tear_down_idle_dofns(now + 20) == 0
    assert not any(p.shut_down for p in cache.processors)
    # The query ended: torn down before Spark's 60 s idle-worker timeout.
    assert sw.STREAMING_IDLE_TEARDOWN_SECONDS < 60
    assert sw.tear_down_idle_dofns(now + sw.STREAMING_IDLE_TEARDOWN_SECONDS + 1) == 2


def test_a_batch_runs_dofns_are_torn_down_after_the_batch_delay(
    fake_workers: collections.OrderedDict[str, typing.Any],
) -> None:
    cache = get_worker(FakeSpec("run-1", "a")).worker.bundle_processor_cache
    assert sw.tear_down_idle_dofns(time.time() + sw.IDLE_TEARDOWN_SECONDS + 1) == 2
    assert all(p.shut_down for p in cache.processors)


@pytest.mark.parametrize("streaming", [False, True])
def test_stage_specs_carry_the_delay_of_their_mode(streaming: bool) -> None:
    from types import SimpleNamespace

    from beam_spark_runner import beam_internals as bi
    from beam_spark_runner.planning import build_plan
    from beam_spark_runner.translators.fused_stage import stage_spec

    p = beam.Pipeline()
    _ = p | beam.Create([1, 2]) | beam.Map(lambda x: (x, x)) | beam.GroupByKey()
    plan = build_plan(bi.prepare_pipeline_proto(p.to_runner_api()), streaming=streaming)
    context = SimpleNamespace(plan=plan, environment=TaskEnvironment("run"))
    specs = [stage_spec(stage, typing.cast(typing.Any, context)) for stage in plan.stages]
    expected = sw.STREAMING_IDLE_TEARDOWN_SECONDS if streaming else sw.IDLE_TEARDOWN_SECONDS
    assert specs and all(spec.idle_teardown_seconds == expected for spec in specs)
