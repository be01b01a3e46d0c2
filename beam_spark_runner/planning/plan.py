"""The plan: fused stages in execution order, the buffers between them, and how each runs.

A :class:`Plan` lists the fused stages, each with its input buffer, its output buffers and
its side inputs, and the buffers with their writers and readers (``assembly.build_plan``).
Its :class:`PhysicalPlan` (``physical.decide``) says how each stage runs on Spark; the
translators (``beam_spark_runner.translators``) dispatch on it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning.urns import BufferKind


@dataclasses.dataclass(frozen=True)
class StageOutput:
    """One data output of a fused stage."""

    transform_id: str
    buffer_id: bytes
    coder_id: str


@dataclasses.dataclass(frozen=True)
class SideInput:
    """A side input read by one ParDo of a fused stage."""

    transform_id: str
    tag: str
    pcollection_id: str
    buffer_id: bytes
    access_pattern_urn: str


@dataclasses.dataclass
class PlannedStage:
    """A fused stage: one data input, any number of outputs and side inputs."""

    name: str
    descriptor: bi.beam_fn_api_pb2.ProcessBundleDescriptor
    input_transform_id: str
    input_buffer_id: bytes
    input_coder_id: str
    outputs: list[StageOutput]
    side_inputs: list[SideInput]
    stateful: bool
    user_transform_names: list[str]

    @property
    def display_name(self) -> str:
        """A readable name: the Beam transforms the stage runs, in order."""
        names = self.user_transform_names
        if not names:
            return self.name
        if len(names) > 4:
            names = [*names[:2], f"... {len(names) - 3} more ...", names[-1]]
        return " -> ".join(names)


@dataclasses.dataclass
class PlannedBuffer:
    """A buffer between stages and the runner primitive that fills it."""

    buffer_id: bytes
    urn: str
    writers: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    main_readers: list[str] = dataclasses.field(default_factory=list)
    side_readers: list[str] = dataclasses.field(default_factory=list)

    @property
    def kind(self) -> str:
        """The buffer id's kind prefix (a :class:`BufferKind`)."""
        if self.buffer_id == bi.IMPULSE_BUFFER:
            return BufferKind.IMPULSE
        return bi.split_buffer_id(self.buffer_id)[0]

    @property
    def name(self) -> str:
        """The transform or PCollection the buffer belongs to."""
        if self.buffer_id == bi.IMPULSE_BUFFER:
            return "Impulse"
        return bi.split_buffer_id(self.buffer_id)[1]


class StageInput(enum.Enum):
    """How a fused stage's task gets its main input."""

    # The input buffer's DataFrame, as it is.
    BUFFER = "reads its input buffer"
    # Stateful: shuffled on the key and sorted by it, so a task runs whole keys.
    KEY_SORTED = "key-sorted input"
    # The only reader of a GroupByKey: groups the key-sorted rows in its own task.
    GROUPED = "fused with its GroupByKey"
    # The only reader of a native combine: writes the combine's output in its own task.
    NATIVE_COMBINED = "combines in stage"
    # A few literal rows and its side inputs' rows, in one task (no broadcast job).
    INLINE_SIDE_INPUTS = "reads side inputs inline"


@dataclasses.dataclass(frozen=True)
class StageStrategy:
    """How one stage runs: its input, and whether the driver computes it first."""

    input: StageInput
    # Computed on the driver from literal rows (``translators.driver_side_inputs``).
    on_driver: bool = False
    # With INLINE_SIDE_INPUTS: the stage writing its side input, run in the same task.
    side_input_writer: str | None = None


@dataclasses.dataclass(frozen=True)
class PhysicalPlan:
    """The decisions of ``physical.decide``: per stage, and per buffer where one applies."""

    stages: Mapping[str, StageStrategy] = dataclasses.field(default_factory=dict)
    # Side-input buffer -> the stage that computes it on the driver.
    driver_writers: Mapping[bytes, str] = dataclasses.field(default_factory=dict)
    # Group buffers whose writers all key with None: one partition, unsorted.
    single_key_groups: frozenset[bytes] = frozenset()


@dataclasses.dataclass
class Plan:
    """Everything the translators need, built on the driver before Spark starts."""

    stages: list[PlannedStage]
    buffers: dict[bytes, PlannedBuffer]
    components: bi.beam_runner_api_pb2.Components
    # PCollection id -> data-channel coder id (the SDK side, length-prefixed as needed).
    data_channel_coders: dict[str, str]
    # Coder id -> the runner-safe coder id (opaque bytes for unknown user coders).
    safe_coders: dict[str, str]
    # Group buffer id -> the value-only coder its writers use (value_only_group_coders).
    group_input_coders: dict[bytes, str] = dataclasses.field(default_factory=dict)
    # Stages run their stateless steps batched (--spark_batched_steps).
    batched_steps: bool = True
    # Planned for a streaming query (its stages run micro-batch after micro-batch).
    streaming: bool = False
    # How each stage runs (physical.decide, run by build_plan).
    physical: PhysicalPlan = dataclasses.field(default_factory=PhysicalPlan)

    def is_keyed(self, buffer_id: bytes) -> bool:
        """Whether the buffer's writers must compute each element's key.

        They must for a GroupByKey, a native combine, and a stateful stage: Spark shuffles
        (and sorts) their input by key.
        """
        buffer = self.buffers[buffer_id]
        return buffer.kind in (BufferKind.GROUP, BufferKind.NATIVE_COMBINE) or any(
            self.stage(reader).stateful for reader in buffer.main_readers
        )

    def stage(self, name: str) -> PlannedStage:
        """The stage with this name."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def strategy(self, name: str) -> StageStrategy:
        """How the stage with this name runs (decided by ``physical.decide``)."""
        return self.physical.stages[name]

    def describe(self) -> list[str]:
        """The physical plan, one line per stage and per buffer decision, in stage order."""
        lines = []
        for stage in self.stages:
            strategy = self.strategy(stage.name)
            words = [strategy.input.value]
            if strategy.side_input_writer is not None:
                writer = self.stage(strategy.side_input_writer).display_name
                words.append(f"runs its side input's stage [{writer}] in its task")
            if strategy.on_driver:
                words.append("runs on the driver")
            lines.append(f"[{stage.display_name}]: {', '.join(words)}")
        lines += [
            f"GroupByKey {self.buffers[buffer_id].name}: one key, one partition"
            for buffer_id in sorted(self.physical.single_key_groups)
        ]
        return lines
