"""The view endpoints of ``sqe-catalog`` with pyiceberg as the client, plus replace, rename and VIEW_* grants."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import ForbiddenError
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def _catalog(server: CatalogServer, principal: CatalogPrincipal) -> RestCatalog:
    return RestCatalog(
        f"views-{uuid.uuid4().hex[:6]}", uri=server.url, warehouse=server.warehouse, credential=principal.credential
    )


def _version(ns: str, sql: str) -> ViewVersion:
    return ViewVersion(
        version_id=1,
        schema_id=0,
        representations=[SQLViewRepresentation(type="sql", sql=sql, dialect="duckdb")],
        default_namespace=(ns,),
    )


def test_views_round_trip_through_pyiceberg(catalog_server: CatalogServer) -> None:
    catalog = _catalog(catalog_server, catalog_server.admin)
    ns = f"views_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(ns)
    view = catalog.create_view(f"{ns}.v", SCHEMA, _version(ns, "SELECT 1 AS id"))
    assert view.metadata.current_version_id == 1
    assert catalog.view_exists(f"{ns}.v") and not catalog.view_exists(f"{ns}.missing")
    assert catalog.list_views(ns) == [(ns, "v")]
    loaded = catalog.load_view(f"{ns}.v")
    assert loaded.metadata.versions[0].representations[0].root.sql == "SELECT 1 AS id"
    assert loaded.metadata.location.startswith(catalog_server.warehouse_location)

    # replace: a new version becomes current (the spec's CommitViewRequest, raw)
    base = f"{catalog_server.url}/v1/{catalog_server.warehouse}"
    headers = {"Authorization": f"Bearer {catalog_server.token(catalog_server.admin)}"}
    new_version = _version(ns, "SELECT 2 AS id").model_dump(by_alias=True, exclude_none=True)
    body = {
        "requirements": [{"type": "assert-view-uuid", "uuid": loaded.metadata.view_uuid}],
        "updates": [
            {"action": "add-view-version", "view-version": {**new_version, "schema-id": 0}},
            {"action": "set-current-view-version", "view-version-id": -1},
        ],
    }
    reply = requests.post(f"{base}/namespaces/{ns}/views/v", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    current = catalog.load_view(f"{ns}.v").metadata
    assert current.current_version_id == 2
    stale = {**body, "requirements": [{"type": "assert-view-uuid", "uuid": str(uuid.uuid4())}]}
    assert requests.post(f"{base}/namespaces/{ns}/views/v", json=stale, headers=headers).status_code == 409

    # a name is a table or a view, never both
    with pytest.raises(Exception, match="exists"):
        catalog.create_table(f"{ns}.v", SCHEMA)

    rename = {"source": {"namespace": [ns], "name": "v"}, "destination": {"namespace": [ns], "name": "w"}}
    assert requests.post(f"{base}/views/rename", json=rename, headers=headers).status_code == 204
    assert catalog.list_views(ns) == [(ns, "w")]
    catalog.drop_view(f"{ns}.w")
    assert catalog.list_views(ns) == []


def test_view_grants(catalog_server: CatalogServer) -> None:
    admin = _catalog(catalog_server, catalog_server.admin)
    ns = f"vgrants_{uuid.uuid4().hex[:6]}"
    admin.create_namespace(ns)
    admin.create_view(f"{ns}.v", SCHEMA, _version(ns, "SELECT 1 AS id"))
    name = f"viewer_{uuid.uuid4().hex[:6]}"
    viewer = catalog_server.principal_with_grants(name, [("VIEW_READ_PROPERTIES", ns, "v")])
    catalog = _catalog(catalog_server, viewer)
    assert catalog.load_view(f"{ns}.v").metadata.current_version_id == 1
    with pytest.raises(ForbiddenError):
        catalog.drop_view(f"{ns}.v")
    with pytest.raises(ForbiddenError):
        catalog.create_view(f"{ns}.other", SCHEMA, _version(ns, "SELECT 1 AS id"))
    assert admin.view_exists(f"{ns}.v")
