"""Server-side scan planning reads only the table's own manifests (real tables on a file:// warehouse)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest.scan_planning import PlanTableScanRequest
from pyiceberg.table import CommitTableResponse, Table

from sqe_catalog.auth import create_engine_for
from sqe_catalog.config import WarehouseConfig
from sqe_catalog.errors import BadRequestError, NotFoundError, UnprocessableEntityError
from sqe_catalog.planning import MAX_PLANS_PER_CALLER, PlanOwner, PlanStore, plan_files
from sqe_catalog.tables import CommitBody, StoredTable, WarehouseTables, parse_commit_body, parse_create_body

ROWS = pa.table({"id": pa.array([1, 2], pa.int64())})
SCHEMA = {"type": "struct", "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def tables(tmp_path: Path) -> WarehouseTables:
    warehouse = WarehouseConfig(name="wh", location=f"file://{tmp_path}/wh")
    tables = WarehouseTables(warehouse, create_engine_for(f"sqlite:///{tmp_path}/catalog.db"))
    tables.create_namespace(("db",), {})
    return tables


class _ThroughTables:
    """Stands in for pyiceberg's catalog so that its writers commit through WarehouseTables.commit_table."""

    def __init__(self, tables: WarehouseTables) -> None:
        self.tables = tables

    def commit_table(self, table: Table, requirements: Any, updates: Any) -> CommitTableResponse:
        *namespace, name = table.name()
        committed = self.tables.commit_table(
            tuple(namespace), name, CommitBody(requirements=requirements, updates=updates)
        )
        return CommitTableResponse(metadata=committed.metadata, metadata_location=committed.metadata_location or "")

    def _delete_old_metadata(self, *_args: Any) -> None:
        pass


def _table_with_rows(tables: WarehouseTables, name: str) -> StoredTable:
    tables.create_table(("db",), parse_create_body({"name": name, "schema": SCHEMA}))
    stored = tables.load_table(("db",), name)
    io = tables._catalog.io
    table = Table(("db", name), stored.metadata, str(stored.metadata_location), io, _ThroughTables(tables))  # type: ignore[arg-type]
    table.append(ROWS)  # pyiceberg writes its manifest list under <location>/metadata: accepted
    return tables.load_table(("db",), name)


def _plan(tables: WarehouseTables, name: str) -> list[dict[str, Any]]:
    return plan_files(tables.load_table(("db",), name), tables._catalog.io, PlanTableScanRequest(), None)


def _snapshot(stored: StoredTable, manifest_list: str, snapshot_id: int = 99) -> dict[str, Any]:
    return {
        "snapshot-id": snapshot_id,
        "sequence-number": stored.metadata.last_sequence_number + 1,
        "timestamp-ms": stored.metadata.last_updated_ms + 1,
        "manifest-list": manifest_list,
        "summary": {"operation": "append"},
        "schema-id": 0,
    }


def _add_snapshot(snapshot: dict[str, Any]) -> CommitBody:
    main = {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snapshot["snapshot-id"]}
    return parse_commit_body({"updates": [{"action": "add-snapshot", "snapshot": snapshot}, main]})


def _foreign_manifest_list(tables: WarehouseTables) -> tuple[StoredTable, str]:
    other = _table_with_rows(tables, "other")
    snapshot = other.metadata.current_snapshot()
    assert snapshot is not None and len(_plan(tables, "other")) == 1
    return other, snapshot.manifest_list


def test_a_commit_may_not_add_a_snapshot_reading_another_tables_manifest_list(tables: WarehouseTables) -> None:
    _other, foreign = _foreign_manifest_list(tables)
    mine = _table_with_rows(tables, "mine")
    with pytest.raises(BadRequestError, match="manifest-list must be inside the table's locations"):
        tables.commit_table(("db",), "mine", _add_snapshot(_snapshot(mine, foreign)))
    create = {
        "requirements": [{"type": "assert-create"}],
        "updates": [
            {"action": "add-schema", "schema": {**SCHEMA, "schema-id": 0}},
            {"action": "set-current-schema", "schema-id": -1},
            {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "add-snapshot", "snapshot": {**_snapshot(mine, foreign), "sequence-number": 1}},
        ],
    }
    with pytest.raises(BadRequestError, match="manifest-list"):  # a create transaction too
        tables.commit_table(("db",), "new", parse_commit_body(create))
    assert tables.load_table(("db",), "mine").metadata.current_snapshot() == mine.metadata.current_snapshot()
    assert not tables.table_exists(("db",), "new")


def test_a_manifest_list_under_write_metadata_path_is_the_tables_own(tables: WarehouseTables) -> None:
    tables.create_table(("db",), parse_create_body({"name": "t", "schema": SCHEMA}))
    elsewhere = f"{tables.root}/meta-of-t"
    moved = parse_commit_body(
        {"updates": [{"action": "set-properties", "updates": {"write.metadata.path": elsewhere}}]}
    )
    stored = tables.commit_table(("db",), "t", moved)
    committed = tables.commit_table(("db",), "t", _add_snapshot(_snapshot(stored, f"{elsewhere}/snap-1.avro")))
    assert committed.metadata.current_snapshot() is not None


def test_planning_refuses_manifests_outside_the_table(tables: WarehouseTables, tmp_path: Path) -> None:
    other, foreign = _foreign_manifest_list(tables)
    mine = _table_with_rows(tables, "mine")
    assert len(_plan(tables, "mine")) == 1
    # a manifest list inside the table that lists the other table's manifests: the commit cannot tell
    copied = f"{mine.location}/metadata/snap-copied.avro"
    shutil.copy(foreign.removeprefix("file://"), copied.removeprefix("file://"))
    tables.commit_table(("db",), "mine", _add_snapshot(_snapshot(mine, copied)))
    with pytest.raises(UnprocessableEntityError, match="manifests outside the table's locations"):
        _plan(tables, "mine")
    # a revision admitted from a file (register overwrite), whose snapshot names the other table's manifest list
    document = json.loads(Path(str(mine.metadata_location).removeprefix("file://")).read_text())
    document["snapshots"].append(_snapshot(mine, foreign, snapshot_id=98))
    document["current-snapshot-id"] = 98
    document["refs"] = {"main": {"snapshot-id": 98, "type": "branch"}}
    written = f"{mine.location}/metadata/00099-admitted.metadata.json"
    Path(written.removeprefix("file://")).write_text(json.dumps(document))
    tables.register_table(("db",), "mine", written, overwrite=True)
    with pytest.raises(UnprocessableEntityError, match="manifests outside the table's locations"):
        _plan(tables, "mine")
    assert len(_plan(tables, "other")) == 1 and other.location != mine.location


def test_one_caller_cannot_fill_the_plan_store() -> None:
    store = PlanStore(lifetime_seconds=600, max_tasks_per_caller=10_000)
    key = ("wh", ("db",), "t")
    other: PlanOwner = ("bob", "", "")
    kept, _, _ = store.add(other, key, [])
    task = {"data-file": {"file-path": "s3://b/t/data/f.parquet"}, "delete-files": []}
    first, _, _ = store.add(("alice", "", ""), key, [task])
    for _ in range(5000):  # within the lifetime: each plan would be held until it expires
        store.add(("alice", "", ""), key, [task])
    assert store.held(("alice", "", "")) <= MAX_PLANS_PER_CALLER
    with pytest.raises(NotFoundError):  # the caller's oldest plans make room for its newest
        store.get(first, ("alice", "", ""), key)
    assert store.get(kept, other, key) == []  # and never someone else's


@pytest.mark.parametrize("index", ["9" * 5000, "\u0661", "0", "-1", "x"])
def test_a_malformed_plan_task_index_is_no_such_plan_task(index: str) -> None:
    """Never a ValueError (a 500): an index too long for int(), or digits int() reads but no token has."""
    store = PlanStore(lifetime_seconds=600, max_tasks_per_caller=10_000)
    owner: PlanOwner = ("alice", "", "")
    key = ("wh", ("db",), "t")
    task = {"data-file": {"file-path": "s3://b/t/data/f.parquet"}, "delete-files": []}
    plan_id, _, tokens = store.add(owner, key, [task] * 250)
    assert tokens == [f"{plan_id}.1", f"{plan_id}.2"]
    with pytest.raises(NotFoundError, match="unknown plan task"):
        store.chunk(f"{plan_id}.{index}", owner, key)
