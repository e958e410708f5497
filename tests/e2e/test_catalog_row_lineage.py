"""Row lineage on format-version 3 tables against the real ``sqe-catalog`` (``sqe_catalog.integrity.lineage``).

The catalog writes ``next-row-id`` on every v3 revision (0 for a new table), advances it by each
added snapshot's ``added-rows``, and refuses a v3 snapshot without ``added-rows`` or behind ``next-row-id`` (400).
The catalog reads no manifest list on commit, so the snapshots here name one that need not exist.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import requests

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


class Tables:
    def __init__(self, server: CatalogServer) -> None:
        self.server = server
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {server.token(server.admin)}"
        self.ns = f"lineage_{uuid.uuid4().hex[:8]}"
        assert self.request("POST", "namespaces", json={"namespace": [self.ns]}).status_code == 200

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self.session.request(
            method, f"{self.server.url}/v1/{self.server.warehouse}/{path}", timeout=60, **kwargs
        )

    def create(self, name: str, format_version: str) -> dict[str, Any]:
        body = {"name": name, "schema": SCHEMA, "properties": {"format-version": format_version}}
        response = self.request("POST", f"namespaces/{self.ns}/tables", json=body)
        assert response.status_code == 200, response.text
        return dict(response.json()["metadata"])

    def metadata(self, name: str) -> dict[str, Any]:
        response = self.request("GET", f"namespaces/{self.ns}/tables/{name}")
        assert response.status_code == 200, response.text
        return dict(response.json()["metadata"])

    def commit(self, name: str, *updates: dict[str, Any]) -> requests.Response:
        return self.request("POST", f"namespaces/{self.ns}/tables/{name}", json={"updates": list(updates)})

    def append(self, name: str, **lineage: int) -> requests.Response:
        snapshot_id = uuid.uuid4().int >> 65
        metadata = self.metadata(name)
        snapshot = {
            "snapshot-id": snapshot_id,
            "sequence-number": metadata.get("last-sequence-number", 0) + 1,
            "timestamp-ms": int(time.time() * 1000),  # the catalog refuses a commit far older than the table
            # never read here; it must lie under the table's location, as every added snapshot's must
            "manifest-list": f"{metadata['location']}/metadata/snap-{snapshot_id}.avro",
            "summary": {"operation": "append"},
            "schema-id": 0,
            **{key.replace("_", "-"): value for key, value in lineage.items()},
        }
        ref = {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snapshot_id}
        return self.commit(name, {"action": "add-snapshot", "snapshot": snapshot}, ref)


@pytest.fixture(scope="module")
def tables(catalog_server: CatalogServer) -> Tables:
    return Tables(catalog_server)


def _refused(response: requests.Response, words: str) -> None:
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]
    assert "Traceback" not in response.text


def test_a_new_v3_table_starts_row_ids_at_zero(tables: Tables) -> None:
    assert tables.create("fresh", "3")["next-row-id"] == 0
    assert tables.metadata("fresh")["next-row-id"] == 0


def test_added_snapshots_advance_next_row_id(tables: Tables) -> None:
    tables.create("grows", "3")
    assert tables.append("grows", first_row_id=0, added_rows=5).status_code == 200
    assert tables.metadata("grows")["next-row-id"] == 5
    assert tables.append("grows", first_row_id=5, added_rows=2).status_code == 200
    metadata = tables.metadata("grows")
    assert metadata["next-row-id"] == 7
    assert [(s["first-row-id"], s["added-rows"]) for s in metadata["snapshots"]] == [(0, 5), (5, 2)]


def test_a_snapshot_behind_next_row_id_is_refused(tables: Tables) -> None:
    tables.create("behind", "3")
    assert tables.append("behind", first_row_id=0, added_rows=5).status_code == 200
    _refused(tables.append("behind", first_row_id=4, added_rows=1), "first row id")
    assert tables.metadata("behind")["next-row-id"] == 5


def test_a_v3_snapshot_without_added_rows_is_refused(tables: Tables) -> None:
    tables.create("uncounted", "3")
    _refused(tables.append("uncounted", first_row_id=0), "added-rows")
    metadata = tables.metadata("uncounted")
    assert metadata["next-row-id"] == 0 and not metadata.get("snapshots")
