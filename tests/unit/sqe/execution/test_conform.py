"""Rows conformed to an Iceberg table's Arrow shape before a write: a required field inside an optional struct,
list or map is checked only where its parents hold a value (a NULL struct is a valid row)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, ListType, LongType, MapType, NestedField, StringType, StructType

from sqe.catalog.base import TableIdent
from sqe.errors import QueryError
from sqe.execution.conform import conform_for_write

IDENT = TableIdent("wh", ("ns",), "t")
POINT = StructType(NestedField(11, "x", LongType(), required=True), NestedField(12, "y", StringType(), required=False))
# What DuckDB hands back for a MAP(VARCHAR, STRUCT(x BIGINT, y VARCHAR)): every nested field nullable.
POINT_MAP = pa.map_(pa.string(), pa.struct([("x", pa.int64()), ("y", pa.string())]))


def _written(field_type: Any, values: list[Any], *, slice_from: int = 0) -> list[Any]:
    """``values`` as DuckDB hands them (every nested field nullable), conformed to one optional column."""
    schema = Schema(NestedField(1, "c", field_type, required=False))
    arrow_type = POINT_MAP if isinstance(field_type, MapType) else None
    rows = pa.table({"c": pa.array(values, arrow_type)}).slice(slice_from)
    table = conform_for_write(rows, schema, IDENT)
    table.validate(full=True)
    assert table.schema.field("c").type == _target(schema)
    return table.column("c").to_pylist()


def _target(schema: Schema) -> pa.DataType:
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(schema, include_field_ids=False).field("c").type


def test_a_null_struct_with_a_required_child_is_written() -> None:
    assert _written(POINT, [{"x": 1, "y": "a"}, None]) == [{"x": 1, "y": "a"}, None]


@pytest.mark.parametrize(
    ("field_type", "values", "path"),
    [
        (POINT, [{"x": None, "y": "a"}], "c.x"),
        (StructType(NestedField(11, "p", POINT, required=True)), [{"p": None}], "c.p"),
        (StructType(NestedField(11, "p", POINT, required=True)), [{"p": {"x": None, "y": None}}], "c.p.x"),
        (ListType(11, LongType(), element_required=True), [[1, None]], "c.element"),
        (ListType(11, POINT, element_required=False), [[{"x": None, "y": "b"}]], "c.element.x"),
        (MapType(11, StringType(), 12, POINT, value_required=True), [[("k", None)]], "c.value"),
        (MapType(11, StringType(), 12, POINT, value_required=False), [[("k", {"x": None, "y": "q"})]], "c.value.x"),
    ],
)
def test_a_null_where_its_parents_hold_a_value_is_refused_by_path(
    field_type: Any, values: list[Any], path: str
) -> None:
    with pytest.raises(QueryError, match=rf"NULL value in required field '{path}' of wh\.ns\.t"):
        _written(field_type, values)


@pytest.mark.parametrize(
    ("field_type", "values"),
    [
        (StructType(NestedField(11, "p", POINT, required=True)), [{"p": {"x": 1, "y": None}}, None]),
        (ListType(11, LongType(), element_required=True), [[1, 2], None, []]),
        (ListType(11, POINT, element_required=False), [[{"x": 1, "y": "a"}, None], None]),
        (MapType(11, StringType(), 12, POINT, value_required=True), [[("k", {"x": 1, "y": None})], None]),
        (StructType(NestedField(11, "l", ListType(12, IntegerType(), element_required=True), required=True)), [None]),
    ],
)
def test_required_fields_under_null_parents_are_written(field_type: Any, values: list[Any]) -> None:
    assert _written(field_type, values) == values


def test_a_slice_is_checked_over_its_own_rows_only() -> None:
    """Arrow slices keep the rows before them in their buffers; a NULL there is not one of the written rows."""
    assert _written(POINT, [{"x": None, "y": "gone"}, {"x": 2, "y": "b"}, None], slice_from=1) == [
        {"x": 2, "y": "b"},
        None,
    ]
    points = MapType(11, StringType(), 12, POINT, value_required=True)
    assert _written(points, [[("k", None)], [("k", {"x": 3, "y": None})]], slice_from=1) == [
        [("k", {"x": 3, "y": None})]
    ]


def test_a_null_list_hiding_entries_reads_as_null() -> None:
    """A NULL list slot may still span entries in Arrow (one of them NULL): the slot is NULL, its entries unread."""
    inner = pa.LargeListArray.from_arrays(
        pa.array([0, 2, 3], pa.int64()), pa.array([None, 1, 5]), mask=pa.array([True, False])
    )
    schema = Schema(NestedField(1, "c", ListType(11, LongType(), element_required=True), required=False))
    table = conform_for_write(pa.table({"c": inner}), schema, IDENT)
    table.validate(full=True)
    assert table.column("c").to_pylist() == [None, [5]]


@pytest.mark.parametrize(
    ("key_type", "key_arrow", "key", "path"),
    [
        (ListType(13, LongType(), element_required=True), pa.list_(pa.int64()), [1, None], "c.key.element"),
        (POINT, pa.struct([("x", pa.int64()), ("y", pa.string())]), {"x": None, "y": "a"}, "c.key.x"),
    ],
)
def test_a_null_inside_a_map_key_is_refused_by_path(key_type: Any, key_arrow: pa.DataType, key: Any, path: str) -> None:
    """Arrow's cast checks neither a list's elements nor, through a map's key, what the key nests: a NULL there
    passed (a list's) or failed with Arrow's own message (a struct's)."""
    schema = Schema(NestedField(1, "c", MapType(11, key_type, 12, LongType(), value_required=False), required=False))
    rows = pa.table({"c": pa.array([[(key, 1)]], pa.map_(key_arrow, pa.int64()))})
    with pytest.raises(QueryError, match=rf"NULL value in required field '{path}' of wh\.ns\.t"):
        conform_for_write(rows, schema, IDENT)


def test_a_null_in_a_required_column_is_refused() -> None:
    schema = Schema(NestedField(1, "c", LongType(), required=True))
    with pytest.raises(QueryError, match=r"NULL value in required column 'c' of wh\.ns\.t"):
        conform_for_write(pa.table({"c": pa.array([1, None])}), schema, IDENT)


def test_a_column_count_mismatch_names_the_counts_in_good_grammar() -> None:
    """Found by review: a one-column table was said to have "1 columns"."""
    schema = Schema(NestedField(1, "c", LongType(), required=False))
    with pytest.raises(QueryError, match=r"^wh\.ns\.t has 1 column, the statement produced 2$"):
        conform_for_write(pa.table({"a": [1], "b": [2]}), schema, IDENT)
