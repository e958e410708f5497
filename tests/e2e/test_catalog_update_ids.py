"""The catalog keeps schema, partition-spec and sort-order ids unique and a table's UUID fixed, whatever ids a
client's commit carries (pyiceberg's RestCatalog against the real catalog server)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from pyiceberg.exceptions import BadRequestError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSortOrderUpdate,
    AssignUUIDUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    TableUpdate,
)
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from tests.conftest import pyiceberg_catalog

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), required=False))
BY_NAME = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name"))


def new_table(server: CatalogServer, principal: CatalogPrincipal) -> tuple[Any, str]:
    catalog = pyiceberg_catalog(server, principal)
    namespace = f"ids_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(namespace)
    catalog.create_table(f"{namespace}.t", SCHEMA, partition_spec=BY_NAME)
    return catalog, f"{namespace}.t"


def commit(catalog: Any, name: str, *updates: TableUpdate) -> Any:
    catalog.commit_table(catalog.load_table(name), (), updates)
    return catalog.load_table(name).metadata


def test_an_added_schema_whose_id_is_taken_gets_the_next_id(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    wider = Schema(*SCHEMA.fields, NestedField(3, "extra", LongType(), required=False), schema_id=0)
    metadata = commit(catalog, name, AddSchemaUpdate(schema=wider), SetCurrentSchemaUpdate(schema_id=-1))
    assert [s.schema_id for s in metadata.schemas] == [0, 1]
    assert metadata.current_schema_id == 1 and metadata.schema().find_field("extra").field_id == 3
    assert metadata.schema_by_id(0).fields == SCHEMA.fields  # the original schema is untouched


def test_an_added_schema_the_table_has_reuses_its_id(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    same = Schema(*SCHEMA.fields, schema_id=5)
    metadata = commit(catalog, name, AddSchemaUpdate(schema=same), SetCurrentSchemaUpdate(schema_id=-1))
    assert [s.schema_id for s in metadata.schemas] == [0] and metadata.current_schema_id == 0


def test_specs_and_sort_orders_keep_unique_ids(catalog_server: CatalogServer, engine_writer: CatalogPrincipal) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    metadata = commit(catalog, name, AddPartitionSpecUpdate(spec=BY_NAME), SetDefaultSpecUpdate(spec_id=-1))
    assert [s.spec_id for s in metadata.partition_specs] == [0] and metadata.default_spec_id == 0

    by_id = PartitionSpec(PartitionField(source_id=1, field_id=1001, transform=IdentityTransform(), name="id"))
    metadata = commit(catalog, name, AddPartitionSpecUpdate(spec=by_id), SetDefaultSpecUpdate(spec_id=0))
    assert [s.spec_id for s in metadata.partition_specs] == [0, 1]
    assert metadata.default_spec_id == 1 and metadata.spec().fields == by_id.fields

    sorted_by_id = SortOrder(SortField(source_id=1, transform=IdentityTransform()), order_id=0)
    metadata = commit(
        catalog, name, AddSortOrderUpdate(sort_order=sorted_by_id), SetDefaultSortOrderUpdate(sort_order_id=-1)
    )
    assert [o.order_id for o in metadata.sort_orders] == [0, 1] and metadata.default_sort_order_id == 1
    assert metadata.sort_order().fields == sorted_by_id.fields


def test_a_commit_cannot_change_the_table_uuid(catalog_server: CatalogServer, engine_writer: CatalogPrincipal) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    before = catalog.load_table(name).metadata.table_uuid
    with pytest.raises(BadRequestError, match="table-uuid"):
        commit(catalog, name, AssignUUIDUpdate(uuid=uuid.uuid4()))
    assert catalog.load_table(name).metadata.table_uuid == before
    assert commit(catalog, name, AssignUUIDUpdate(uuid=before)).table_uuid == before  # the same UUID is a no-op
