"""The view endpoints of ``sqe-catalog`` with pyiceberg as the client, plus replace, rename and VIEW_* grants."""

from __future__ import annotations

import gzip
import json
import uuid
import zlib
from typing import TYPE_CHECKING, Any

import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import ForbiddenError
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

from sqe_catalog.integrity.canonical import MAX_METADATA_FILE_BYTES

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


# ---------------------------------------------------------------------------------------------------------
# A view's metadata file is bounded as a table's (MAX_METADATA_FILE_BYTES): read, gunzipped and written


def _raw_view(server: CatalogServer) -> tuple[str, str, dict[str, str]]:
    """A new view ``v`` in a new namespace: (its views URL, its metadata location, request headers)."""
    catalog = _catalog(server, server.admin)
    ns = f"vlimit_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(ns)
    catalog.create_view(f"{ns}.v", SCHEMA, _version(ns, "SELECT 1 AS id"))
    url = f"{server.url}/v1/{server.warehouse}/namespaces/{ns}/views/v"
    headers = {"Authorization": f"Bearer {server.token(server.admin)}"}
    loaded = requests.get(url, headers=headers, timeout=30)
    assert loaded.status_code == 200, loaded.text
    return url, str(loaded.json()["metadata-location"]), headers


def _put_stored(server: CatalogServer, location: str, data: bytes) -> None:
    """Rewrite the file in the bucket, behind the catalog's back (a writer of the store)."""
    bucket, _, key = location.removeprefix("s3://").partition("/")
    server.moto.client("s3").put_object(Bucket=bucket, Key=key, Body=data)


def _stored_document(server: CatalogServer, location: str) -> dict[str, Any]:
    bucket, _, key = location.removeprefix("s3://").partition("/")
    document: dict[str, Any] = json.loads(server.moto.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    return document


def _padded(document: dict[str, Any], size: int) -> bytes:
    """``document`` as JSON, a property padded so the whole holds ``size`` bytes."""
    plain = json.dumps({**document, "properties": {**document["properties"], "pad": ""}}).encode()
    pad = "x" * (size - len(plain))
    return json.dumps({**document, "properties": {**document["properties"], "pad": pad}}).encode()


def _assert_limit_refusal(response: requests.Response, what: str) -> None:
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["type"] == "BadRequestException" and what in error["message"]
    assert f"more than {MAX_METADATA_FILE_BYTES} bytes (MAX_METADATA_FILE_BYTES)" in error["message"]
    assert "Traceback" not in response.text


def test_a_view_metadata_file_past_the_limit_is_refused_unparsed(catalog_server: CatalogServer) -> None:
    # Before: a view's file was read and parsed whole whatever its size, and a gzip one was a 500.
    url, location, headers = _raw_view(catalog_server)
    document = _stored_document(catalog_server, location)
    _put_stored(catalog_server, location, _padded(document, MAX_METADATA_FILE_BYTES + 1))
    _assert_limit_refusal(requests.get(url, headers=headers, timeout=60), "holds")
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)  # a gzip stream of a padded view: a bomb when inflated
    _put_stored(
        catalog_server, location, packer.compress(_padded(document, MAX_METADATA_FILE_BYTES + 1)) + packer.flush()
    )
    _assert_limit_refusal(requests.get(url, headers=headers, timeout=60), "decompresses to")
    _put_stored(catalog_server, location, gzip.compress(json.dumps(document).encode()))
    assert requests.get(url, headers=headers, timeout=60).json()["metadata"] == document, "gzip within the limit"


def test_a_view_replace_past_the_limit_is_refused_unwritten(catalog_server: CatalogServer) -> None:
    # Before: a replace wrote a file of any size, which no later load could read back.
    url, location, headers = _raw_view(catalog_server)
    document = _stored_document(catalog_server, location)
    _put_stored(catalog_server, location, gzip.compress(_padded(document, MAX_METADATA_FILE_BYTES - 1024), 1))
    body = {"updates": [{"action": "set-properties", "updates": {"more": "y" * 4096}}]}
    _assert_limit_refusal(requests.post(url, json=body, headers=headers, timeout=120), "would hold")
    loaded = requests.get(url, headers=headers, timeout=120)
    assert loaded.status_code == 200 and loaded.json()["metadata-location"] == location, "nothing moved"
