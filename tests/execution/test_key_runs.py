"""key_run_cells: each run of equal keys of a sorted batch, with its elements' bytes."""

import pyarrow as pa
import pytest

from beam_spark_runner.execution.key_runs import key_run_cells


@pytest.mark.parametrize("element_type", [pa.binary(), pa.large_binary()])
def test_one_cell_per_run_holding_its_elements_in_order(element_type):
    keys = pa.array([b"a", b"a", b"b", b"c", b"c", b"c"], pa.binary())
    elements = pa.array([b"1", b"", b"22", b"3", b"44", b"5"], element_type)
    assert key_run_cells(keys, elements) == [(b"a", b"1"), (b"b", b"22"), (b"c", b"3445")]


def test_sliced_arrays_read_from_their_offset():
    keys = pa.array([b"z", b"a", b"a", b"b", b"y"], pa.binary()).slice(1, 3)
    elements = pa.array([b"zz", b"1", b"2", b"3", b"yy"], pa.binary()).slice(1, 3)
    assert key_run_cells(keys, elements) == [(b"a", b"12"), (b"b", b"3")]


def test_null_elements_are_skipped():
    keys = pa.array([b"a", b"a", b"b"], pa.binary())
    elements = pa.array([b"1", None, b"3"], pa.binary())
    assert key_run_cells(keys, elements) == [(b"a", b"1"), (b"b", b"3")]


def test_empty_cells_and_empty_batches():
    keys = pa.array([b"a", b"b"], pa.binary())
    assert key_run_cells(keys, pa.array([b"", b""], pa.binary())) == [(b"a", b""), (b"b", b"")]
    empty = pa.array([], pa.binary())
    assert key_run_cells(empty, empty) == []
