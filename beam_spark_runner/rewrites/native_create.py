"""``beam.Create`` without a Spark job of its own.

Beam expands a ``Create`` of several values into Impulse, a ``FlatMap`` of the encoded
values, a ``Reshuffle`` and ``Map(decode)``: on Spark, a job and a shuffle of its own. The
runner replaces it by a primitive holding the encoded values (``planning.CREATE_URN``)
followed by Beam's own ``Map(decode)``; the translator (``translators.create``) makes them
rows of a DataFrame over the default parallelism, with no shuffle, in the global window at
the minimum timestamp as Beam's expansion gives them. A Create of at most one value, with
``reshuffle=False``, or a subclass of ``Create`` is left as it is.
"""

from __future__ import annotations

import logging
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.pipeline import AppliedPTransform, PTransformOverride
from apache_beam.transforms.core import Windowing as BeamWindowing
from apache_beam.transforms.window import GlobalWindows

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import CREATE_URN, encode_create_payload

_LOGGER = logging.getLogger(__name__)


class EncodedValues(beam.PTransform):  # type: ignore[misc]
    """A runner primitive: a bounded PCollection of encoded values in the global window."""

    def __init__(self, encoded_values: list[bytes]) -> None:
        super().__init__()
        self._encoded_values = encoded_values

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.PCollection:
        return pvalue.PCollection(pbegin.pipeline, element_type=bytes, is_bounded=True)

    def get_windowing(self, unused_inputs: Any) -> BeamWindowing:
        return BeamWindowing(GlobalWindows())

    def infer_output_type(self, unused_input_type: Any) -> type:
        return bytes

    def to_runner_api_parameter(self, unused_context: Any) -> tuple[str, bytes]:
        return CREATE_URN, encode_create_payload(self._encoded_values)


class NativeCreate(beam.PTransform):  # type: ignore[misc]
    """What a reshuffling ``beam.Create`` becomes: the runner's values, then Beam's decode."""

    def __init__(self, create: beam.Create) -> None:
        super().__init__(label=create.label)
        self._create = create

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.PCollection:
        create = self._create
        coder = bi.create_coder(create)
        encoded = [coder.encode(value) for value in create.values]
        return (
            pbegin
            # Named as the root of Beam's own expansion: its per-step metrics keep their step.
            | "Impulse" >> EncodedValues(encoded)
            | "Map(decode)" >> beam.Map(coder.decode).with_output_types(create.get_output_type())
        )

    def get_windowing(self, unused_inputs: Any) -> BeamWindowing:
        return BeamWindowing(GlobalWindows())


class NativeCreateOverride(PTransformOverride):  # type: ignore[misc]
    """Replaces each ``beam.Create`` whose expansion would reshuffle by :class:`NativeCreate`."""

    def matches(self, applied_ptransform: AppliedPTransform) -> bool:
        transform = applied_ptransform.transform
        return (
            type(transform) is beam.Create
            and bool(transform.reshuffle)
            and len(transform.values) > 1
        )

    def get_replacement_transform_for_applied_ptransform(
        self, applied_ptransform: AppliedPTransform
    ) -> NativeCreate:
        transform = applied_ptransform.transform
        assert type(transform) is beam.Create  # matches() accepted only Creates
        _LOGGER.debug(
            "Create '%s' (%d values) becomes runner rows",
            applied_ptransform.full_label,
            len(transform.values),
        )
        return NativeCreate(transform)
