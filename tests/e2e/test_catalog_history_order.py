"""A commit keeps a table's history in order (``sqe_catalog.history``): a snapshot's sequence number must rise on
v2 and v3 tables alike, and a snapshot stamped more than a minute before the table's last update is refused (400),
since Iceberg's Java reader refuses metadata whose logs run backwards."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.test_catalog_row_lineage import Tables

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tables(catalog_server: CatalogServer) -> Tables:
    return Tables(catalog_server)


def refused(status: int, message: str, words: str) -> None:
    assert status == 400, message
    assert words in message and "Traceback" not in message


@pytest.mark.parametrize("format_version", ["2", "3"])
def test_a_snapshot_whose_sequence_number_does_not_rise_is_refused(tables: Tables, format_version: str) -> None:
    name = f"seq_v{format_version}"
    tables.create(name, format_version)
    lineage = {"first_row_id": 1, "added_rows": 1} if format_version == "3" else {}
    assert (
        tables.append(name, **{key: 0 if key == "first_row_id" else v for key, v in lineage.items()}).status_code == 200
    )
    stale = tables.append(name, sequence_number=1, **lineage)
    refused(stale.status_code, stale.text, "sequence-number 1")
    metadata = tables.metadata(name)
    assert [s["sequence-number"] for s in metadata["snapshots"]] == [1] and metadata["last-sequence-number"] == 1


def test_a_snapshot_from_the_past_is_refused_and_the_logs_stay_ordered(tables: Tables) -> None:
    tables.create("clock", "2")
    assert tables.append("clock").status_code == 200
    ten_minutes_ago = int(time.time() * 1000) - 600_000
    old = tables.append("clock", timestamp_ms=ten_minutes_ago)
    refused(old.status_code, old.text, "more than a minute before")
    assert tables.append("clock", timestamp_ms=int(time.time() * 1000) - 5_000).status_code == 200  # skew < 1 min
    metadata = tables.metadata("clock")
    logged = [e["timestamp-ms"] for e in metadata["snapshot-log"]] + [metadata["last-updated-ms"]]
    assert len(metadata["snapshots"]) == 2
    assert all(later >= earlier - 60_000 for earlier, later in itertools.pairwise(logged))


def snapshot_body(tables: Tables, name: str, sequence_number: int, parent: int | None) -> dict[str, Any]:
    snapshot_id = uuid.uuid4().int >> 65
    location = tables.metadata(name)["location"]
    return {
        "snapshot-id": snapshot_id,
        "parent-snapshot-id": parent,
        "sequence-number": sequence_number,
        "timestamp-ms": int(time.time() * 1000),
        "manifest-list": f"{location}/metadata/snap-{snapshot_id}.avro",
        "summary": {"operation": "append"},
        "schema-id": 0,
    }


def set_main(snapshot_id: int) -> dict[str, Any]:
    return {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snapshot_id}


def test_a_removed_snapshot_ends_the_history_before_it(tables: Tables) -> None:
    tables.create("expired", "2")
    for _ in range(3):
        assert tables.append("expired").status_code == 200
        time.sleep(0.01)
    s1, s2, s3 = tables.metadata("expired")["snapshot-log"]
    removed = tables.commit("expired", {"action": "remove-snapshots", "snapshot-ids": [s2["snapshot-id"]]})
    assert removed.status_code == 200, removed.text
    # s1 was not current from s2's time to s3's: its entry would send time travel to that moment to s1
    assert tables.metadata("expired")["snapshot-log"] == [s3]
    assert s1["snapshot-id"] in {s["snapshot-id"] for s in tables.metadata("expired")["snapshots"]}


def test_a_snapshot_replaced_within_its_commit_is_not_logged(tables: Tables) -> None:
    tables.create("intermediate", "2")
    first = snapshot_body(tables, "intermediate", 1, None)
    second = snapshot_body(tables, "intermediate", 2, first["snapshot-id"])
    response = tables.commit(
        "intermediate",
        {"action": "add-snapshot", "snapshot": first},
        set_main(first["snapshot-id"]),
        {"action": "add-snapshot", "snapshot": second},
        set_main(second["snapshot-id"]),
    )
    assert response.status_code == 200, response.text
    metadata = tables.metadata("intermediate")
    assert [e["snapshot-id"] for e in metadata["snapshot-log"]] == [second["snapshot-id"]]
    assert metadata["current-snapshot-id"] == second["snapshot-id"] and len(metadata["snapshots"]) == 2


def test_a_removed_snapshots_statistics_go_with_it(tables: Tables) -> None:
    tables.create("stats", "2")
    for _ in range(2):
        assert tables.append("stats").status_code == 200
    old, new = (s["snapshot-id"] for s in tables.metadata("stats")["snapshots"])
    location = tables.metadata("stats")["location"]

    def statistics(snapshot_id: int) -> dict[str, Any]:
        path = f"{location}/metadata/stats-{snapshot_id}.parquet"
        return {"snapshot-id": snapshot_id, "statistics-path": path, "file-size-in-bytes": 1}

    set_stats = [{"action": "set-partition-statistics", "partition-statistics": statistics(i)} for i in (old, new)]
    assert tables.commit("stats", *set_stats).status_code == 200
    assert tables.commit("stats", {"action": "remove-snapshots", "snapshot-ids": [old]}).status_code == 200
    assert [s["snapshot-id"] for s in tables.metadata("stats")["partition-statistics"]] == [new]


def test_main_cannot_become_a_tag(tables: Tables) -> None:
    tables.create("tagged", "2")
    assert tables.append("tagged").status_code == 200
    current = tables.metadata("tagged")["current-snapshot-id"]
    response = tables.commit("tagged", {**set_main(current), "type": "tag"})
    refused(response.status_code, response.text, "main ref must be a branch")
    assert tables.metadata("tagged")["refs"]["main"]["type"] == "branch"


def test_a_pyiceberg_overwrite_logs_only_the_snapshot_it_leaves_current(catalog_server: CatalogServer) -> None:
    # pyiceberg's overwrite commits a delete snapshot and an append snapshot in one request, each with its own
    # set-snapshot-ref main. Iceberg's Java TableMetadata.Builder logs both as main moves, then drops the delete's
    # entry (an intermediate snapshot: added and replaced as current in the same commit, so never current): time
    # travel to any moment never reads the empty table between the two. The catalog keeps the same log.
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from tests.conftest import pyiceberg_catalog

    catalog = pyiceberg_catalog(catalog_server, catalog_server.admin)
    ns = f"overwrite_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(ns)
    table = catalog.create_table(f"{ns}.t", Schema(NestedField(1, "id", LongType(), required=False)))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    table.overwrite(pa.table({"id": pa.array([3], pa.int64())}))
    metadata = catalog.load_table(f"{ns}.t").metadata
    operations = {s.snapshot_id: s.summary.operation.value for s in metadata.snapshots if s.summary is not None}
    appended, deleted, overwritten = (s.snapshot_id for s in metadata.snapshots)
    assert [operations[appended], operations[deleted], operations[overwritten]] == ["append", "delete", "append"]
    assert [entry.snapshot_id for entry in metadata.snapshot_log] == [appended, overwritten]
    assert metadata.current_snapshot_id == overwritten
    assert catalog.load_table(f"{ns}.t").scan().to_arrow()["id"].to_pylist() == [3]
