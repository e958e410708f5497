"""``sqe-catalog serve`` end to end: a real catalog process on moto (S3 + STS + IAM), real HTTP clients.

The session's one moto and one catalog come from ``tests/conftest.py``; principals are created with
``sqe-catalog admin``. The last test searches the catalog's debug log for every secret handed out here.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

DELEGATE = {"X-Iceberg-Access-Delegation": "vended-credentials"}
SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": False},
        {"id": 2, "name": "name", "type": "string", "required": False},
    ],
}
KEY_NAMES = ("s3.access-key-id", "s3.secret-access-key", "s3.session-token")


class Api:
    """A requests session for one principal: base URL, bearer token, warehouse prefix."""

    def __init__(self, server: CatalogServer, principal: CatalogPrincipal | None) -> None:
        self.server = server
        self.session = requests.Session()
        if principal is not None:
            self.session.headers["Authorization"] = f"Bearer {server.token(principal)}"

    def url(self, path: str) -> str:
        return f"{self.server.url}/v1/{self.server.warehouse}/{path}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        response = self.session.request(method, self.url(path), timeout=60, **kwargs)
        remember_credentials(self.server, response)
        return response

    def create_namespace(self, *levels: str) -> None:
        response = self.request("POST", "namespaces", json={"namespace": list(levels)})
        assert response.status_code == 200, response.text

    def create_table(
        self, namespace: str, name: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> requests.Response:
        body = {"name": name, "schema": SCHEMA, **extra}
        return self.request("POST", f"namespaces/{namespace}/tables", json=body, headers=headers)


def remember_credentials(server: CatalogServer, response: requests.Response) -> None:
    """Record vended secrets so the final test can prove the log never saw them."""
    if not response.content or "json" not in response.headers.get("content-type", ""):
        return
    body = response.json()
    for credential in body.get("storage-credentials", []) if isinstance(body, dict) else []:
        for key in ("s3.secret-access-key", "s3.session-token"):
            if key in credential["config"]:
                server.secrets.add(credential["config"][key])


def assert_error(response: requests.Response, status: int, error_type: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["code"] == status
    if error_type is not None:
        assert error["type"] == error_type
    assert "Traceback" not in response.text and 'File "' not in response.text
    return dict(error)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def admin(catalog_server: CatalogServer) -> Api:
    return Api(catalog_server, catalog_server.admin)


@pytest.fixture(scope="module")
def nobody(catalog_server: CatalogServer) -> Api:
    return Api(catalog_server, catalog_server.create_principal("nobody"))


@pytest.fixture(scope="module")
def reader_principal(catalog_server: CatalogServer) -> CatalogPrincipal:
    return catalog_server.principal_with_grants(
        "reader", [("TABLE_READ_DATA", None, None), ("NAMESPACE_READ_PROPERTIES", None, None)]
    )


@pytest.fixture(scope="module")
def writer_principal(catalog_server: CatalogServer) -> CatalogPrincipal:
    grants: list[tuple[str, str | None, str | None]] = [
        ("NAMESPACE_FULL_METADATA", None, None),
        ("TABLE_CREATE", None, None),
        ("TABLE_WRITE_DATA", None, None),
    ]
    return catalog_server.principal_with_grants("writer", grants)


@pytest.fixture(scope="module")
def reader(catalog_server: CatalogServer, reader_principal: CatalogPrincipal) -> Api:
    return Api(catalog_server, reader_principal)


@pytest.fixture(scope="module")
def writer(catalog_server: CatalogServer, writer_principal: CatalogPrincipal) -> Api:
    return Api(catalog_server, writer_principal)


@pytest.fixture(scope="module")
def db(admin: Api) -> str:
    """A namespace with one table ``t`` for the read-only tests."""
    admin.create_namespace("db")
    assert admin.create_table("db", "t").status_code == 200
    return "db"


# ---------------------------------------------------------------------------------------------------------
# Configuration and OAuth


def test_config_names_the_prefix_and_every_endpoint(catalog_server: CatalogServer, admin: Api) -> None:
    response = admin.session.get(f"{catalog_server.url}/v1/config", params={"warehouse": "wh"}, timeout=30)
    assert response.status_code == 200
    body = response.json()
    assert body["overrides"] == {"prefix": "wh"} and body["defaults"]["namespace-separator"] == "%1F"
    endpoints = set(body["endpoints"])
    assert "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}/credentials" in endpoints
    assert {
        "POST /v1/{prefix}/tables/rename",
        "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    } <= endpoints
    assert "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/notifications" in endpoints
    assert len(endpoints) == 27  # 16 table/namespace routes + 7 view routes + 4 scan-planning routes

    unknown = admin.session.get(f"{catalog_server.url}/v1/config", params={"warehouse": "nope"}, timeout=30)
    assert_error(unknown, 404)
    anonymous = requests.get(f"{catalog_server.url}/v1/config", params={"warehouse": "wh"}, timeout=30)
    assert_error(anonymous, 401, "NotAuthorizedException")


def _token_request(server: CatalogServer, **kwargs: Any) -> requests.Response:
    return requests.post(f"{server.url}/v1/oauth/tokens", timeout=30, **kwargs)


def test_token_flow_with_form_body_and_http_basic(catalog_server: CatalogServer) -> None:
    principal = catalog_server.admin
    form = {"grant_type": "client_credentials", "scope": "PRINCIPAL_ROLE:ALL"}
    by_form = _token_request(
        catalog_server,
        data={**form, "client_id": principal.client_id, "client_secret": principal.client_secret},
    )
    by_basic = _token_request(catalog_server, data=form, auth=(principal.client_id, principal.client_secret))
    for response in (by_form, by_basic):
        assert response.status_code == 200, response.text
        body = response.json()
        catalog_server.secrets.add(body["access_token"])
        assert body["token_type"] == "bearer"
        assert body["issued_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
        assert isinstance(body["expires_in"], int) and body["expires_in"] > 0
        config = requests.get(
            f"{catalog_server.url}/v1/config",
            headers={"Authorization": f"Bearer {body['access_token']}"},
            timeout=30,
        )
        assert config.status_code == 200


def test_token_errors_use_the_oauth_shape(catalog_server: CatalogServer) -> None:
    principal = catalog_server.admin
    good = {
        "grant_type": "client_credentials",
        "client_id": principal.client_id,
        "scope": "PRINCIPAL_ROLE:ALL",
    }
    cases = [
        ({**good, "client_secret": "wrong-secret"}, 401, "invalid_client"),
        ({**good, "client_id": "unknown", "client_secret": "x"}, 401, "invalid_client"),
        (
            {**good, "client_secret": principal.client_secret, "grant_type": "password"},
            400,
            "unsupported_grant_type",
        ),
        ({**good, "client_secret": principal.client_secret, "scope": "catalogue"}, 400, "invalid_scope"),
        (
            {"client_id": principal.client_id, "client_secret": principal.client_secret},
            400,
            "invalid_request",
        ),
    ]
    for form, status, error in cases:
        response = _token_request(catalog_server, data=form)
        assert response.status_code == status, (form.get("grant_type"), response.text)
        body = response.json()
        assert body["error"] == error and body["error_description"]
        assert principal.client_secret not in response.text


def test_missing_or_bad_bearer_token_is_401(catalog_server: CatalogServer) -> None:
    url = f"{catalog_server.url}/v1/wh/namespaces"
    assert_error(requests.get(url, timeout=30), 401, "NotAuthorizedException")
    assert_error(requests.get(url, headers={"Authorization": "Bearer forged.token"}, timeout=30), 401)
    assert_error(requests.get(url, headers={"Authorization": "Basic Zm9vOmJhcg=="}, timeout=30), 401)


# ---------------------------------------------------------------------------------------------------------
# Authorisation and errors


def test_missing_grant_is_403(db: str, nobody: Api, reader: Api) -> None:
    assert_error(nobody.request("GET", "namespaces"), 403, "ForbiddenException")
    assert_error(nobody.request("GET", f"namespaces/{db}/tables/t"), 403)
    assert_error(nobody.request("POST", "namespaces", json={"namespace": ["x"]}), 403)
    assert_error(reader.create_table(db, "not_allowed"), 403)
    assert_error(reader.request("DELETE", f"namespaces/{db}/tables/t"), 403)
    # Holding TABLE_READ_DATA is not enough to commit
    assert_error(reader.request("POST", f"namespaces/{db}/tables/t", json={"updates": []}), 403)


def test_unknown_table_namespace_and_warehouse_are_404(db: str, admin: Api, catalog_server: CatalogServer) -> None:
    assert_error(admin.request("GET", f"namespaces/{db}/tables/missing"), 404, "NoSuchTableException")
    assert_error(admin.request("GET", "namespaces/missing"), 404, "NoSuchNamespaceException")
    assert_error(admin.request("GET", "namespaces/missing/tables"), 404, "NoSuchNamespaceException")
    other = admin.session.get(f"{catalog_server.url}/v1/nope/namespaces", timeout=30)
    assert_error(other, 404)
    assert admin.request("HEAD", f"namespaces/{db}/tables/missing").status_code == 404
    assert admin.request("HEAD", f"namespaces/{db}/tables/t").status_code == 204


def test_unknown_routes_and_methods_get_error_models(admin: Api, catalog_server: CatalogServer) -> None:
    assert_error(admin.session.get(f"{catalog_server.url}/v2/anything", timeout=30), 404)
    assert_error(admin.request("PUT", "namespaces"), 405)
    assert_error(admin.session.get(f"{catalog_server.url}/v1/oauth/tokens", timeout=30), 405)


def test_malformed_json_and_bad_identifiers_are_400(db: str, admin: Api) -> None:
    headers = {"Content-Type": "application/json"}
    assert_error(admin.request("POST", "namespaces", data=b'{"namespace": [', headers=headers), 400)
    assert_error(admin.request("POST", "namespaces", data=b"[1, 2]", headers=headers), 400)
    assert_error(admin.request("POST", f"namespaces/{db}/tables/t", data=b"\xff\xfe", headers=headers), 400)
    assert_error(admin.request("POST", f"namespaces/{db}/tables", json={"name": "x", "schema": 7}), 400)
    bad_namespaces: list[Any] = [[], [""], ["a\x01b"], [".."], ["x" * 300], "db", [1]]
    for namespace in bad_namespaces:
        assert_error(admin.request("POST", "namespaces", json={"namespace": namespace}), 400)
    for name in ["", "a\nb", "x" * 300, "a\x7fb"]:
        assert_error(admin.create_table(db, name), 400)
    assert_error(admin.request("GET", f"namespaces/{db}/tables/bad%01name"), 400)
    assert_error(admin.request("GET", "namespaces", params={"parent": "a\x1f"}), 400)
    updates = [{"action": "no-such-action"}]
    assert_error(admin.request("POST", f"namespaces/{db}/tables/t", json={"updates": updates}), 400)


VIEW_VERSION = {
    "version-id": 1,
    "schema-id": 0,
    "timestamp-ms": 1,
    "summary": {},
    "representations": [{"type": "sql", "sql": "SELECT 1 AS id", "dialect": "spark"}],
    "default-namespace": [],
}


def test_a_commit_with_more_updates_than_the_limit_is_refused_before_it_runs(admin: Api) -> None:
    """Updates apply one over another (quadratic in their count): past MAX_COMMIT_UPDATES the commit is a 400
    and nothing of it is applied; at the limit it commits."""
    from sqe_catalog.api import MAX_COMMIT_UPDATES

    namespace = unique("commits")
    admin.create_namespace(namespace)
    assert admin.create_table(namespace, "t").status_code == 200
    view = {"name": "v", "schema": SCHEMA, "view-version": {**VIEW_VERSION, "default-namespace": [namespace]}}
    assert admin.request("POST", f"namespaces/{namespace}/views", json=view).status_code == 200

    def properties(count: int) -> list[dict[str, Any]]:
        return [{"action": "set-properties", "updates": {f"k{i}": "v"}} for i in range(count)]

    for path, kind in ((f"namespaces/{namespace}/tables/t", "table"), (f"namespaces/{namespace}/views/v", "view")):
        refused = admin.request("POST", path, json={"requirements": [], "updates": properties(MAX_COMMIT_UPDATES + 1)})
        error = assert_error(refused, 400, "BadRequestException")
        assert f"a {kind} commit carries at most {MAX_COMMIT_UPDATES} updates" in error["message"]
        loaded = admin.request("GET", path).json()["metadata"]["properties"]
        assert "k0" not in loaded  # nothing of the refused commit was applied
        accepted = admin.request("POST", path, json={"requirements": [], "updates": properties(MAX_COMMIT_UPDATES)})
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["metadata"]["properties"][f"k{MAX_COMMIT_UPDATES - 1}"] == "v"


def test_namespace_properties_past_the_per_request_limit_are_refused(admin: Api) -> None:
    """Namespace properties are database rows written in one transaction: a request with more than
    MAX_NAMESPACE_PROPERTIES of them (to create, set or remove) is a 400 and writes nothing, at the limit it works."""
    from sqe_catalog.api import MAX_NAMESPACE_PROPERTIES

    def keys(count: int) -> dict[str, str]:
        return {f"k{i}": "v" for i in range(count)}

    top = unique("props")
    created = admin.request(
        "POST", "namespaces", json={"namespace": [top], "properties": keys(MAX_NAMESPACE_PROPERTIES + 1)}
    )
    error = assert_error(created, 400, "BadRequestException")
    assert f"more than {MAX_NAMESPACE_PROPERTIES} in one request" in error["message"]
    assert admin.request("HEAD", f"namespaces/{top}").status_code == 404
    admin.create_namespace(top)
    path = f"namespaces/{top}/properties"
    for body in (
        {"updates": keys(MAX_NAMESPACE_PROPERTIES + 1)},
        {"removals": list(keys(MAX_NAMESPACE_PROPERTIES + 1))},
    ):
        error = assert_error(admin.request("POST", path, json=body), 400, "BadRequestException")
        assert "(MAX_NAMESPACE_PROPERTIES)" in error["message"]
    assert "k0" not in admin.request("GET", f"namespaces/{top}").json()["properties"]
    summary = admin.request("POST", path, json={"updates": keys(MAX_NAMESPACE_PROPERTIES)}).json()
    assert len(summary["updated"]) == MAX_NAMESPACE_PROPERTIES


# ---------------------------------------------------------------------------------------------------------
# Namespaces


def test_namespace_lifecycle(admin: Api) -> None:
    top = unique("ns")
    admin.create_namespace(top)
    admin.create_namespace(top, "child")
    assert_error(admin.request("POST", "namespaces", json={"namespace": [top]}), 409, "AlreadyExistsException")
    assert_error(admin.request("POST", "namespaces", json={"namespace": [unique("no"), "child"]}), 404)

    listed = admin.request("GET", "namespaces").json()["namespaces"]
    assert [top] in listed and [top, "child"] not in listed
    children = admin.request("GET", "namespaces", params={"parent": top}).json()
    assert children == {"namespaces": [[top, "child"]], "next-page-token": None}
    nested = f"{top}\x1fchild"  # multi-level namespaces use the unit separator in paths
    assert admin.request("HEAD", f"namespaces/{nested}").status_code == 204
    assert admin.request("HEAD", f"namespaces/{top}\x1fnone").status_code == 404

    update = {"updates": {"owner": "ana", "tier": "gold"}, "removals": ["absent"]}
    summary = admin.request("POST", f"namespaces/{nested}/properties", json=update).json()
    assert summary == {"updated": ["owner", "tier"], "removed": [], "missing": ["absent"]}
    summary = admin.request("POST", f"namespaces/{nested}/properties", json={"removals": ["tier"]}).json()
    assert summary["removed"] == ["tier"]
    loaded = admin.request("GET", f"namespaces/{nested}").json()
    assert loaded["namespace"] == [top, "child"] and loaded["properties"]["owner"] == "ana"
    assert "tier" not in loaded["properties"]
    both = {"updates": {"owner": "bo"}, "removals": ["owner"]}
    assert_error(
        admin.request("POST", f"namespaces/{nested}/properties", json=both),
        422,
        "UnprocessableEntityException",
    )

    assert_error(admin.request("DELETE", f"namespaces/{top}"), 409)  # has a child namespace
    assert admin.create_table(nested, "t").status_code == 200
    assert_error(admin.request("DELETE", f"namespaces/{nested}"), 409, "NamespaceNotEmptyException")
    assert admin.request("DELETE", f"namespaces/{nested}/tables/t").status_code == 204
    assert admin.request("DELETE", f"namespaces/{nested}").status_code == 204
    assert admin.request("DELETE", f"namespaces/{top}").status_code == 204
    assert_error(admin.request("GET", f"namespaces/{top}"), 404)


def test_list_pagination(admin: Api) -> None:
    top = unique("pages")
    admin.create_namespace(top)
    for i in range(3):
        assert admin.create_table(top, f"t{i}").status_code == 200
    first = admin.request("GET", f"namespaces/{top}/tables", params={"pageSize": 2}).json()
    assert [i["name"] for i in first["identifiers"]] == ["t0", "t1"] and first["next-page-token"]
    params = {"pageSize": 2, "pageToken": first["next-page-token"]}
    second = admin.request("GET", f"namespaces/{top}/tables", params=params).json()
    assert [i["name"] for i in second["identifiers"]] == ["t2"] and second["next-page-token"] is None


# ---------------------------------------------------------------------------------------------------------
# Tables


def _objects(server: CatalogServer, prefix: str) -> list[str]:
    """Object keys under ``prefix``, without the empty directory markers pyarrow leaves behind."""
    s3 = server.moto.client("s3")
    listed = s3.list_objects_v2(Bucket=server.moto.bucket, Prefix=prefix)
    return [str(o["Key"]) for o in listed.get("Contents", []) if not str(o["Key"]).endswith("/")]


def _purged(server: CatalogServer, prefix: str, timeout: float = 30.0) -> list[str]:
    """The objects left under ``prefix`` once the catalog's background cleaner has run (a purge only persists
    its cleanup task; see sqe_catalog.integrity.cleaner)."""
    deadline = time.monotonic() + timeout
    while (left := _objects(server, prefix)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left


def test_table_create_load_list_rename_drop(admin: Api, catalog_server: CatalogServer) -> None:
    ns = unique("tbl")
    admin.create_namespace(ns)
    admin.create_namespace(f"{ns}_other")
    created = admin.create_table(ns, "a", properties={"owner": "ana"})
    assert created.status_code == 200 and created.headers["ETag"]
    body = created.json()
    assert body["metadata"]["location"] == f"{catalog_server.warehouse_location}/{ns}/a"
    assert body["metadata"]["properties"]["owner"] == "ana"
    assert body["metadata-location"].startswith(f"{catalog_server.warehouse_location}/{ns}/a/metadata/")
    assert_error(admin.create_table(ns, "a"), 409, "AlreadyExistsException")

    loaded = admin.request("GET", f"namespaces/{ns}/tables/a").json()
    assert loaded["metadata-location"] == body["metadata-location"]
    assert loaded["metadata"]["table-uuid"] == body["metadata"]["table-uuid"]
    listed = admin.request("GET", f"namespaces/{ns}/tables").json()
    assert listed["identifiers"] == [{"namespace": [ns], "name": "a"}]

    rename = {
        "source": {"namespace": [ns], "name": "a"},
        "destination": {"namespace": [f"{ns}_other"], "name": "b"},
    }
    assert admin.request("POST", "tables/rename", json=rename).status_code == 204
    assert_error(admin.request("GET", f"namespaces/{ns}/tables/a"), 404)
    renamed = admin.request("GET", f"namespaces/{ns}_other/tables/b").json()
    assert renamed["metadata"]["table-uuid"] == body["metadata"]["table-uuid"]
    assert_error(admin.request("POST", "tables/rename", json=rename), 404)

    assert admin.request("DELETE", f"namespaces/{ns}_other/tables/b").status_code == 204
    assert_error(admin.request("GET", f"namespaces/{ns}_other/tables/b"), 404)
    assert _objects(catalog_server, f"wh/{ns}/a/metadata/"), "drop without purge keeps the files"


def test_drop_with_purge_deletes_the_files(admin: Api, catalog_server: CatalogServer) -> None:
    ns = unique("purge")
    admin.create_namespace(ns)
    assert admin.create_table(ns, "p").status_code == 200
    assert _objects(catalog_server, f"wh/{ns}/p/")
    response = admin.request("DELETE", f"namespaces/{ns}/tables/p", params={"purgeRequested": "true"})
    assert response.status_code == 204
    assert _purged(catalog_server, f"wh/{ns}/p/") == []
    assert_error(admin.request("DELETE", f"namespaces/{ns}/tables/p", params={"purgeRequested": "maybe"}), 400)


def test_register_an_existing_metadata_file(admin: Api) -> None:
    ns = unique("reg")
    admin.create_namespace(ns)
    original = admin.create_table(ns, "orig").json()
    assert admin.request("DELETE", f"namespaces/{ns}/tables/orig").status_code == 204
    register = {"name": "again", "metadata-location": original["metadata-location"]}
    response = admin.request("POST", f"namespaces/{ns}/register", json=register, headers=DELEGATE)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["metadata"]["table-uuid"] == original["metadata"]["table-uuid"]
    assert body["storage-credentials"][0]["prefix"] == original["metadata"]["location"]
    assert_error(admin.request("POST", f"namespaces/{ns}/register", json=register), 409)
    outside = {"name": "evil", "metadata-location": "s3://warehouse/elsewhere/v1.metadata.json"}
    assert_error(admin.request("POST", f"namespaces/{ns}/register", json=outside), 400)


def test_locations_must_stay_inside_the_warehouse_and_apart(admin: Api, catalog_server: CatalogServer) -> None:
    ns = unique("loc")
    admin.create_namespace(ns)
    root = catalog_server.warehouse_location
    for location in ["s3://warehouse/elsewhere/t", "s3://other-bucket/wh/t", f"{root}/../x", root, "/tmp/x"]:
        assert_error(admin.create_table(ns, "t", location=location), 400)
    for key in ("write.data.path", "write.metadata.path"):
        assert_error(admin.create_table(ns, "t", properties={key: "s3://warehouse/elsewhere"}), 400)
    assert_error(admin.create_table(ns, "t", properties={"py-io-impl": "evil.FileIO"}), 400)
    custom = admin.create_table(ns, "custom", location=f"{root}/{ns}/custom-place")
    assert custom.status_code == 200
    # another table inside (or around) that location would share its vended credentials: refused
    assert_error(admin.create_table(ns, "inner", location=f"{root}/{ns}/custom-place/inner"), 400)
    assert_error(admin.create_table(ns, "outer", location=f"{root}/{ns}"), 400)
    moved = {"updates": [{"action": "set-location", "location": "s3://warehouse/elsewhere"}]}
    assert_error(admin.request("POST", f"namespaces/{ns}/tables/custom", json=moved), 400)
    sneaky = {"updates": [{"action": "set-properties", "updates": {"write.py-location-provider.impl": "x.Y"}}]}
    assert_error(admin.request("POST", f"namespaces/{ns}/tables/custom", json=sneaky), 400)


def test_stage_create_then_commit_creates_the_table(admin: Api) -> None:
    ns = unique("stage")
    admin.create_namespace(ns)
    staged = admin.request(
        "POST", f"namespaces/{ns}/tables", json={"name": "s", "schema": SCHEMA, "stage-create": True}
    )
    assert staged.status_code == 200, staged.text
    metadata = staged.json()["metadata"]
    assert "metadata-location" not in staged.json()
    assert_error(admin.request("GET", f"namespaces/{ns}/tables/s"), 404)
    commit = {
        "requirements": [{"type": "assert-create"}],
        "updates": [
            {"action": "assign-uuid", "uuid": metadata["table-uuid"]},
            {"action": "upgrade-format-version", "format-version": 2},
            {"action": "add-schema", "schema": metadata["schemas"][0], "last-column-id": 2},
            {"action": "set-current-schema", "schema-id": -1},
            {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "set-location", "location": metadata["location"]},
        ],
    }
    committed = admin.request("POST", f"namespaces/{ns}/tables/s", json=commit)
    assert committed.status_code == 200, committed.text
    assert admin.request("GET", f"namespaces/{ns}/tables/s").json()["metadata"]["table-uuid"] == metadata["table-uuid"]
    assert_error(admin.request("POST", f"namespaces/{ns}/tables/s", json=commit), 409)


def _snapshot_commit(table: dict[str, Any], snapshot_id: int) -> dict[str, Any]:
    metadata = table["metadata"]
    current = metadata.get("current-snapshot-id")
    current = None if current in (None, -1) else current
    snapshot = {
        "snapshot-id": snapshot_id,
        "sequence-number": metadata["last-sequence-number"] + 1,
        "timestamp-ms": int(time.time() * 1000),
        "manifest-list": f"{metadata['location']}/metadata/snap-{snapshot_id}.avro",
        "summary": {"operation": "append"},
        "schema-id": 0,
        **({"parent-snapshot-id": current} if current is not None else {}),
    }
    return {
        "requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": current}],
        "updates": [
            {"action": "add-snapshot", "snapshot": snapshot},
            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snapshot_id},
        ],
    }


def _commit_all_at_once(api: Api, path: str, bodies: dict[int, dict[str, Any]]) -> dict[int, requests.Response]:
    """POST every body from its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(bodies))
    results: dict[int, requests.Response] = {}

    def commit(snapshot_id: int) -> None:
        session = requests.Session()
        session.headers.update(api.session.headers)
        barrier.wait()
        results[snapshot_id] = session.post(api.url(path), json=bodies[snapshot_id], timeout=60)

    threads = [threading.Thread(target=commit, args=(snapshot_id,)) for snapshot_id in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_concurrent_commits_exactly_one_wins(admin: Api) -> None:
    ns = unique("race")
    admin.create_namespace(ns)
    assert admin.create_table(ns, "r").status_code == 200
    path = f"namespaces/{ns}/tables/r"
    committed: list[int] = []
    for round_number in range(4):
        base = admin.request("GET", path).json()
        contenders = [round_number * 10 + i + 1 for i in range(4)]
        results = _commit_all_at_once(admin, path, {sid: _snapshot_commit(base, sid) for sid in contenders})
        statuses = sorted(r.status_code for r in results.values())
        assert statuses == [200, 409, 409, 409], [r.text for r in results.values()]
        for response in results.values():
            if response.status_code == 409:
                assert response.json()["error"]["type"] == "CommitFailedException"
        winner = next(sid for sid, r in results.items() if r.status_code == 200)
        committed.append(winner)
        after = admin.request("GET", path).json()["metadata"]
        assert after["refs"]["main"]["snapshot-id"] == winner
        assert [s["snapshot-id"] for s in after["snapshots"]] == committed  # every winner, no loser


# ---------------------------------------------------------------------------------------------------------
# ETags and credential vending


def test_etag_revalidation(db: str, admin: Api, writer: Api, reader: Api) -> None:
    path = f"namespaces/{db}/tables/t"
    first = admin.request("GET", path)
    etag = first.headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"')
    unchanged = admin.request("GET", path, headers={"If-None-Match": etag})
    assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["ETag"] == etag
    assert admin.request("GET", path, headers={"If-None-Match": '"other"'}).status_code == 200

    refs = admin.request("GET", path, params={"snapshots": "refs"})
    assert refs.status_code == 200 and refs.headers["ETag"] != etag
    assert admin.request("GET", path, params={"snapshots": "refs"}, headers={"If-None-Match": etag}).status_code == 200
    assert_error(admin.request("GET", path, params={"snapshots": "some"}), 400)
    vended_write = writer.request("GET", path, headers=DELEGATE)
    vended_read = reader.request("GET", path, headers=DELEGATE)
    tags = {etag, refs.headers["ETag"], vended_write.headers["ETag"], vended_read.headers["ETag"]}
    assert len(tags) == 4, "plain, refs, write-vended and read-vended are different representations"
    assert (
        reader.request("GET", path, headers={**DELEGATE, "If-None-Match": vended_read.headers["ETag"]}).status_code
        == 304
    )

    update = {"updates": [{"action": "set-properties", "updates": {"touched": str(time.time())}}]}
    committed = admin.request("POST", path, json=update)
    assert committed.status_code == 200 and committed.headers["ETag"] not in tags
    after = admin.request("GET", path, headers={"If-None-Match": etag})
    assert after.status_code == 200 and after.headers["ETag"] == committed.headers["ETag"]
    assert admin.request("GET", path, headers={"If-None-Match": committed.headers["ETag"]}).status_code == 304


def _contains_key_material(text: str) -> bool:
    return any(name in text for name in KEY_NAMES)


def test_no_keys_without_the_delegation_header(admin: Api, catalog_server: CatalogServer) -> None:
    ns = unique("nokeys")
    admin.create_namespace(ns)
    created = admin.create_table(ns, "k")
    loaded = admin.request("GET", f"namespaces/{ns}/tables/k")
    unknown_mode = admin.request(
        "GET", f"namespaces/{ns}/tables/k", headers={"X-Iceberg-Access-Delegation": "remote-signing"}
    )
    for response in (created, loaded, unknown_mode):
        assert response.status_code == 200
        body = response.json()
        assert "storage-credentials" not in body and body["config"] == {}
        assert not _contains_key_material(response.text)
        assert catalog_server.moto.secret_access_key not in response.text


def test_vended_credentials_shape(
    db: str, writer: Api, reader: Api, nobody: Api, catalog_server: CatalogServer
) -> None:
    path = f"namespaces/{db}/tables/t"
    for header in ("vended-credentials", "remote-signing, vended-credentials", "true"):
        response = reader.request("GET", path, headers={"X-Iceberg-Access-Delegation": header})
        assert response.status_code == 200, response.text
        body = response.json()
        location = body["metadata"]["location"]
        assert body["config"] == {
            "client.region": catalog_server.moto.region,
            "s3.endpoint": catalog_server.moto.url,
            "s3.path-style-access": "true",
            "client.refresh-credentials-endpoint": f"v1/wh/namespaces/{db}/tables/t/credentials",
        }
        [credential] = body["storage-credentials"]
        assert credential["prefix"] == location
        config = credential["config"]
        assert set(config) == {*KEY_NAMES, "s3.session-token-expires-at-ms"}
        assert int(config["s3.session-token-expires-at-ms"]) > time.time() * 1000
        assert config["s3.access-key-id"] != catalog_server.moto.access_key_id
    read_key = config["s3.access-key-id"]
    refreshed = writer.request("GET", f"{path}/credentials")
    assert refreshed.status_code == 200
    [credential] = refreshed.json()["storage-credentials"]
    assert credential["prefix"] == location and set(credential["config"]) >= set(KEY_NAMES)
    assert credential["config"]["s3.access-key-id"] != read_key, "read and write credentials differ"
    assert_error(nobody.request("GET", f"{path}/credentials"), 403)
    assert_error(nobody.request("GET", path, headers=DELEGATE), 403)


# ---------------------------------------------------------------------------------------------------------
# pyiceberg's RestCatalog as a third-party client that holds no S3 key


@pytest.fixture
def no_ambient_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No AWS key may come from the environment, a profile or IMDS: only vended keys can work."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    yield


def _rest_catalog(server: CatalogServer, principal: CatalogPrincipal) -> RestCatalog:
    properties = {
        "uri": server.url,
        "credential": principal.credential,
        "scope": "PRINCIPAL_ROLE:ALL",
        "warehouse": server.warehouse,
    }
    assert not any(key.startswith(("s3.", "client.")) for key in properties)
    return RestCatalog("sqe", **properties)


def _remember_io_secrets(server: CatalogServer, properties: dict[str, Any]) -> None:
    for key in ("s3.secret-access-key", "s3.session-token"):
        if isinstance(properties.get(key), str):
            server.secrets.add(properties[key])


@pytest.mark.usefixtures("no_ambient_aws")
def test_pyiceberg_writes_and_reads_with_vended_credentials_only(
    catalog_server: CatalogServer, writer_principal: CatalogPrincipal, reader_principal: CatalogPrincipal, admin: Api
) -> None:
    ns = unique("pyi")
    writer_catalog = _rest_catalog(catalog_server, writer_principal)
    writer_catalog.create_namespace(ns)
    arrow = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["a", "b", "c"], pa.string())})
    table = writer_catalog.create_table((ns, "events"), schema=arrow.schema)
    _remember_io_secrets(catalog_server, table.io.properties)
    assert table.io.properties["s3.access-key-id"].startswith("ASIA"), "a vended STS key, not a static one"
    assert table.io.properties["s3.endpoint"] == catalog_server.moto.url
    table.append(arrow)
    assert _objects(catalog_server, f"wh/{ns}/events/data/")

    reader_catalog = _rest_catalog(catalog_server, reader_principal)
    loaded = reader_catalog.load_table((ns, "events"))
    _remember_io_secrets(catalog_server, loaded.io.properties)
    assert loaded.io.properties["s3.access-key-id"] != table.io.properties["s3.access-key-id"]
    rows = loaded.scan().to_arrow().sort_by("id")
    assert rows.column("id").to_pylist() == [1, 2, 3]
    assert rows.column("name").to_pylist() == ["a", "b", "c"]
    assert reader_catalog.table_exists((ns, "events"))

    # a purge removes data, manifests and metadata, all with the catalog's own key
    assert (
        admin.request("DELETE", f"namespaces/{ns}/tables/events", params={"purgeRequested": "true"}).status_code == 204
    )
    assert _purged(catalog_server, f"wh/{ns}/events/") == []


# ---------------------------------------------------------------------------------------------------------
# Process behaviour; the log check must stay last


def test_sigterm_shuts_down_gracefully(tmp_path: Path, catalog_server: CatalogServer) -> None:
    process, log_path = catalog_server.spawn_another(tmp_path, log_level="info")
    assert catalog_server.stop_process(process, signal.SIGTERM) == 0
    log = log_path.read_text()
    assert "Shutting down" in log and "Application shutdown complete" in log and "Traceback" not in log


def test_catalog_log_holds_no_secret(catalog_server: CatalogServer, writer: Api) -> None:
    # Exercise every secret-carrying path once more, so this test stands on its own when run alone.
    ns = unique("logs")
    writer.create_namespace(ns)
    assert writer.create_table(ns, "t", headers=DELEGATE).status_code == 200
    assert writer.request("GET", f"namespaces/{ns}/tables/t/credentials").status_code == 200
    log = catalog_server.log_text()
    assert f"POST /v1/wh/namespaces/{ns}/tables -> 200 principal=writer" in log, "debug request lines"
    assert len(catalog_server.secrets) >= 4, "client secrets, the catalog key, tokens and STS keys"
    leaked = [secret[:4] + "..." for secret in catalog_server.secrets if secret in log]
    assert leaked == []
    for marker in ("Authorization", "Bearer", "client_secret", "s3.secret-access-key", "s3.session-token"):
        assert marker not in log
