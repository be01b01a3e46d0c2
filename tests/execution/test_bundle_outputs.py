"""A bundle's outputs as Arrow batches: keyed outputs packed per key, unless told not to."""

from __future__ import annotations

import itertools

from apache_beam.coders import StrUtf8Coder, TupleCoder, VarIntCoder, WindowedValueCoder
from apache_beam.coders.coders import GlobalWindowCoder
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_spark_runner.coders import KeyExtractor
from beam_spark_runner.coders.arrow_columns import ELEMENT, KEY
from beam_spark_runner.execution.bundle_outputs import BundleOutputs
from beam_spark_runner.execution.stage_spec import OutputSpec


def _rows(unpacked: frozenset[int]) -> list[tuple[bytes, bytes]]:
    coder = WindowedValueCoder(TupleCoder([StrUtf8Coder(), VarIntCoder()]), GlobalWindowCoder())
    elements = [
        coder.encode(WindowedValue((key, n), Timestamp(n), (GlobalWindow(),)))
        for n, key in enumerate(["a", "b", "a"])
    ]
    bundle = BundleOutputs(1)
    bundle.data[0].append((b"".join(elements), list(itertools.accumulate(map(len, elements)))))
    batches = bundle.record_batches(
        (OutputSpec("out", "coder"),), {0: KeyExtractor(coder)}, unpacked=unpacked
    )
    return [
        (key, element)
        for batch in batches
        for key, element in zip(
            batch.column(KEY).to_pylist(), batch.column(ELEMENT).to_pylist(), strict=True
        )
    ]


def test_a_keyed_outputs_elements_of_a_key_go_as_one_row_unless_unpacked() -> None:
    packed = _rows(frozenset())
    unpacked = _rows(frozenset({0}))
    assert len(unpacked) == 3
    key_a, key_b = unpacked[0][0], unpacked[1][0]
    assert [key for key, _ in unpacked] == [key_a, key_b, key_a]
    assert sorted(packed) == sorted([(key_a, unpacked[0][1] + unpacked[2][1]), unpacked[1]])
