"""A streaming pipeline in batch, only where its batch run is one of its streaming runs.

A pipeline with an unbounded PCollection, or run with ``--streaming``, streams. When the
streaming path refuses it (a feature it lacks, or a PySpark too old to stream), it runs in
batch only where a batch run (every input read to its end, then the watermark and
processing time at +inf) is proven to give a result its streaming run gives:

* every unbounded PCollection comes from TestStreams whose scripts a batch run reproduces
  (:mod:`~beam_spark_runner.rewrites.batch_test_stream`). Any other unbounded source (an
  unbounded splittable DoFn such as ``PeriodicImpulse``, an unbounded read, a Spark stream)
  is not: a batch run reads it to its end before anything downstream fires, if it ends;
* no transform that the pipeline's other inputs, all bounded, reach fires on processing
  time (a processing-time trigger or timer). Beam moves a bounded input's watermark only
  once it is read to its end, as a batch run does, but a streaming run lets processing time
  pass while it reads, where a batch run fires processing time only after all of it.

Otherwise the pipeline is refused before Spark starts. Not checked: a DoFn that moves
timestamps back behind a watermark its input already passed.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.pvalue import PCollection
from apache_beam.testing.test_stream import TestStream

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.errors import UnsupportedFeatureError
from beam_spark_runner.rewrites.batch_test_stream import BatchTestStream, replace_test_streams
from beam_spark_runner.rewrites.watermark_observers import find_observers

# What the runner checks before it runs a streaming pipeline in batch (for error messages).
BATCH_RULE = (
    "SparkStructuredRunner runs a streaming pipeline in batch only where that is proven to "
    "give its streaming result: every unbounded PCollection comes from TestStreams whose "
    "scripts a batch run reproduces, and no transform its bounded inputs reach fires on "
    "processing time."
)


def _inputs(applied: AppliedPTransform) -> list[Any]:
    return list(applied.main_inputs.values()) + [side.pvalue for side in applied.side_inputs]


def _in_batch_test_stream(applied: AppliedPTransform) -> bool:
    parent = applied.parent
    while parent is not None:
        if isinstance(parent.transform, BatchTestStream):
            return True
        parent = parent.parent
    return False


class _Sources(PipelineVisitor):  # type: ignore[misc]
    """The primitive transforms that start unbounded PCollections, and the bounded roots."""

    def __init__(self) -> None:
        self.unbounded: list[AppliedPTransform] = []
        self.bounded_roots: dict[str, PCollection] = {}

    def visit_transform(self, applied: AppliedPTransform) -> None:
        transform = applied.transform
        if isinstance(transform, TestStream):
            return
        outputs = [output for output in applied.outputs.values() if isinstance(output, PCollection)]
        inputs = _inputs(applied)
        if not any(isinstance(pcoll, PCollection) for pcoll in applied.main_inputs.values()):
            if not _in_batch_test_stream(applied):
                for output in outputs:
                    if output.is_bounded:
                        self.bounded_roots[f"{applied.full_label}:{output.tag}"] = output
        if all(output.is_bounded for output in outputs):
            return
        if isinstance(transform, beam.ParDo):
            of_its_own = bi.is_unbounded_per_element(transform.fn)
        else:
            of_its_own = all(getattr(pcoll, "is_bounded", True) for pcoll in inputs)
        if of_its_own:
            self.unbounded.append(applied)


def _sources(pipeline: beam.Pipeline) -> _Sources:
    sources = _Sources()
    pipeline.visit(sources)
    return sources


def prepare_batch_run(pipeline: beam.Pipeline) -> str:
    """Readies a streaming pipeline for a batch run where that is proven; says what was checked.

    Replaces the TestStreams (see ``batch_test_stream``). Raises ``UnsupportedFeatureError``
    naming the transform a batch run could differ at, and why.
    """
    before = _sources(pipeline)
    if before.unbounded:
        applied = before.unbounded[0]
        raise UnsupportedFeatureError(
            f"Transform '{applied.full_label}' outputs an unbounded PCollection and is not "
            "a TestStream: a batch run reads it to its end (if it "
            "ends) before anything downstream fires, where a streaming run fires as it reads."
        )
    replaced = replace_test_streams(pipeline)
    after = _sources(pipeline)
    if after.unbounded:  # what replacing the TestStreams left unbounded
        applied = after.unbounded[0]
        raise UnsupportedFeatureError(
            f"Transform '{applied.full_label}' outputs an unbounded PCollection that no "
            "TestStream alone feeds: a batch run is not proven to end."
        )
    for observer in find_observers(pipeline, after.bounded_roots):
        if "processing" in observer.domains:
            raise UnsupportedFeatureError(
                f"Transform '{observer.label}' ({observer.why}) fires on processing time "
                "and is reached by the pipeline's bounded inputs: a streaming run lets "
                "processing time pass while it reads them, a batch run only after all of them."
            )
    checked = []
    if replaced:
        checked.append(
            f"its {replaced} TestStream(s) have scripts a batch run reproduces (no "
            "element late, no time passing between elements where a transform downstream "
            "could tell)"
        )
    checked.append(
        "every other input is bounded and reaches no transform that fires on processing time"
        if after.bounded_roots
        else "it has no other input"
    )
    return "; ".join(checked)
