"""A bundle's outputs, turned into Arrow batches in the stage output layout."""

from __future__ import annotations

from collections.abc import Collection, Iterator

import numpy as np
import pyarrow as pa

from beam_spark_runner.coders import KeyExtractor, split_packed
from beam_spark_runner.coders.arrow_columns import STAGE_OUTPUT_SCHEMA
from beam_spark_runner.execution.key_runs import pack_by_key
from beam_spark_runner.execution.partial_aggregation import (
    TYPED_STAGE_OUTPUT_SCHEMA,
    PartialAggregator,
)
from beam_spark_runner.execution.stage_spec import OutputSpec, has_typed_outputs


class BundleOutputs:
    """The outputs of one bundle: per output index, the stream and element ends."""

    def __init__(self, output_count: int) -> None:
        self.data: list[list[tuple[bytes, list[int]]]] = [[] for _ in range(output_count)]

    def record_batches(
        self,
        outputs: tuple[OutputSpec, ...],
        key_extractors: dict[int, KeyExtractor],
        aggregators: dict[int, PartialAggregator] | None = None,
        unpacked: Collection[int] = (),
    ) -> Iterator[pa.RecordBatch]:
        """Arrow batches in the stage output layout (tag, key, element[, typed columns]).

        A keyed output's elements of one key go as one row, unless its index is in
        ``unpacked``: a stage with streamed side inputs reads each element's own header, so
        its main input keeps one element a row.
        """
        typed = has_typed_outputs(outputs)
        for index, chunks in enumerate(self.data):
            extractor = key_extractors.get(index)
            aggregator = (aggregators or {}).get(index)
            if aggregator is not None:
                for data, ends in chunks:
                    if ends:
                        yield aggregator.record_batch(index, data, ends)
                continue
            for data, ends in chunks:
                if not ends:
                    continue
                keys = extractor.keys(data, ends) if extractor is not None else None
                offset = 0
                for array in split_packed(data, ends):
                    count = len(array)
                    if keys is None:
                        key_array = pa.nulls(count, type=pa.binary())
                    elif index in unpacked:
                        key_array = pa.array(keys[offset : offset + count], type=pa.binary())
                    else:
                        # A key's elements travel to the shuffle as one row.
                        key_array, array = pack_by_key(
                            pa.array(keys[offset : offset + count], type=pa.binary()), array
                        )
                    offset += count
                    columns = [
                        pa.array(np.full(len(array), index, dtype=np.int32)),
                        key_array,
                        array,
                    ]
                    if typed:
                        columns += [
                            pa.nulls(len(array), pa.int64()),
                            pa.nulls(len(array), pa.float64()),
                            pa.nulls(len(array), pa.int64()),
                        ]
                    yield pa.RecordBatch.from_arrays(
                        columns, schema=TYPED_STAGE_OUTPUT_SCHEMA if typed else STAGE_OUTPUT_SCHEMA
                    )
