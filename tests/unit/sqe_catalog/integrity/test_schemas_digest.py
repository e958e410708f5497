"""The schemas digest the catalog records with a protected table's pointer (``guard.schemas_digest``): it changes
with anything read-restrictions bind to (a column's name, id, type, nesting; the current schema), and with nothing
else a revision carries."""

from __future__ import annotations

from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.types import LongType, NestedField, StringType, StructType

from sqe_catalog.integrity.guard import schemas_digest


def _metadata(*fields: NestedField, properties: dict[str, str] | None = None) -> TableMetadata:
    return new_table_metadata(
        Schema(*fields),
        UNPARTITIONED_PARTITION_SPEC,
        UNSORTED_SORT_ORDER,
        "s3://b/wh/ns/t",
        properties or {},
        table_uuid=None,
    )


ID = NestedField(1, "id", LongType(), required=True)
REGION = NestedField(2, "region", StringType(), required=False)
EMAIL = NestedField(3, "email", StringType(), required=False)


def test_the_same_schemas_give_the_same_digest_whatever_else_differs() -> None:
    first = _metadata(ID, REGION, EMAIL)
    other = _metadata(ID, REGION, EMAIL, properties={"owner": "x"})  # another uuid and properties too
    assert schemas_digest(first) == schemas_digest(other)
    assert schemas_digest(TableMetadataUtil.parse_raw(first.model_dump_json())) == schemas_digest(first)


def test_names_swapped_between_columns_change_the_digest() -> None:
    swapped = (NestedField(2, "email", StringType(), required=False), NestedField(3, "region", StringType()))
    assert schemas_digest(_metadata(ID, *swapped)) != schemas_digest(_metadata(ID, REGION, EMAIL))


def test_a_type_or_a_nested_name_changes_the_digest() -> None:
    base = schemas_digest(_metadata(ID, REGION))
    assert schemas_digest(_metadata(ID, NestedField(2, "region", LongType(), required=False))) != base
    nested = NestedField(2, "region", StructType(NestedField(4, "code", StringType())), required=False)
    renamed = NestedField(2, "region", StructType(NestedField(4, "name", StringType())), required=False)
    assert schemas_digest(_metadata(ID, nested)) != schemas_digest(_metadata(ID, renamed))
