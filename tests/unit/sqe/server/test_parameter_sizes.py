"""The decoded size of parameter rows, which ``[server] max_parameter_bytes`` counts."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sqe.errors import QueryError
from sqe.server.parameter_sizes import MIN_VALUE_BYTES, batch_bytes


def _bytes(column: pa.Array) -> int:
    return batch_bytes(pa.record_batch([column], names=["c"]))


def test_plain_columns_count_their_buffers_and_at_least_a_word_a_value() -> None:
    assert _bytes(pa.array([1, 2, 3], pa.int64())) == 24
    assert _bytes(pa.array([True] * 10)) == 10 * MIN_VALUE_BYTES
    strings = pa.array(["x" * 100] * 10)
    assert _bytes(strings) == strings.nbytes


@pytest.mark.parametrize(
    ("column", "at_least"),
    [
        (pa.nulls(1_000_000), 8_000_000),
        (pa.DictionaryArray.from_arrays(pa.array([0] * 1000, pa.int8()), ["x" * 10_000]), 10_000_000),
        (pa.RunEndEncodedArray.from_arrays([1_000_000], ["x" * 10]), 10_000_000),
        (pa.array([[None] * 1000] * 1000, pa.list_(pa.null())), 8_000_000),
        (pa.array([{"a": None}] * 1000, pa.struct([("a", pa.null())])), 16_000),
    ],
    ids=["nulls", "dictionary", "run_end_encoded", "lists_of_nulls", "struct_of_nulls"],
)
def test_encodings_that_repeat_values_count_every_repetition(column: pa.Array, at_least: int) -> None:
    assert column.nbytes < at_least // 10
    assert _bytes(column) >= at_least


def test_a_sliced_column_counts_only_its_rows() -> None:
    lists = pa.array([[1] * 100] * 100, pa.list_(pa.int64()))
    assert _bytes(lists.slice(0, 1)) == MIN_VALUE_BYTES + 100 * 8


@pytest.mark.parametrize(
    "column",
    [
        pa.UnionArray.from_dense(pa.array([0] * 3, pa.int8()), pa.array([0] * 3, pa.int32()), [pa.array(["x"])]),
        pa.array([[1]], pa.list_view(pa.int64())),
        pa.DictionaryArray.from_arrays(pa.array([0], pa.int8()), pa.array([[1]])),
    ],
    ids=["dense_union", "list_view", "dictionary_of_lists"],
)
def test_columns_that_may_reach_one_value_any_number_of_times_are_refused(column: pa.Array) -> None:
    with pytest.raises(QueryError, match="parameter column 'c'"):
        _bytes(column)
