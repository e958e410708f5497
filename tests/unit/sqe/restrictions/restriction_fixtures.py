"""Shared schema and batch builders for the read-restriction unit tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

# One optional top-level column per primitive type, plus nested types; ids are stable across tests.
ALL_TYPES = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "b", BooleanType(), required=False),
    NestedField(3, "i", IntegerType(), required=False),
    NestedField(4, "l", LongType(), required=False),
    NestedField(5, "f", FloatType(), required=False),
    NestedField(6, "d", DoubleType(), required=False),
    NestedField(7, "dec", DecimalType(9, 2), required=False),
    NestedField(8, "s", StringType(), required=False),
    NestedField(9, "dt", DateType(), required=False),
    NestedField(10, "t", TimeType(), required=False),
    NestedField(11, "ts", TimestampType(), required=False),
    NestedField(12, "tstz", TimestamptzType(), required=False),
    NestedField(13, "ts_ns", TimestampNanoType(), required=False),
    NestedField(14, "tstz_ns", TimestamptzNanoType(), required=False),
    NestedField(15, "u", UUIDType(), required=False),
    NestedField(16, "fx", FixedType(3), required=False),
    NestedField(17, "bin", BinaryType(), required=False),
    NestedField(
        18,
        "addr",
        StructType(
            NestedField(19, "city", StringType(), required=False),
            NestedField(20, "zip", IntegerType(), required=True),
        ),
        required=False,
    ),
    NestedField(21, "tags", ListType(22, StringType(), element_required=False), required=False),
    NestedField(
        23,
        "attrs",
        MapType(24, StringType(), 25, LongType(), value_required=False),
        required=False,
    ),
    NestedField(
        26,
        "m2",
        MapType(
            27,
            StructType(NestedField(28, "k1", StringType(), required=True)),
            29,
            StringType(),
            value_required=False,
        ),
        required=False,
    ),
    NestedField(30, "req_s", StringType(), required=True),
    schema_id=1,
)

FIELD_IDS = {field.name: field.field_id for field in ALL_TYPES.fields}


def ref(field_id: int) -> dict[str, Any]:
    return {"type": "reference", "id": field_id}


def restrictions(row_filter: Any = None, projections: list[tuple[int, str]] | None = None) -> dict[str, Any]:
    document: dict[str, Any] = {}
    if row_filter is not None:
        document["required-row-filter"] = row_filter
    if projections is not None:
        document["required-column-projections"] = [
            {"field-id": field_id, "action": action} for field_id, action in projections
        ]
    return document


def batch_of(schema: Schema, columns: dict[str, Any]) -> pa.RecordBatch:
    """A batch with pyiceberg's Arrow types and field-id metadata for the named top-level columns."""
    arrow_schema = schema_to_pyarrow(schema)
    fields = [arrow_schema.field(name) for name in columns]
    arrays = [pa.array(values, type=field.type) for values, field in zip(columns.values(), fields, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def simple_schema(*fields: NestedField) -> Schema:
    return Schema(*fields)


# The string masks straight from the spec text, one code point at a time: every kernel must agree with these.
def ref_mask(text: str) -> str:
    return "".join("n" if "0" <= ch <= "9" else ch if ch in "(),.-@" else "x" for ch in text)


def ref_first_4(text: str) -> str:
    return text if len(text) <= 4 else text[:4] + ref_mask(text[4:])


def ref_last_4(text: str) -> str:
    return text if len(text) <= 4 else ref_mask(text[:-4]) + text[-4:]


REFERENCE: dict[str, Callable[[str], str]] = {
    "mask-alphanum": ref_mask,
    "show-first-4": ref_first_4,
    "show-last-4": ref_last_4,
}
