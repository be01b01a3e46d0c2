"""The translator interface and the context translators build DataFrames in."""

from __future__ import annotations

import functools
import logging
import re
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.coders.arrow_columns import ELEMENT, KEY, TAG
from beam_spark_runner.execution import beam_globals
from beam_spark_runner.execution.partial_aggregation import FLOAT_VALUE, INT_VALUE, VALUE_COUNT
from beam_spark_runner.planning import EXECUTABLE_STAGE_URN, Plan, PlannedBuffer
from beam_spark_runner.spark import compat as spark_compat

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from beam_spark_runner.execution.stage_worker import TaskSinks
    from beam_spark_runner.translators.driver_side_inputs import DriverRows

_LOGGER = logging.getLogger(__name__)

# Small literal rows already made in a session, by content: the same small Create recurs
# from run to run (``assert_that``'s), and making its DataFrame costs Py4J calls.
_REMEMBERED_LITERALS = 32
_REMEMBERED_LITERAL_BYTES = 64 * 1024
_LITERALS: weakref.WeakKeyDictionary[Any, OrderedDict[tuple[Any, ...], DataFrame]] = (
    weakref.WeakKeyDictionary()
)
_LITERALS_LOCK = threading.Lock()


class Translator(Protocol):
    """Builds the DataFrame of one planned node (a buffer or a fused stage)."""

    urn: str

    def translate(self, node: Any, context: TranslationContext) -> DataFrame:
        """Returns the node's DataFrame; lazy, nothing runs on Spark here."""
        ...


@functools.cache
def stage_output_type(typed: bool = False) -> StructType:
    """A fused stage's output rows (``STAGE_OUTPUT_SCHEMA``), as a Spark type.

    ``typed``: with the typed value columns of a native combine's writers
    (``TYPED_STAGE_OUTPUT_SCHEMA``). Given as a type, not a DDL string, so that
    ``mapInArrow`` does not ask the JVM to parse it (three Py4J calls per stage).
    """
    from pyspark.sql.types import (
        BinaryType,
        DoubleType,
        IntegerType,
        LongType,
        StructField,
        StructType,
    )

    fields = [
        StructField(TAG, IntegerType()),
        StructField(KEY, BinaryType()),
        StructField(ELEMENT, BinaryType()),
    ]
    if typed:
        fields += [
            StructField(INT_VALUE, LongType()),
            StructField(FLOAT_VALUE, DoubleType()),
            StructField(VALUE_COUNT, LongType()),
        ]
    return StructType(fields)


@functools.cache
def keyed_rows_type() -> StructType:
    """(key, element) rows (``GROUPED_SCHEMA``): buffers, grouped output, literal rows."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField(KEY, BinaryType()), StructField(ELEMENT, BinaryType())])


def coder_closure(plan: Plan, *coder_ids: str) -> bytes:
    """A serialized ``Components`` holding these coders and the coders they are built from."""
    components = bi.beam_runner_api_pb2.Components()
    pending = list(coder_ids)
    while pending:
        current = pending.pop()
        if current in components.coders:
            continue
        coder = plan.components.coders[current]
        components.coders[current].CopyFrom(coder)
        pending.extend(coder.component_coder_ids)
    return components.SerializeToString()


def spark_function_name(beam_name: str) -> str:
    """A Python identifier naming a Beam stage, shown in Spark's plans and UI."""
    name = re.sub(r"\W+", "_", beam_name).strip("_")
    return f"beam_{name}"[:120] or "beam_stage"


class TranslationContext:
    """Builds and memoises DataFrames for stages and buffers of one pipeline run."""

    def __init__(
        self,
        spark: SparkSession,
        plan: Plan,
        environment: beam_globals.TaskEnvironment,
        parallelism: int,
        sinks: TaskSinks,
        translator_for: Callable[[str], Translator | None],
    ) -> None:
        self.spark = spark
        self.plan = plan
        # What every task of the run applies first: its id, pickler and main session.
        self.environment = environment
        self.parallelism = parallelism
        self.sinks = sinks
        self.pipeline_context = bi.PipelineContext(plan.components)
        self._translator_for = translator_for
        self._stage_frames: dict[str, DataFrame] = {}
        self._buffer_frames: dict[bytes, DataFrame] = {}
        self.persisted: list[DataFrame] = []
        self.broadcasts: list[Any] = []
        self.side_input_elements: dict[bytes, list[bytes]] = {}
        # Stages computed on the driver (driver_side_inputs): what each wrote, None where it
        # ran on Spark after all.
        self.driver_runs: dict[str, DriverRows | None] = {}
        self.uses = self._count_uses(plan)

    @property
    def run_id(self) -> str:
        """The run's id: its Spark job group, query name and workers' globals carry it."""
        return self.environment.run_id

    @staticmethod
    def _count_uses(plan: Plan) -> Counter[str]:
        """How many times each stage's output DataFrame is read."""
        uses: Counter[str] = Counter()
        for buffer in plan.buffers.values():
            readers = len(buffer.main_readers) + (1 if buffer.side_readers else 0)
            for stage_name, _ in buffer.writers:
                uses[stage_name] += readers
        return uses

    def _translate(self, urn: str, node: Any) -> DataFrame:
        translator = self._translator_for(urn)
        if translator is None:  # validated before Spark starts; kept as a guard
            raise KeyError(f"No translator registered for {urn}")
        return translator.translate(node, self)

    def stage_frame(self, stage_name: str) -> DataFrame:
        """The (tag, key, element) output DataFrame of a fused stage.

        A stage the run computes on the driver (the plan's decision) gives the rows it
        wrote there, which its main-input readers read without running it again.
        """
        if stage_name not in self._stage_frames:
            frame = self._translate(EXECUTABLE_STAGE_URN, self.plan.stage(stage_name))
            # Read more than once: persist so user code runs once per element (rows the
            # driver wrote are literal already).
            if self.uses[stage_name] > 1 and self.driver_runs.get(stage_name) is None:
                from pyspark import StorageLevel

                frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
                self.persisted.append(frame)
            self._stage_frames[stage_name] = frame
        return self._stage_frames[stage_name]

    def buffer_frame(self, buffer_id: bytes) -> DataFrame:
        """The (key, element) DataFrame of a buffer."""
        if buffer_id not in self._buffer_frames:
            buffer = self.plan.buffers[buffer_id]
            self._buffer_frames[buffer_id] = self._translate(buffer.urn, buffer)
        return self._buffer_frames[buffer_id]

    def output_frame(self, stage_name: str, index: int) -> DataFrame:
        """The rows of a stage's output ``index`` (all columns of the stage's output).

        A stage with one output writes nothing else, so its rows are all of them: no
        filter, whose analysis costs driver time.
        """
        frame = self.stage_frame(stage_name)
        if len(self.plan.stage(stage_name).outputs) == 1:
            return frame
        return frame.filter(frame[TAG] == index)

    def writer_frames(self, buffer: PlannedBuffer) -> list[DataFrame]:
        """Each writer's contribution to a buffer, as (key, element) DataFrames."""
        frames = []
        for stage_name, index in buffer.writers:
            frame = self.output_frame(stage_name, index)
            # The frame's own columns: F.col would look the session up through Py4J.
            frames.append(frame.select(frame[KEY], frame[ELEMENT]))
        return frames

    def union(self, frames: list[DataFrame]) -> DataFrame:
        """The union of (key, element) DataFrames; an empty one for no frames."""
        if not frames:
            return self.spark.createDataFrame([], keyed_rows_type())
        return self.union_frames(frames)

    @staticmethod
    def union_frames(frames: list[DataFrame]) -> DataFrame:
        """The union of non-empty list of DataFrames with one schema."""
        result = frames[0]
        for frame in frames[1:]:
            result = result.unionAll(frame)
        return result

    def literal_rows(self, elements: Sequence[bytes]) -> DataFrame:
        """(key, element) rows holding ``elements`` (null keys), spread without a shuffle.

        Small ones are made once per session and content (``_LITERALS``): DataFrames are
        immutable plans, reused as the session's impulse rows are.
        """
        partitions = max(1, min(len(elements), self.parallelism))
        if sum(len(element) for element in elements) > _REMEMBERED_LITERAL_BYTES:
            return self._literal_rows(elements, partitions)
        key = (partitions, *elements)
        with _LITERALS_LOCK:
            remembered = _LITERALS.setdefault(self.spark, OrderedDict())
            frame = remembered.get(key)
            if frame is not None:
                remembered.move_to_end(key)
                return frame
        frame = self._literal_rows(elements, partitions)
        with _LITERALS_LOCK:
            remembered[key] = frame
            while len(remembered) > _REMEMBERED_LITERALS:
                remembered.popitem(last=False)
        return frame

    def literal_stage_rows(self, rows: DriverRows) -> DataFrame:
        """A fused stage's output rows written on the driver, spread without a shuffle."""
        table = pa.table(
            {
                TAG: pa.array(rows.tags, pa.int32()),
                KEY: pa.array(rows.keys, pa.binary()),
                ELEMENT: pa.array(rows.elements, pa.binary()),
            }
        )
        partitions = max(1, min(len(rows.elements), self.parallelism))
        return self._local_frame(table, stage_output_type(), partitions)

    def _local_frame(self, table: pa.Table, schema: StructType, partitions: int) -> DataFrame:
        """A DataFrame of ``table``'s rows in ``partitions`` partitions, without a shuffle."""
        if spark_compat.pyspark_version() >= (4, 0):
            # An Arrow table goes to the JVM as it is, as local rows: no Python worker
            # process, where an RDD of Python rows needs one per task just to convert them.
            frame = self.spark.createDataFrame(table, schema)
            # Spark scans local rows in min(max(rows, 1), default parallelism) partitions.
            scanned = min(max(table.num_rows, 1), self.spark.sparkContext.defaultParallelism)
            if partitions < scanned:
                return frame.coalesce(partitions)
            # A reused session whose default parallelism is lower than the run's: spread.
            return frame.repartition(partitions) if partitions > scanned else frame
        rows = self.spark.sparkContext.parallelize(
            [
                tuple(bytearray(v) if isinstance(v, bytes) else v for v in row.values())
                for row in table.to_pylist()
            ],
            partitions,
        )
        return self.spark.createDataFrame(rows, schema, verifySchema=False)

    def _literal_rows(self, elements: Sequence[bytes], partitions: int) -> DataFrame:
        """The rows of :meth:`literal_rows`, made anew.

        The rows are cut, in order, into ``min(len(elements), parallelism)`` partitions of
        near-equal size, so the stage that reads them uses every core: on PySpark 4+ from an
        Arrow table (local rows scanned in the JVM), on PySpark 3.5 from a ``parallelize``d
        RDD. Either costs a few Py4J calls whatever the number of elements, where a literal
        column costs some per element.
        """
        table = pa.table(
            {KEY: pa.nulls(len(elements), pa.binary()), ELEMENT: pa.array(elements, pa.binary())}
        )
        return self._local_frame(table, keyed_rows_type(), partitions)

    def leaf_frames(self) -> list[DataFrame]:
        """Stage DataFrames nothing reads: running them runs the whole pipeline."""
        return [self.stage_frame(s.name) for s in self.plan.stages if self.uses[s.name] == 0]

    def release(self) -> None:
        """Unpersists cached DataFrames and destroys side-input broadcasts."""
        for frame in self.persisted:
            try:
                frame.unpersist()
            except Exception:  # noqa: BLE001 - cleanup must not mask the real error
                _LOGGER.debug("Could not unpersist a DataFrame", exc_info=True)
        for broadcast in self.broadcasts:
            try:
                broadcast.destroy()
            except Exception:  # noqa: BLE001
                _LOGGER.debug("Could not destroy a broadcast", exc_info=True)
        self.persisted.clear()
        self.broadcasts.clear()
