"""The catalog keeps schema, partition-spec and sort-order ids unique and a table's UUID fixed, whatever ids a
client's commit carries (pyiceberg's RestCatalog against the real catalog server)."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import BadRequestError
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import StagedTable
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortField, SortOrder
from pyiceberg.table.update import (
    AddPartitionSpecUpdate,
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AddSortOrderUpdate,
    AssertCreate,
    AssignUUIDUpdate,
    SetCurrentSchemaUpdate,
    SetDefaultSortOrderUpdate,
    SetDefaultSpecUpdate,
    SetLocationUpdate,
    TableUpdate,
    UpgradeFormatVersionUpdate,
)
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from tests.conftest import pyiceberg_catalog

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(), required=False))
BY_NAME = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name"))


def new_namespace(server: CatalogServer, principal: CatalogPrincipal) -> tuple[Any, str]:
    catalog = pyiceberg_catalog(server, principal)
    namespace = f"ids_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(namespace)
    return catalog, namespace


def new_table(server: CatalogServer, principal: CatalogPrincipal, **properties: str) -> tuple[Any, str]:
    catalog, namespace = new_namespace(server, principal)
    catalog.create_table(f"{namespace}.t", SCHEMA, partition_spec=BY_NAME, properties=properties)
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


BY_ID = PartitionField(source_id=1, field_id=1001, transform=IdentityTransform(), name="id")


def spec_of(*fields: tuple[int, int, Any, str]) -> PartitionSpec:
    return PartitionSpec(*(PartitionField(source_id=s, field_id=f, transform=t, name=n) for s, f, t, n in fields))


def field_ids(spec: PartitionSpec) -> list[tuple[str, int]]:
    return [(f.name, f.field_id) for f in spec.fields]


def test_a_new_partition_field_gets_a_fresh_id_whatever_the_client_sent(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    # 1000 already names identity(name) in spec 0; 5000 would leave ids unassigned below it
    sent = spec_of((1, 1000, IdentityTransform(), "id"), (2, 5000, BucketTransform(16), "name_bucket"))
    metadata = commit(catalog, name, AddPartitionSpecUpdate(spec=sent), SetDefaultSpecUpdate(spec_id=-1))
    assert metadata.default_spec_id == 1 and field_ids(metadata.spec()) == [("id", 1001), ("name_bucket", 1002)]
    assert metadata.last_partition_id == 1002
    assert field_ids(metadata.specs()[0]) == [("name", 1000)]  # the original spec is untouched

    # a field repeated within one spec (as a client may send) still gets an id of its own
    twice = spec_of((2, 1000, IdentityTransform(), "name"), (2, 1000, IdentityTransform(), "name_again"))
    metadata = commit(catalog, name, AddPartitionSpecUpdate(spec=twice), SetDefaultSpecUpdate(spec_id=-1))
    assert field_ids(metadata.spec()) == [("name", 1000), ("name_again", 1003)] and metadata.last_partition_id == 1003


def test_a_spec_re_adding_an_earlier_field_keeps_its_id(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    commit(catalog, name, AddPartitionSpecUpdate(spec=PartitionSpec(BY_ID)), SetDefaultSpecUpdate(spec_id=-1))
    # identity(name) (spec 0) and identity(id) (spec 1) come back under other ids: they keep their own
    sent = spec_of((1, 1003, IdentityTransform(), "id"), (2, 1004, IdentityTransform(), "name"))
    metadata = commit(catalog, name, AddPartitionSpecUpdate(spec=sent), SetDefaultSpecUpdate(spec_id=-1))
    assert metadata.default_spec_id == 2 and field_ids(metadata.spec()) == [("id", 1001), ("name", 1000)]
    assert metadata.last_partition_id == 1001


def test_a_spec_the_table_has_under_other_field_ids_is_not_added_again(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    same = spec_of((2, 1007, IdentityTransform(), "name"))
    metadata = commit(catalog, name, AddPartitionSpecUpdate(spec=same), SetDefaultSpecUpdate(spec_id=-1))
    assert [s.spec_id for s in metadata.partition_specs] == [0] and metadata.default_spec_id == 0
    assert metadata.last_partition_id == 1000


def test_a_v3_table_gets_its_dropped_field_back_under_its_id(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer, **{"format-version": "3"})
    table = catalog.load_table(name)
    with table.update_spec() as update:
        update.remove_field("name").add_identity("id")
    with table.update_spec() as update:  # pyiceberg recycles ids in v2 only: it sends 1002 here
        update.add_identity("name")
    metadata = catalog.load_table(name).metadata
    assert metadata.format_version == 3 and metadata.default_spec_id == 2
    assert field_ids(metadata.spec()) == [("id", 1001), ("name", 1000)] and metadata.last_partition_id == 1001


def test_a_v1_spec_keeps_positional_field_ids(catalog_server: CatalogServer, engine_writer: CatalogPrincipal) -> None:
    catalog, name = new_table(catalog_server, engine_writer, **{"format-version": "1"})
    skipping = spec_of((2, 1000, IdentityTransform(), "name"), (1, 1005, IdentityTransform(), "id"))
    with pytest.raises(BadRequestError, match=r"v1 .*'id' has field-id 1005, expected 1001"):
        commit(catalog, name, AddPartitionSpecUpdate(spec=skipping))
    table = catalog.load_table(name)
    with table.update_spec() as update:
        update.add_identity("id")
    metadata = catalog.load_table(name).metadata
    assert field_ids(metadata.spec()) == [("name", 1000), ("id", 1001)] and metadata.last_partition_id == 1001


def test_a_create_transaction_to_v3_assigns_v3_partition_field_ids(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, namespace = new_namespace(catalog_server, engine_writer)
    location = f"{catalog_server.warehouse_location}/{namespace}/t"
    metadata = new_table_metadata(SCHEMA, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, location, {})
    # the spec follows upgrade-format-version: 3, so its field gets a fresh id (v1 would refuse 1005)
    updates = (
        AssignUUIDUpdate(uuid=metadata.table_uuid),
        UpgradeFormatVersionUpdate(format_version=3),
        AddSchemaUpdate(schema=SCHEMA),
        SetCurrentSchemaUpdate(schema_id=-1),
        AddPartitionSpecUpdate(spec=spec_of((2, 1005, IdentityTransform(), "name"))),
        SetDefaultSpecUpdate(spec_id=-1),
        AddSortOrderUpdate(sort_order=UNSORTED_SORT_ORDER),
        SetDefaultSortOrderUpdate(sort_order_id=-1),
        SetLocationUpdate(location=location),
    )
    staged = StagedTable((namespace, "t"), metadata, f"{location}/metadata/staged.json", load_file_io(), catalog)
    catalog.commit_table(staged, (AssertCreate(),), updates)
    created = catalog.load_table(f"{namespace}.t").metadata
    assert created.format_version == 3 and field_ids(created.spec()) == [("name", 1000)]
    assert created.last_partition_id == 1000


def test_a_spec_needing_an_id_past_the_largest_is_refused(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    location = catalog.load_table(name).metadata_location
    # a table whose metadata (written elsewhere) spent the last 32-bit partition field id
    bucket, _, key = location.removeprefix("s3://").partition("/")
    s3 = catalog_server.moto.client("s3")
    document = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    document["partition-specs"][0]["fields"][0]["field-id"] = document["last-partition-id"] = 2**31 - 1
    s3.put_object(Bucket=bucket, Key=key.replace(".metadata.json", "-spent.metadata.json"), Body=json.dumps(document))
    admin = pyiceberg_catalog(catalog_server, catalog_server.admin)
    admin.drop_table(name)
    admin.register_table(name, location.replace(".metadata.json", "-spent.metadata.json"))
    with pytest.raises(BadRequestError, match="no partition field id is left above last-partition-id 2147483647"):
        commit(catalog, name, AddPartitionSpecUpdate(spec=PartitionSpec(BY_ID)))
    assert catalog.load_table(name).metadata.last_partition_id == 2**31 - 1


def test_a_commit_adding_a_snapshot_keeps_the_ids_it_was_written_with_or_is_refused(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    """A snapshot's manifests name their spec and partition field ids, and the snapshot its schema: in a commit that
    adds one, an id the catalog would change is refused, never changed under it."""
    catalog, name = new_table(catalog_server, engine_writer)
    table = catalog.load_table(name)
    with table.transaction() as transaction:  # pyiceberg: a new spec and data written with it, in one commit
        with transaction.update_spec() as update:
            update.add_identity("id")
        transaction.append(pa.table({"id": pa.array([1], pa.int64()), "name": pa.array(["a"])}))
    evolved = catalog.load_table(name)
    assert [f.field_id for f in evolved.spec().fields] == [1000, 1001]
    assert evolved.scan().to_arrow().to_pylist() == [{"id": 1, "name": "a"}]

    wider = Schema(*SCHEMA.fields, NestedField(3, "extra", LongType(), required=False), schema_id=0)  # id taken
    snapshot = Snapshot(
        snapshot_id=4242,
        parent_snapshot_id=evolved.metadata.current_snapshot_id,
        sequence_number=evolved.metadata.last_sequence_number + 1,
        timestamp_ms=evolved.metadata.last_updated_ms + 1,
        manifest_list=f"{evolved.location()}/metadata/snap-4242.avro",
        summary=Summary(Operation.APPEND),
        schema_id=0,
    )
    with pytest.raises(BadRequestError, match=r"ids the catalog assigns otherwise \(schema 0 -> 1\)"):
        commit(catalog, name, AddSchemaUpdate(schema=wider), AddSnapshotUpdate(snapshot=snapshot))
    assert catalog.load_table(name).metadata.current_snapshot_id == evolved.metadata.current_snapshot_id


def test_a_pyiceberg_transaction_adding_a_spec_and_data_keeps_the_ids_it_wrote(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    """pyiceberg recycles a partition field id only for a field of the same name: a spec re-adding a dropped field
    under another name, and data written with it, in one commit, keep pyiceberg's fresh id (it clashes with
    nothing) instead of the commit being refused."""
    catalog, name = new_table(catalog_server, engine_writer)
    table = catalog.load_table(name)
    with table.update_spec() as update:
        update.remove_field("name").add_identity("id")
    with table.transaction() as transaction:
        with transaction.update_spec() as update:
            update.add_field("name", IdentityTransform(), "by_name")
        transaction.append(pa.table({"id": pa.array([1, 2], pa.int64()), "name": pa.array(["a", "b"])}))
    metadata = catalog.load_table(name).metadata
    assert field_ids(metadata.spec()) == [("id", 1001), ("by_name", 1002)] and metadata.last_partition_id == 1002
    scan = catalog.load_table(name).scan(row_filter="name = 'b'")
    assert [task.file.partition[1] for task in scan.plan_files()] == ["b"]
    assert scan.to_arrow().to_pylist() == [{"id": 2, "name": "b"}]


def test_a_commit_adding_a_snapshot_with_a_clashing_partition_field_id_is_refused(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> None:
    catalog, name = new_table(catalog_server, engine_writer)
    before = catalog.load_table(name).metadata
    snapshot = Snapshot(
        snapshot_id=4343,
        sequence_number=before.last_sequence_number + 1,
        timestamp_ms=before.last_updated_ms + 1,
        manifest_list=f"{before.location}/metadata/snap-4343.avro",
        summary=Summary(Operation.APPEND),
        schema_id=0,
    )
    clashing = spec_of((1, 1000, IdentityTransform(), "id"))  # 1000 names identity(name) in spec 0
    with pytest.raises(BadRequestError, match=r"partition field 'id': 1000 -> 1001"):
        commit(catalog, name, AddPartitionSpecUpdate(spec=clashing), AddSnapshotUpdate(snapshot=snapshot))
    assert catalog.load_table(name).metadata.partition_specs == before.partition_specs
