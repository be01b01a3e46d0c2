"""What the driver ships to run one fused stage in a Spark task (pickled to executors)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Any

from beam_spark_runner.execution import beam_globals
from beam_spark_runner.execution.partial_aggregation import NativeOutput

# DoFn (and CombineFn) teardown, as batch users expect it: a process tears down its idle
# DoFn instances once it has run no bundle this long (shortly after its last task of a
# run): longer than Spark's locality wait (3 s) between task waves, shorter than Spark's 60 s
# idle-worker timeout, after which Spark ends the process without running Python exit hooks.
IDLE_TEARDOWN_SECONDS = 5.0
# In a streaming query DoFns live across micro-batches, as in Beam's streaming runners: a
# process may go many seconds without a task; still under Spark's 60 s timeout.
STREAMING_IDLE_TEARDOWN_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output of the stage: the transform writing it, and how to key it."""

    transform_id: str
    # The runner-safe windowed coder id, when the output feeds a GroupByKey.
    key_coder_id: str | None
    # For a native combine's buffer: what it aggregates. Its rows are partial aggregates
    # per key and bundle, in typed columns (execution.partial_aggregation).
    native: NativeOutput | None = None


def has_typed_outputs(outputs: tuple[OutputSpec, ...]) -> bool:
    """Whether a stage's output rows have the typed columns of native combines."""
    return any(output.native is not None for output in outputs)


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """Everything a Spark task needs to run one fused stage. Pickled to executors."""

    environment: beam_globals.TaskEnvironment
    name: str
    display_name: str
    descriptor: bytes
    input_transform_id: str
    outputs: tuple[OutputSpec, ...]
    # A pyspark Broadcast of [(StateKey bytes, data bytes)], or None without side inputs.
    side_input_state: Any = None
    # A stateful stage reads key-sorted partitions and runs whole keys (see process_keys).
    stateful: bool = False
    # The runner-safe input coder when it has state-backed iterables: input elements are
    # re-encoded with it so that iterables' values go to state (--spark_state_backed_iterables).
    state_backed_input_coder_id: str | None = None
    # The stage reads a ReadFromText's lines natively (execution.text_read): its input rows
    # are byte ranges of the files, and this is the encoding of a line's windowed value up
    # to its length.
    text_read_header: bytes | None = None
    # Run the stage's stateless steps batched (execution.batched_steps; --spark_batched_steps).
    batched_steps: bool = True
    # A process tears its DoFns down after running no bundle for this long (see
    # IDLE_TEARDOWN_SECONDS; STREAMING_IDLE_TEARDOWN_SECONDS in a streaming query).
    idle_teardown_seconds: float = IDLE_TEARDOWN_SECONDS

    @functools.cached_property
    def cache_key(self) -> str:
        """Identifies what was shipped, so a worker never reuses another spec's state."""
        digest = hashlib.sha1(self.descriptor, usedforsecurity=False).hexdigest()
        return f"{self.environment.run_id}/{self.name}/{digest}"
