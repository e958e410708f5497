"""WarehouseTables on a local SQLite database and a file:// warehouse: identifiers, locations, properties."""

from __future__ import annotations

import dataclasses
import json
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from sqlalchemy import event

from sqe_catalog.auth import create_engine_for
from sqe_catalog.config import ServerConfig, WarehouseConfig
from sqe_catalog.errors import (
    AlreadyExistsError,
    BadRequestError,
    CommitFailedError,
    ForbiddenError,
    NoSuchNamespaceError,
)
from sqe_catalog.tables import (
    NamespaceNotEmptyError,
    TableCreate,
    WarehouseTables,
    catalog_io_properties,
    dropped_location_reuse,
    namespace_area_claims,
    parse_commit_body,
    validate_namespace,
    validate_table_name,
)
from tests.unit.sqe_catalog.test_restrictions import SCHEMA as API_SCHEMA
from tests.unit.sqe_catalog.test_restrictions import Catalog

REPO = Path(__file__).resolve().parents[3]
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


@pytest.fixture
def tables(tmp_path: Path) -> WarehouseTables:
    # A short credential lifetime: what a drop or stage reserves is free again within a test.
    warehouse = WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh", credential_lifetime_seconds=1)
    return WarehouseTables(warehouse, create_engine_for(f"sqlite:///{tmp_path}/catalog.db"))


def wait_out_reservations(tables: WarehouseTables) -> None:
    deadline = time.monotonic() + 3
    while tables.integrity.reserved_locations():
        assert time.monotonic() < deadline, "a reservation outlived the credential lifetime"
        time.sleep(0.05)


def _create(name: str, location: str | None = None, **properties: str) -> TableCreate:
    return TableCreate(name, SCHEMA, location, *_unpartitioned(), dict(properties), stage_create=False)


def _unpartitioned() -> tuple[Any, Any]:
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

    return UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER


@pytest.mark.parametrize(
    "levels", [[], [""], "db", ["a/b"], ["a\x1fb"], ["a\nb"], ["x" * 256], ["x" * 200, "y" * 60], [3]]
)
def test_invalid_namespaces_are_rejected(levels: Any) -> None:
    with pytest.raises(BadRequestError):
        validate_namespace(levels)


@pytest.mark.parametrize("name", ["", "a/b", "a\x00b", "a\x7f", "x" * 256, None])
def test_invalid_table_names_are_rejected(name: Any) -> None:
    with pytest.raises(BadRequestError):
        validate_table_name(name)


def test_valid_identifiers_pass() -> None:
    assert validate_namespace(["sales", "eu-west_1"]) == ("sales", "eu-west_1")
    assert validate_table_name("orders.v2") == "orders.v2"


def test_catalog_io_uses_the_warehouse_key_and_path_style() -> None:
    warehouse = WarehouseConfig(
        name="wh", location="s3://b/wh", endpoint="http://s3.local", access_key_id="AK", secret_access_key="SK"
    )
    props = catalog_io_properties(warehouse)
    assert props["s3.endpoint"] == "http://s3.local" and props["s3.access-key-id"] == "AK"
    assert props["s3.force-virtual-addressing"] == "false" and props["s3.region"] == "us-east-1"
    virtual = catalog_io_properties(warehouse.model_copy(update={"path_style": False}))
    assert virtual["s3.force-virtual-addressing"] == "true"


def test_default_location_and_namespace_rules(tables: WarehouseTables) -> None:
    with pytest.raises(NoSuchNamespaceError):
        tables.create_namespace(("a", "b"), {})
    tables.create_namespace(("a",), {})
    tables.create_namespace(("a", "b"), {"owner": "x"})
    with pytest.raises(AlreadyExistsError):
        tables.create_namespace(("a",), {})
    created = tables.create_table(("a", "b"), _create("t"))
    assert created.location == f"{tables.root}/a/b/t"
    assert created.metadata_location is not None and created.metadata_location.startswith(f"{tables.root}/a/b/t/")
    with pytest.raises(AlreadyExistsError):
        tables.create_table(("a", "b"), _create("t"))
    with pytest.raises(NamespaceNotEmptyError):
        tables.drop_namespace(("a",))  # child namespace
    with pytest.raises(NamespaceNotEmptyError):
        tables.drop_namespace(("a", "b"))  # table


def test_locations_outside_the_warehouse_or_overlapping_are_rejected(tables: WarehouseTables, tmp_path: Path) -> None:
    tables.create_namespace(("db",), {})
    bad = [
        f"file://{tmp_path}/elsewhere/t",
        f"{tables.root}",
        f"{tables.root}/db/../../escape",
        f"{tables.root}//db/t",
        f"{tables.root}-sibling/t",
        "s3://warehouse/wh/db/t",
    ]
    for location in bad:
        with pytest.raises(BadRequestError):
            tables.create_table(("db",), _create("t", location))
    with pytest.raises(BadRequestError):
        tables.create_table(("db",), _create("t", **{"write.data.path": f"file://{tmp_path}/elsewhere"}))
    tables.create_table(("db",), _create("t"))
    with pytest.raises(BadRequestError, match="overlaps"):
        tables.create_table(("db",), _create("inner", f"{tables.root}/db/t/inner"))
    with pytest.raises(BadRequestError, match="overlaps"):
        tables.create_table(("db",), _create("u", **{"write.data.path": f"{tables.root}/db/t/data"}))


def test_class_loading_properties_are_refused(tables: WarehouseTables) -> None:
    tables.create_namespace(("db",), {})
    for key in ("py-io-impl", "write.py-location-provider.impl"):
        with pytest.raises(BadRequestError, match=key):
            tables.create_table(("db",), _create("t", **{key: "evil.Class"}))
    tables.create_table(("db",), _create("t"))
    commit = parse_commit_body({"updates": [{"action": "set-properties", "updates": {"py-io-impl": "evil.X"}}]})
    with pytest.raises(BadRequestError):
        tables.commit_table(("db",), "t", commit)


def test_table_properties_never_reach_the_catalog_file_io(tables: WarehouseTables) -> None:
    catalog = tables._catalog
    assert catalog._load_file_io({"s3.endpoint": "http://attacker.invalid", "py-io-impl": "x.Y"}) is catalog.io


def test_commit_moving_a_table_outside_is_rejected(tables: WarehouseTables, tmp_path: Path) -> None:
    tables.create_namespace(("db",), {})
    tables.create_table(("db",), _create("t"))
    moved = parse_commit_body({"updates": [{"action": "set-location", "location": f"file://{tmp_path}/x"}]})
    with pytest.raises(BadRequestError):
        tables.commit_table(("db",), "t", moved)
    fine = parse_commit_body({"updates": [{"action": "set-properties", "updates": {"k": "v"}}]})
    assert tables.commit_table(("db",), "t", fine).metadata.properties["k"] == "v"


def test_catalog_toml_example_documents_every_key() -> None:
    raw = tomllib.loads((REPO / "catalog.toml.example").read_text(encoding="utf-8"))
    assert set(raw["server"]) == set(ServerConfig.model_fields)
    assert set(raw["warehouses"][0]) == set(WarehouseConfig.model_fields)


def test_purge_deletes_only_under_the_tables_own_locations(tables: WarehouseTables) -> None:
    tables.create_namespace(("db",), {})
    a = tables.create_table(("db",), _create("a"))
    b = tables.create_table(("db",), _create("b"))
    assert a.metadata_location is not None and b.metadata_location is not None
    # A client-written snapshot of table a names a file of table b as its manifest list.
    snapshot = {
        "snapshot-id": 7,
        "sequence-number": 1,
        "timestamp-ms": a.metadata.last_updated_ms + 1,
        "manifest-list": b.metadata_location,
        "summary": {"operation": "append"},
        "schema-id": 0,
    }
    commit = parse_commit_body(
        {
            "updates": [
                {"action": "add-snapshot", "snapshot": snapshot},
                {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 7},
            ]
        }
    )
    with pytest.raises(BadRequestError, match="manifest-list"):  # a commit cannot add it any more ...
        tables.commit_table(("db",), "a", commit)
    # ... but a metadata file written by the client and admitted (register overwrite) still can
    document = json.loads(Path(a.metadata_location.removeprefix("file://")).read_text())
    document.update(snapshots=[snapshot], refs={"main": {"snapshot-id": 7, "type": "branch"}})
    document["current-snapshot-id"] = 7
    written = f"{a.location}/metadata/00001-client.metadata.json"
    Path(written.removeprefix("file://")).write_text(json.dumps(document))
    committed = tables.register_table(("db",), "a", written, overwrite=True)
    assert committed.metadata_location == written
    tables.drop_table(("db",), "a", purge=True)
    assert Path(committed.metadata_location.removeprefix("file://")).exists(), "the drop only persists the task"
    assert list(tables.run_cleanup().values()) == ["done"]  # what the background cleaner runs
    assert not Path(committed.metadata_location.removeprefix("file://")).exists(), "a's own files are gone"
    assert Path(b.metadata_location.removeprefix("file://")).exists(), "b's file survived a's purge"
    assert tables.load_table(("db",), "b").metadata_location == b.metadata_location


# ----------------------------------------------------------------------------------------------------
# Tables dropped without purge keep their locations (their files are still in storage)


def _set_data_path(path: str) -> Any:
    return parse_commit_body({"updates": [{"action": "set-properties", "updates": {"write.data.path": path}}]})


def _refuse_claim(namespace: tuple[str, ...], name: str) -> None:
    assert (namespace, name) == (("sales",), "orders")  # the dropped table, by its API name
    raise ForbiddenError("refused by the check")


def test_a_location_dropped_without_purge_is_not_claimed_again(tables: WarehouseTables) -> None:
    tables.create_namespace(("sales",), {})
    tables.create_namespace(("scratch",), {})
    old = tables.create_table(("sales",), _create("orders", **{"write.data.path": f"{tables.root}/raw/orders"}))
    tables.create_table(("scratch",), _create("mine"))
    tables.drop_table(("sales",), "orders", purge=False)
    claims = [
        lambda: tables.create_table(("scratch",), _create("a", old.location)),
        lambda: tables.create_table(("scratch",), _create("b", f"{old.location}/inner")),  # nested
        lambda: tables.create_table(("scratch",), _create("c", f"{tables.root}/raw")),  # around the data path
        lambda: tables.stage_table(("scratch",), dataclasses.replace(_create("d", old.location), stage_create=True)),
        lambda: tables.commit_table(("scratch",), "mine", _set_data_path(f"{tables.root}/raw/orders/x")),
        lambda: tables.register_table(("scratch",), "e", str(old.metadata_location)),
    ]
    refused = r"dropped or moved table sales\.orders, whose files are still in storage"
    for claim in claims:
        with pytest.raises(ForbiddenError, match=refused):
            claim()
    assert tables.list_tables(("scratch",)) == ["mine"]
    # The same name again, at the default location: created beside the old files, never over them.
    again = tables.create_table(("sales",), _create("orders"))
    assert again.location.startswith(f"{old.location}-") and again.location != old.location
    tables.drop_table(("sales",), "orders", purge=True)
    with dropped_location_reuse(_refuse_claim), pytest.raises(ForbiddenError, match="refused by the check"):
        tables.create_table(("scratch",), _create("a", old.location))
    tables.create_table(("scratch",), _create("elsewhere", f"{tables.root}/raw/other"))  # a sibling is free
    with dropped_location_reuse(lambda namespace, name: None):  # allowed (api.py decides per request)
        tables.register_table(("sales",), "orders", str(old.metadata_location))
    # the re-registered table holds the location: paths inside it are its own, no new claim
    assert tables.commit_table(("sales",), "orders", _set_data_path(f"{old.location}/data2")).metadata


def test_a_purge_drop_frees_the_location_once_its_files_are_deleted(tables: WarehouseTables) -> None:
    # Found by review: a purge drop recorded nothing, yet its files stay until the cleaner runs; meanwhile a new
    # table at the same location (the default one of the same name) was vended credentials for them.
    tables.create_namespace(("db",), {})
    location = tables.create_table(("db",), _create("t")).location
    tables.drop_table(("db",), "t", purge=True)
    with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.t"):
        tables.create_table(("db",), _create("claim", location))
    assert tables.create_table(("db",), _create("t")).location.startswith(f"{location}-")  # beside, not over
    assert set(tables.run_cleanup().values()) == {"done"}
    # The files are gone, but keys vended before the drop may still be valid for the place: reserved until then.
    with pytest.raises(ForbiddenError, match=r"credentials were vended for \(table db\.t\): it is reserved until"):
        tables.create_table(("db",), _create("claim", location))
    wait_out_reservations(tables)
    assert tables.create_table(("db",), _create("claim", location)).location == location


def test_a_failed_purge_keeps_guarding_the_location(tables: WarehouseTables) -> None:
    tables.create_namespace(("db",), {})
    created = tables.create_table(("db",), _create("t"))
    tables.drop_table(("db",), "t", purge=True)
    Path(str(created.metadata_location).removeprefix("file://")).unlink()  # the cleaner cannot verify: deletes nothing
    assert set(tables.run_cleanup().values()) == {"failed"}
    with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.t"):
        tables.create_table(("db",), _create("claim", created.location))


def test_a_legacy_table_dropped_without_purge_keeps_its_locations(tables: WarehouseTables, tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    tables.create_namespace(("db",), {})
    legacy = SqlCatalog("wh", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=tables.root)  # no recorded locations
    location = f"{tables.root}/db/old"
    legacy.create_table(("db", "old"), SCHEMA, location=location, properties={"write.data.path": f"{location}-data"})
    legacy.engine.dispose()
    tables.drop_table(("db",), "old", purge=False)
    for claim in (location, f"{location}-data/x"):
        with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.old"):
            tables.create_table(("db",), _create("new", claim))


def test_an_existing_database_gains_the_dropped_locations_table(tmp_path: Path) -> None:
    from sqlalchemy import text

    warehouse = WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh")
    engine = create_engine_for(f"sqlite:///{tmp_path}/catalog.db")
    WarehouseTables(warehouse, engine).create_namespace(("db",), {})
    with engine.begin() as conn:  # a database made before the table existed
        conn.execute(text("DROP TABLE sqe_dropped_table_locations"))
    tables = WarehouseTables(warehouse, engine)  # what a server start does
    old = tables.create_table(("db",), _create("t"))
    tables.drop_table(("db",), "t", purge=False)
    with pytest.raises(ForbiddenError):
        tables.create_table(("db",), _create("u", old.location))


@pytest.mark.parametrize("outside", ["other table", "engine host"])
def test_admitted_metadata_may_not_log_files_outside_the_table(
    tables: WarehouseTables, tmp_path: Path, outside: str
) -> None:
    # Found by review: a registered metadata-log named another table's metadata file; the next commit trimmed it,
    # and a writer honouring write.metadata.delete-after-commit.enabled deleted it.
    tables.create_namespace(("db",), {})
    a = tables.create_table(("db",), _create("a"))
    victim = tables.create_table(("db",), _create("victim"))
    logged = str(victim.metadata_location) if outside == "other table" else f"file://{tmp_path}/host/server.toml"
    document = json.loads(Path(str(a.metadata_location).removeprefix("file://")).read_text())
    document["metadata-log"] = [{"metadata-file": logged, "timestamp-ms": 1}]
    refusal = "metadata-log names a file that is not the table's own"
    elsewhere = f"{tables.root}/db/b/metadata/00001-client.metadata.json"
    Path(elsewhere.removeprefix("file://")).parent.mkdir(parents=True)
    Path(elsewhere.removeprefix("file://")).write_text(json.dumps({**document, "location": f"{tables.root}/db/b"}))
    with pytest.raises(BadRequestError, match=refusal):
        tables.register_table(("db",), "b", elsewhere)
    written = f"{a.location}/metadata/00001-client.metadata.json"
    Path(written.removeprefix("file://")).write_text(json.dumps(document))
    with pytest.raises(BadRequestError, match=refusal):
        tables.register_table(("db",), "a", written, overwrite=True)
    document["metadata-log"] = [{"metadata-file": str(a.metadata_location), "timestamp-ms": 1}]  # its own: fine
    Path(written.removeprefix("file://")).write_text(json.dumps(document))
    assert tables.register_table(("db",), "a", written, overwrite=True).metadata_location == written


def test_a_purge_the_store_refuses_fails_and_keeps_the_tombstone(tables: WarehouseTables) -> None:
    # Found by review: a refused delete was passed over and the task reported done, so the tombstone went while
    # files stayed. Here the store refuses one delete: a logged metadata file that is a non-empty directory.
    tables.create_namespace(("db",), {})
    created = tables.create_table(("db",), _create("t"))
    document = json.loads(Path(str(created.metadata_location).removeprefix("file://")).read_text())
    stubborn = f"{created.location}/metadata/00000-stubborn.metadata.json"
    Path(stubborn.removeprefix("file://"), "inside").mkdir(parents=True)
    document["metadata-log"] = [{"metadata-file": stubborn, "timestamp-ms": 1}]
    written = f"{created.location}/metadata/00001-client.metadata.json"
    Path(written.removeprefix("file://")).write_text(json.dumps(document))
    tables.register_table(("db",), "t", written, overwrite=True)
    tables.drop_table(("db",), "t", purge=True)
    assert set(tables.run_cleanup().values()) == {"failed"}
    with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.t"):
        tables.create_table(("db",), _create("claim", created.location))


def test_a_dropped_namespace_wide_location_refuses_creates_instead_of_hanging(tables: WarehouseTables) -> None:
    # Found by review: when a dropped table's data path held the whole namespace, no fresh name beside the default
    # location was ever free and every create without a location in that namespace looped for good.
    import threading

    tables.create_namespace(("db",), {})
    tables.create_table(("db",), _create("wide", **{"write.data.path": f"{tables.root}/db"}))
    tables.drop_table(("db",), "wide", purge=False)
    outcome: list[BaseException | None] = []

    def create() -> None:
        try:
            tables.create_table(("db",), _create("t2"))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=create, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert outcome, "the create did not return"
    assert isinstance(outcome[0], ForbiddenError) and "dropped or moved table db.wide" in outcome[0].message


def test_metadata_logging_the_tables_own_earlier_metadata_path_is_admitted_again(tables: WarehouseTables) -> None:
    # Found by review: entries written where an earlier write.metadata.path put them were refused as "outside"
    tables.create_namespace(("db",), {})
    tables.create_table(("db",), _create("t", **{"write.metadata.path": f"{tables.root}/db/t_meta"}))
    for updates in (
        {"action": "set-properties", "updates": {"x": "1"}},
        {"action": "remove-properties", "removals": ["write.metadata.path"]},
    ):
        tables.commit_table(("db",), "t", parse_commit_body({"updates": [updates]}))
    current = tables.load_table(("db",), "t")
    assert any("/t_meta/" in entry.metadata_file for entry in current.metadata.metadata_log)
    again = tables.register_table(("db",), "t", str(current.metadata_location), overwrite=True)
    assert again.metadata_location == current.metadata_location


def test_a_readmission_may_not_add_files_of_other_or_dropped_tables_to_the_log(tables: WarehouseTables) -> None:
    # Found by review: entries outside every table's current locations passed, such as another table's older
    # metadata (under its former write.metadata.path) or a dropped, unpurged table's metadata file.
    tables.create_namespace(("db",), {})
    a = tables.create_table(("db",), _create("a"))
    victim = tables.create_table(("db",), _create("victim", **{"write.metadata.path": f"{tables.root}/db/v_meta"}))
    remove = {"action": "remove-properties", "removals": ["write.metadata.path"]}
    tables.commit_table(("db",), "victim", parse_commit_body({"updates": [remove]}))
    gone = tables.create_table(("db",), _create("gone"))
    tables.drop_table(("db",), "gone", purge=False)
    for foreign in (str(victim.metadata_location), str(gone.metadata_location)):
        document = json.loads(Path(str(a.metadata_location).removeprefix("file://")).read_text())
        document["metadata-log"] = [{"metadata-file": foreign, "timestamp-ms": 1}]
        written = f"{a.location}/metadata/00001-client.metadata.json"
        Path(written.removeprefix("file://")).write_text(json.dumps(document))
        with pytest.raises(BadRequestError, match="metadata-log names a file that is not the table's own"):
            tables.register_table(("db",), "a", written, overwrite=True)


def test_a_readmission_keeps_the_places_the_catalog_recorded(tmp_path: Path) -> None:
    # Found by review: the places a re-admission moves the table away from were taken from the displaced file as
    # storage holds it now (no metadata cache here): rewritten to name the new place, it left the recorded place
    # unclaimed, for another table to take while credentials vended for it were still valid.
    warehouse = WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh", metadata_cache_entries=0)
    tables = WarehouseTables(warehouse, create_engine_for(f"sqlite:///{tmp_path}/catalog.db"))
    tables.create_namespace(("db",), {})
    a = tables.create_table(("db",), _create("a"))
    current = Path(str(a.metadata_location).removeprefix("file://"))
    document = {**json.loads(current.read_text()), "location": f"{a.location}-moved"}
    written = f"{a.location}-moved/metadata/00001-client.metadata.json"
    Path(written.removeprefix("file://")).parent.mkdir(parents=True)
    Path(written.removeprefix("file://")).write_text(json.dumps(document))
    current.write_text(json.dumps(document))  # storage rewrites the current file to name the new place too
    assert tables.register_table(("db",), "a", written, overwrite=True).location == f"{a.location}-moved"
    with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.a"):
        tables.create_table(("db",), _create("squat", a.location))


def test_a_location_a_commit_moves_away_from_is_not_claimed_again(tables: WarehouseTables) -> None:
    # Found by review: a commit that moved a table (set-location, or another write.data.path) released the old
    # place, though the table's snapshots still name the files there; a new table at that place was vended
    # credentials for them (a restricted user with TABLE_CREATE read another table's raw files).
    tables.create_namespace(("sales",), {})
    tables.create_namespace(("scratch",), {})
    old = tables.create_table(("sales",), _create("orders", **{"write.data.path": f"{tables.root}/raw/orders"}))
    moved = {"action": "set-location", "location": f"{old.location}-moved"}
    tables.commit_table(("sales",), "orders", parse_commit_body({"updates": [moved]}))
    tables.commit_table(("sales",), "orders", _set_data_path(f"{tables.root}/raw/orders2"))
    for place in (old.location, f"{tables.root}/raw/orders"):
        with pytest.raises(ForbiddenError, match=r"files are still in storage"):
            tables.create_table(("scratch",), _create("a", place))
    # Moving back needs what reusing a dropped place needs (the tombstone does not say whose files remain there).
    back = parse_commit_body({"updates": [{"action": "set-location", "location": old.location}]})
    with pytest.raises(ForbiddenError):
        tables.commit_table(("sales",), "orders", back)
    with dropped_location_reuse(lambda namespace, name: None):
        assert tables.commit_table(("sales",), "orders", back).location == old.location
    # A move inside the table's own location displaces nothing.
    tables.commit_table(("sales",), "orders", _set_data_path(f"{old.location}/data"))
    tables.commit_table(("sales",), "orders", _set_data_path(f"{old.location}/data2"))
    tables.create_table(("scratch",), _create("b", f"{tables.root}/raw/other"))  # a sibling is free


def _create_transaction(location: str) -> Any:
    """A create transaction's commit (what a client sends after a staged create) for a one-column table."""
    schema = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
    return parse_commit_body(
        {
            "requirements": [{"type": "assert-create"}],
            "updates": [
                {"action": "set-location", "location": location},
                {"action": "add-schema", "schema": schema},
                {"action": "set-current-schema", "schema-id": -1},
                {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
                {"action": "set-default-spec", "spec-id": -1},
                {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
                {"action": "set-default-sort-order", "sort-order-id": -1},
            ],
        }
    )


def test_a_staged_create_reserves_its_place_for_the_credential_lifetime(tables: WarehouseTables) -> None:
    # Found by review: a staged create recorded nothing, yet its response may carry credentials for the place. A
    # table created there next (say, at the default place of a table not created yet) was read with those keys.
    tables.create_namespace(("scratch",), {})
    tables.create_namespace(("secure",), {})
    target = tables.default_location(("secure",), "payroll")
    with namespace_area_claims(lambda namespace: None):  # a caller who may create tables in both namespaces
        tables.stage_table(("scratch",), dataclasses.replace(_create("x", target), stage_create=True))
        with pytest.raises(ForbiddenError, match=r"vended for \(table scratch\.x\): it is reserved until"):
            tables.create_table(("secure",), _create("other", target))
        payroll = tables.create_table(("secure",), _create("payroll"))
        assert payroll.location.startswith(f"{target}-")  # its default place is reserved: a fresh one beside it
        # The staged table's own create transaction may claim it.
        assert tables.commit_table(("scratch",), "x", _create_transaction(target)).location == target
        elsewhere = f"{tables.root}/scratch/y"
        tables.stage_table(("scratch",), dataclasses.replace(_create("y", elsewhere), stage_create=True))
        with pytest.raises(ForbiddenError, match="reserved until"):
            tables.create_table(("secure",), _create("z", elsewhere))
        wait_out_reservations(tables)  # the credentials it may have vended have expired: the place is free
        assert tables.create_table(("secure",), _create("z", elsewhere)).location == elsewhere


def test_a_deep_location_costs_at_most_one_namespace_lookup_per_possible_level(tmp_path: Path) -> None:
    # Found by review: finding whose area a location is in looked up one namespace per level of the location,
    # under the location lock: a create at a location 20,000 levels deep (40 KB) ran 40,000 statements for 97 s
    # while every other create and location commit waited. No namespace is deeper than MAX_NAMESPACE_DEPTH.
    engine = create_engine_for(f"sqlite:///{tmp_path}/catalog.db")
    tables = WarehouseTables(WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh"), engine)
    tables.create_namespace(("scratch",), {})
    tables.create_namespace(("secure",), {})
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _k, statement, *_a: statements.append(statement))
    levels = "/".join(["a"] * 2000)
    tables.stage_table(
        ("scratch",), dataclasses.replace(_create("x", f"{tables.root}/scratch/{levels}"), stage_create=True)
    )
    assert len(statements) < 200, f"{len(statements)} statements for one staged create"
    # The deepest namespace still decides: a deep place in another namespace's area is refused.
    with pytest.raises(ForbiddenError, match="area of namespace secure"):
        tables.stage_table(
            ("scratch",), dataclasses.replace(_create("y", f"{tables.root}/secure/{levels}"), stage_create=True)
        )


def _refuse_area(namespace: tuple[str, ...]) -> None:
    raise ForbiddenError(f"no create rights in {'.'.join(namespace)}")


def test_a_table_goes_into_another_namespaces_area_only_with_create_rights_there(tables: WarehouseTables) -> None:
    # Found by review: a caller who may create tables in scratch only could create, or stage-create (and be
    # vended credentials for), a table at the default place of a secure table not created yet, or squat all of
    # secure's area so that no table could be created there at its default place.
    for namespace in (("scratch",), ("secure",), ("secure", "inner")):
        tables.create_namespace(namespace, {})
    claims = [
        lambda: tables.stage_table(
            ("scratch",),
            dataclasses.replace(_create("x", tables.default_location(("secure",), "payroll")), stage_create=True),
        ),
        lambda: tables.create_table(("scratch",), _create("y", f"{tables.root}/secure")),
        lambda: tables.create_table(("scratch",), _create("z", **{"write.data.path": f"{tables.root}/secure/d"})),
        lambda: tables.create_table(("secure", "inner"), _create("up", f"{tables.root}/secure/up")),  # the parent's
    ]
    for claim in claims:
        with pytest.raises(ForbiddenError, match=r"inside the area of namespace secure$"):
            claim()
        with namespace_area_claims(_refuse_area), pytest.raises(ForbiddenError, match="no create rights in secure"):
            claim()
    assert tables.list_tables(("scratch",)) == [] and tables.list_tables(("secure", "inner")) == []
    # Its own area and those of namespaces nested in it are the namespace's own; a place in no namespace's area
    # is checked as before.
    assert tables.create_table(("secure",), _create("down", f"{tables.root}/secure/inner/down")).location
    assert tables.create_table(("scratch",), _create("raw", f"{tables.root}/raw/x")).location == f"{tables.root}/raw/x"
    assert tables.create_table(("secure",), _create("payroll")).location == tables.default_location(
        ("secure",), "payroll"
    )
    with namespace_area_claims(lambda namespace: None):  # a caller who may create tables in secure too
        assert tables.create_table(("scratch",), _create("w", f"{tables.root}/secure/w")).location


def test_a_dropped_table_registered_again_under_another_name_takes_back_its_reserved_place(
    tables: WarehouseTables,
) -> None:
    tables.create_namespace(("db",), {})
    old = tables.create_table(("db",), _create("t"))
    tables.drop_table(("db",), "t", purge=False)
    with dropped_location_reuse(lambda namespace, name: None):  # a content manager
        with pytest.raises(ForbiddenError, match=r"\(table db\.t\): it is reserved until"):
            tables.create_table(("db",), _create("other", old.location))  # another table: not while keys are valid
        again = tables.register_table(("db",), "again", str(old.metadata_location))  # the same table (its UUID)
    assert again.location == old.location


def test_a_location_a_commit_removes_is_not_claimed_again(tables: WarehouseTables) -> None:
    # Found by review: removing write.data.path (or write.metadata.path) moves the table away from that place as
    # a new path does, but only set-location and set-properties were seen as moves: the place was released while
    # the table's snapshots still name the files there, and any table created there was vended keys for them.
    tables.create_namespace(("sales",), {})
    tables.create_namespace(("scratch",), {})
    data, meta = f"{tables.root}/raw/orders", f"{tables.root}/raw/orders_meta"
    tables.create_table(("sales",), _create("orders", **{"write.data.path": data, "write.metadata.path": meta}))
    remove = {"action": "remove-properties", "removals": ["write.data.path", "write.metadata.path"]}
    tables.commit_table(("sales",), "orders", parse_commit_body({"updates": [remove]}))
    for place in (data, meta):
        with pytest.raises(ForbiddenError, match=r"dropped or moved table sales\.orders"):
            tables.create_table(("scratch",), _create("a", place))


def test_a_location_a_readmission_moves_away_from_is_not_claimed_again(tables: WarehouseTables) -> None:
    # Found by review: a register overwrite (or notification UPDATE) of the same table at another location
    # released the old place as a commit's move once did; a new table there was vended keys for the old files.
    tables.create_namespace(("sales",), {})
    tables.create_namespace(("scratch",), {})
    old = tables.create_table(("sales",), _create("orders"))
    document = json.loads(Path(str(old.metadata_location).removeprefix("file://")).read_text())
    moved = f"{old.location}-moved"
    document["location"] = moved
    written = f"{moved}/metadata/00001-client.metadata.json"
    Path(written.removeprefix("file://")).parent.mkdir(parents=True)
    Path(written.removeprefix("file://")).write_text(json.dumps(document))
    assert tables.register_table(("sales",), "orders", written, overwrite=True).location == moved
    with pytest.raises(ForbiddenError, match=r"dropped or moved table sales\.orders"):
        tables.create_table(("scratch",), _create("a", old.location))


def test_a_rename_takes_the_records_of_places_left_under_its_name_but_not_a_pending_purges(
    tables: WarehouseTables,
) -> None:
    # Records follow the name as restriction entries do; a purge's tombstone stays where its task looks for it.
    tables.create_namespace(("db",), {})
    purged = tables.create_table(("db",), _create("t")).location
    tables.drop_table(("db",), "t", purge=True)
    live = tables.create_table(("db",), _create("t"))
    tables.commit_table(
        ("db",), "t", parse_commit_body({"updates": [{"action": "set-location", "location": f"{live.location}-moved"}]})
    )
    tables.rename_table((("db",), "t"), (("db",), "u"))
    with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.u"):
        tables.create_table(("db",), _create("claim", live.location))
    with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.t"):
        tables.create_table(("db",), _create("claim", purged))
    assert set(tables.run_cleanup().values()) == {"done"}
    wait_out_reservations(tables)
    assert tables.create_table(("db",), _create("claim", purged)).location == purged
    # A failed purge keeps its tombstone for good (its files stay): that one follows the name.
    failed = tables.create_table(("db",), _create("f"))
    tables.drop_table(("db",), "f", purge=True)
    Path(str(failed.metadata_location).removeprefix("file://")).unlink()
    assert set(tables.run_cleanup().values()) == {"failed"}
    tables.create_table(("db",), _create("f"))
    tables.rename_table((("db",), "f"), (("db",), "g"))
    with pytest.raises(ForbiddenError, match=r"dropped or moved table db\.g"):
        tables.create_table(("db",), _create("claim2", failed.location))


def _reserved_until(tables: WarehouseTables, name: str) -> list[int]:
    return [r.until_ms for r in tables.integrity.reserved_locations() if r.name == name]


def test_a_drop_reserves_until_the_latest_vended_expiry_or_the_lifetime_when_none_is_known(tmp_path: Path) -> None:
    # The vendor records each STS credential's expiry before handing it out; a drop reserves until the latest one.
    # A database whose tables may hold credentials no process recorded (an earlier version's) gets the lifetime
    # asked for, from the start of the first process that records expiries.
    warehouse = WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh", credential_lifetime_seconds=600)
    engine = create_engine_for(f"sqlite:///{tmp_path}/catalog.db")
    first = WarehouseTables(warehouse, engine)
    first.create_namespace(("db",), {})
    for name in ("a", "b", "c"):
        first.create_table(("db",), _create(name))
    before = time.time() * 1000
    first.drop_table(("db",), "a", purge=False)  # nothing recorded, no tables at start: the lifetime
    assert before + 600_000 <= _reserved_until(first, "a")[0] <= time.time() * 1000 + 600_000
    restarted = WarehouseTables(warehouse, engine)  # a serving start, with tables: covered for the lifetime
    restarted.cover_unrecorded_credentials()
    soon = int(time.time() * 1000) + 5_000
    restarted.integrity.record_vended_expiry(soon)  # a shorter expiry does not lower the cover
    restarted.drop_table(("db",), "b", purge=False)
    assert _reserved_until(restarted, "b")[0] >= before + 600_000
    fresh = WarehouseTables(warehouse, create_engine_for(f"sqlite:///{tmp_path}/fresh.db"))
    fresh.create_namespace(("db",), {})
    fresh.create_table(("db",), _create("c"))
    fresh.integrity.record_vended_expiry(soon)
    fresh.integrity.record_vended_expiry(soon - 1_000)  # an earlier expiry keeps the later one
    fresh.drop_table(("db",), "c", purge=False)
    assert _reserved_until(fresh, "c") == [soon]


def test_a_start_up_cover_yields_to_an_expiry_another_process_records_meanwhile(tmp_path: Path) -> None:
    # Before: the start-up cover read no recorded expiry and inserted one; when another process (a serving catalog
    # vending, or a second start: `admin run-cleanup` from cron) recorded the warehouse's first expiry in between,
    # the insert's unique-key failure escaped and the process failed to start. Now the cover looks again and
    # keeps the later of the two.
    warehouse = WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh", credential_lifetime_seconds=600)
    url = f"sqlite:///{tmp_path}/catalog.db"
    first = WarehouseTables(warehouse, create_engine_for(url))
    first.create_namespace(("db",), {})
    first.create_table(("db",), _create("t"))  # a table, and no expiry recorded: the next start covers it
    other = create_engine_for(url)
    engine = create_engine_for(url)
    later = int(time.time() * 1000) + 3_600_000
    raced: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def another_process_records_first(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT INTO sqe_vended_credentials") and not raced:
            raced.append(statement)
            with other.begin() as conn:
                conn.exec_driver_sql(f"INSERT INTO sqe_vended_credentials VALUES ('wh', {later})")

    restarted = WarehouseTables(warehouse, engine)
    restarted.cover_unrecorded_credentials()  # as a serving process's start does
    assert raced, "the cover inserted"
    restarted.drop_table(("db",), "t", purge=False)
    assert _reserved_until(restarted, "t") == [later]


def test_a_reregister_keeps_the_recorded_table_uuid_not_the_one_of_the_stored_file(tables: WarehouseTables) -> None:
    # Found by review: a re-admission had to keep the UUID of the current metadata file as read from storage (not
    # verified: a re-admission may repair a broken one), so a plaintext file rewritten there with another UUID let
    # a register overwrite admit and record it, shedding the column tags matched by the table's UUID. The UUID the
    # catalog recorded with the pointer is the one kept.
    tables.create_namespace(("db",), {})
    a = tables.create_table(("db",), _create("a"))
    stored = Path(str(a.metadata_location).removeprefix("file://"))
    document = json.loads(stored.read_text())
    other = {**document, "table-uuid": "00000000-0000-4000-8000-000000000001", "metadata-log": []}
    stored.write_text(json.dumps(other))  # rewritten in storage (a holder of its write keys can)
    written = f"{a.location}/metadata/00001-client.metadata.json"
    Path(written.removeprefix("file://")).write_text(json.dumps(other))
    with pytest.raises(CommitFailedError, match="another table-uuid"):
        tables.register_table(("db",), "a", written, overwrite=True)
    stored.write_text(json.dumps(document))
    assert tables.load_table(("db",), "a").metadata.table_uuid == a.metadata.table_uuid


def test_a_location_with_a_uri_fragment_or_query_character_is_refused(tables: WarehouseTables) -> None:
    # Found by review: pyiceberg's FileIO parses a location as a URI, so a table placed at <root>/db/x#y (or with
    # such a write.metadata.path) had its metadata file written to <root>/db/x, outside every place it claims.
    tables.create_namespace(("db",), {})
    for properties in ({}, {"write.metadata.path": f"{tables.root}/db/m?y"}, {"write.data.path": f"{tables.root}/d#"}):
        location = f"{tables.root}/db/x#y" if not properties else None
        with pytest.raises(BadRequestError, match="not a normalised location"):
            tables.create_table(("db",), _create("x", location, **properties))
    assert not Path(f"{tables.root}/db/x".removeprefix("file://")).exists()
    assert not Path(f"{tables.root}/db/m".removeprefix("file://")).exists()


def test_a_register_never_reads_another_tables_files_for_its_caller(tmp_path: Path) -> None:
    # Found by review: a register (or notification) read any file inside the warehouse with the catalog's key, then
    # refused one that was not table metadata with details of what it held, to a caller with no right to the
    # table the file belonged to: TABLE_CREATE on a namespace of its own was enough to learn whether a file of
    # another table exists, its first invalid byte and position, or a number in it. A file under another table's
    # location is read now only for a caller who may write that table's files (and so could have put it there).
    catalog = Catalog(tmp_path)
    catalog.principal("root", admin=True)
    for name in ("mallory", "writer"):
        catalog.principal(name)
        catalog.store.create_role(name)
        catalog.store.assign_role(name, name)
        assert catalog.admin("grant", name, "TABLE_CREATE", "--warehouse", "wh", "--namespace", "sandbox") == 0
    for namespace in ("db", "sandbox"):
        assert catalog.request("root", "POST", "/v1/wh/namespaces", namespace=[namespace]).status == 200
    assert catalog.request("root", "POST", "/v1/wh/namespaces/db/tables", name="t", schema=API_SCHEMA).status == 200
    grant = ["TABLE_WRITE_DATA", "--warehouse", "wh", "--namespace", "db", "--table", "t"]
    assert catalog.admin("grant", "writer", *grant) == 0
    data = tmp_path / "wh" / "db" / "t" / "data"
    data.mkdir(parents=True)
    (data / "a.json").write_text('{"salary": 123456.5}')
    (data / "b.parquet").write_bytes(b"PAR1\x15\x00123-45-6789\xff")
    answers = set()
    for name in ("a.json", "b.parquet", "missing.json"):
        body = {"name": "x", "metadata-location": f"file://{data / name}"}
        reply = catalog.request("mallory", "POST", "/v1/wh/namespaces/sandbox/register", **body)
        assert reply.status == 403, reply.body
        answers.add(reply.json()["error"]["message"])
    assert len(answers) == 1 and "TABLE_WRITE_DATA" in answers.pop(), "the same answer: nothing was read"
    assert "salary" not in str(answers)
    body = {"name": "x", "metadata-location": f"file://{data / 'a.json'}"}
    reply = catalog.request("writer", "POST", "/v1/wh/namespaces/sandbox/register", **body)
    assert reply.status == 400 and "floating-point number" in reply.json()["error"]["message"], "its own files"
    assert catalog.request("root", "HEAD", "/v1/wh/namespaces/sandbox/tables/x").status == 404
