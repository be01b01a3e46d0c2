"""A ``beam.Create`` the runner holds (``native_create``): its elements as DataFrame rows.

The payload holds the values encoded with the Create's coder; each becomes the element
Beam's own expansion would produce at this point (the encoded value as ``bytes``, in the
global window at the minimum timestamp, no pane), encoded with the output PCollection's
data-channel coder. The rows are spread over the default parallelism without a shuffle
(``TranslationContext.literal_rows``); the stage reading them decodes the values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from beam_spark_runner import beam_internals as bi
from beam_spark_runner.planning import CREATE_URN, PlannedBuffer, decode_create_payload

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from beam_spark_runner.translators.base import TranslationContext


class CreateTranslator:
    """(key, element) rows holding a Create's elements, one per row."""

    urn = CREATE_URN

    def translate(self, node: PlannedBuffer, context: TranslationContext) -> DataFrame:
        """The Create's elements in at most ``context.parallelism`` partitions."""
        return context.literal_rows(create_elements(node.name, context))


def create_elements(transform_name: str, context: TranslationContext) -> list[bytes]:
    """The elements of the runner-held Create ``transform_name``, as its readers read them."""
    from apache_beam.transforms.window import GlobalWindows

    plan = context.plan
    transform = plan.components.transforms[transform_name]
    output = bi.only_element(list(transform.outputs.values()))
    coder = context.pipeline_context.coders[plan.data_channel_coders[output]].get_impl()
    return [
        coder.encode_nested(GlobalWindows.windowed_value(value))
        for value in decode_create_payload(transform.spec.payload)
    ]
