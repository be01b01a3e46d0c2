"""Runs a fused Beam stage over Arrow batches inside a Spark task.

The driver ships a :class:`StageSpec` (``execution.stage_spec``). In the Python worker, the
process's :class:`StageWorker` for it (``execution.stage_processor``, kept by
``execution.stage_cache``) runs each input Arrow batch of a stateless stage as one Beam
bundle, and a stateful stage's whole keys at a time; :func:`run_stage` is the body of the
stage's ``mapInArrow``. The names the rest of the runner uses are importable from here.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import pyarrow as pa

from beam_spark_runner.coders import packed_bytes
from beam_spark_runner.coders.arrow_columns import ELEMENT, KEY, TAG
from beam_spark_runner.errors import StageExecutionError
from beam_spark_runner.execution.bundle_outputs import BundleOutputs
from beam_spark_runner.execution.key_runs import complete_key_groups
from beam_spark_runner.execution.stage_cache import (
    stage_worker,
    tear_down_idle_dofns,
    tear_down_stage_workers,
)
from beam_spark_runner.execution.stage_processor import (
    BUNDLE_SAMPLING_PERIOD_MS,
    Bundle,
    StageWorker,
)
from beam_spark_runner.execution.stage_spec import (
    IDLE_TEARDOWN_SECONDS,
    STREAMING_IDLE_TEARDOWN_SECONDS,
    OutputSpec,
    StageSpec,
    has_typed_outputs,
)
from beam_spark_runner.execution.text_read import TextInput, TextRange
from beam_spark_runner.monitoring import worker_logs, worker_warnings
from beam_spark_runner.monitoring.metrics import task_metrics

__all__ = [
    "BUNDLE_SAMPLING_PERIOD_MS",
    "ELEMENT",
    "IDLE_TEARDOWN_SECONDS",
    "KEY",
    "NO_SINKS",
    "STREAMING_IDLE_TEARDOWN_SECONDS",
    "TAG",
    "BundleOutputs",
    "OutputSpec",
    "StageSpec",
    "StageWorker",
    "TaskSinks",
    "has_typed_outputs",
    "recording",
    "run_stage",
    "run_stage_bundles",
    "stage_worker",
    "tear_down_idle_dofns",
    "tear_down_stage_workers",
]


class TaskSinks(NamedTuple):
    """Where a task reports (None where not collected).

    ``metrics``: a ``metrics.MetricsSink`` (the run's metrics accumulator, and the driver's
    side channel for failed attempts' metrics); ``warnings``: the warnings accumulator.
    """

    metrics: Any = None
    warnings: Any = None
    # The log records accumulator (worker_logs) and the levels user code logs at.
    logs: Any = None
    log_levels: worker_logs.LogLevels = worker_logs.LogLevels()


NO_SINKS = TaskSinks()


@contextlib.contextmanager
def recording(sinks: TaskSinks) -> Iterator[None]:
    """Records the warnings and log records of the code run inside, for the driver."""
    with (
        worker_warnings.recording(sinks.warnings),
        worker_logs.recording(sinks.logs, sinks.log_levels),
    ):
        yield


def _bundle_inputs(spec: StageSpec, batches: Iterable[pa.RecordBatch]) -> Iterator[Bundle]:
    """The encoded elements of each bundle: one per batch, or per run of whole keys.

    A stage reading text files natively gets a batch of byte ranges: its bundle's input is
    their lines, read as the bundle runs.
    """
    if spec.stateful:
        yield from complete_key_groups((b.column(KEY), b.column(ELEMENT)) for b in batches)
        return
    if spec.text_read_header is not None:
        for batch in batches:
            ranges = [TextRange.decode(cell) for cell in batch.column(ELEMENT).to_pylist()]
            yield TextInput(ranges, spec.text_read_header)
        return
    for batch in batches:
        yield packed_bytes(batch.column(ELEMENT))


def run_stage(
    spec: StageSpec, batches: Iterable[pa.RecordBatch], sinks: TaskSinks = NO_SINKS
) -> Iterator[pa.RecordBatch]:
    """The body of the stage's ``mapInArrow``.

    A stateless stage runs one bundle per input batch. A stateful stage reads a partition
    sorted by key and runs whole keys at a time: their elements, then their timers.
    """
    return run_stage_bundles(spec, _bundle_inputs(spec, batches), sinks)


def run_stage_bundles(
    spec: StageSpec,
    bundles: Iterable[Bundle],
    sinks: TaskSinks = NO_SINKS,
    unpacked: Collection[int] = (),
    runs: Mapping[int, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Runs the stage over each bundle's input (see :func:`run_stage`); yields its outputs.

    A bundle's input is its encoded elements, or an iterable of pieces of them: a native
    text read's (``TextInput``), a Spark stream's columns (``ValuesInput``). The outputs
    in ``unpacked`` keep one element a row (``BundleOutputs.record_batches``); those in
    ``runs`` (index -> parts) may give pickled runs, a run a row (``coders.pickled_runs``).
    """
    worker: StageWorker | None = None
    with task_metrics(sinks.metrics, spec.name) as metrics:
        for data in bundles:
            if not data:
                continue
            if worker is None:
                # Set up on the first element: a task of an empty partition (a
                # GroupByKey's keys all hashed elsewhere) sets nothing up.
                with recording(sinks):
                    worker = stage_worker(spec)
                worker.drop_unfinalized()  # left over from a task of this worker that failed
            if spec.stateful:
                outputs_of_bundle = worker.process_keys(data, metrics)
            else:
                outputs_of_bundle = worker.process(data, metrics, runs)
            while True:
                try:
                    with recording(sinks):
                        outputs = next(outputs_of_bundle, None)
                except StageExecutionError:
                    raise
                except Exception as error:  # noqa: BLE001 - re-raised with the stage's name
                    # The last exception only: Beam re-raises the user's error with the step
                    # name ("[while running ...]"), and its traceback ends in the user's code.
                    detail = "".join(traceback.format_exception(error, chain=False))
                    raise StageExecutionError(spec.display_name, detail) from error
                if outputs is None:
                    break
                yield from outputs.record_batches(
                    spec.outputs, worker.key_extractors, worker.aggregators, unpacked
                )
                # Spark has taken the bundle's output: its finalization may run now.
                with recording(sinks):
                    worker.finalize_bundles()
