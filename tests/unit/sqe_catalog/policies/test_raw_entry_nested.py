"""Raw read-restrictions entries on struct children keep their meaning through the catalog's canonical form.

A required field inside an optional struct is null wherever the struct is (the engine reads it through the
struct's validity), so the canonical form may not fold ``not-null`` on it to ``true`` or drop the ``is-null`` a
negated comparison needs. Each served filter is evaluated by the engine and compared with the raw one.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StructType

from sqe.restrictions import parse_restrictions
from sqe.restrictions.plan import apply
from sqe_catalog.policies.bind import Subject
from sqe_catalog.policies.resolve import RawEntry, resolve

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "s", StructType(NestedField(3, "x", LongType(), required=True)), required=False),
)
_STRUCT = pa.struct([pa.field("x", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"3"})])
BATCH = pa.record_batch(
    [pa.array([1, 2, 3]), pa.array([{"x": 1}, None, {"x": 9}], _STRUCT)],
    schema=pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"1"}),
            pa.field("s", _STRUCT, metadata={b"PARQUET:field_id": b"2"}),
        ]
    ),
)
X = {"type": "reference", "id": 3}


def _ids(document: Any) -> list[int]:
    plan = parse_restrictions(document, SCHEMA)
    return apply(BATCH, plan, salt=b"s" * 16, schema=SCHEMA).column("id").to_pylist()


def _served(document: Any) -> Any:
    resolution = resolve(
        table="ns.t",
        schema=SCHEMA,
        all_schemas=[SCHEMA],
        namespace=("ns",),
        table_uuid="00000000-0000-0000-0000-000000000001",
        subject=Subject("alice", frozenset(), frozenset()),
        snapshot=None,
        entries=[RawEntry("principal alice", document)],
    )
    return resolution.wire


@pytest.mark.parametrize(
    "row_filter",
    [
        {"type": "not-null", "child": X},
        {"type": "is-null", "child": X},
        {"type": "not", "child": {"type": "lt", "left": X, "right": 5}},
        {"type": "not", "child": {"type": "gt-eq", "left": X, "right": 5}},
    ],
)
def test_a_required_child_of_an_optional_struct_is_nullable_in_the_canonical_form(row_filter: Any) -> None:
    raw = {"required-row-filter": row_filter}
    assert _ids(_served(raw)) == _ids(raw)
