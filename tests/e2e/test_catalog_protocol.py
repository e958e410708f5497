"""Protocol details of ``sqe-catalog`` against the real server: /v1/config defaults, dotted namespace levels,
the scope ``catalog``, format-v3 creates, conventional default properties, one identifier rule on every route,
clean 500s with a request id, and sandbox mode on loopback."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from sqe_stack.catalog import catalog_log_path
from tests.conftest import free_loopback_port, start_catalog_process, stop_process, write_catalog_config

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

SEP = "%1F"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
ICE_SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def _headers(server: CatalogServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token(server.admin)}"}


def _url(server: CatalogServer, path: str) -> str:
    return f"{server.url}/v1/{server.warehouse}/{path}"


def _catalog(server: CatalogServer, **extra: str) -> RestCatalog:
    # pyiceberg's defaults: scope "catalog", no vending header (it reads with the /v1/config S3 defaults? no:
    # data is written with vended credentials below; the scope is what this exercises).
    return RestCatalog(
        f"proto-{uuid.uuid4().hex[:6]}",
        uri=server.url,
        warehouse=server.warehouse,
        credential=server.admin.credential,
        **{"header.X-Iceberg-Access-Delegation": "vended-credentials", **extra},
    )


def test_config_returns_separator_and_s3_defaults(catalog_server: CatalogServer) -> None:
    reply = requests.get(f"{catalog_server.url}/v1/config", headers=_headers(catalog_server), timeout=30)
    assert reply.status_code == 200, reply.text
    defaults = reply.json()["defaults"]
    assert defaults["namespace-separator"] == SEP
    assert defaults["s3.endpoint"] == catalog_server.moto.url
    assert defaults["client.region"] == catalog_server.moto.region
    assert defaults["s3.path-style-access"] == "true"
    endpoints = reply.json()["endpoints"]
    assert "GET /v1/{prefix}/namespaces/{namespace}/views/{view}" in endpoints
    assert "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}/plan" in endpoints


def test_pyiceberg_default_scope_catalog_is_accepted(catalog_server: CatalogServer) -> None:
    form = {
        "grant_type": "client_credentials",
        "client_id": catalog_server.admin.client_id,
        "client_secret": catalog_server.admin.client_secret,
        "scope": "catalog",
    }
    reply = requests.post(f"{catalog_server.url}/v1/oauth/tokens", data=form, timeout=30)
    assert reply.status_code == 200, reply.text
    catalog_server.secrets.add(reply.json()["access_token"])
    assert _catalog(catalog_server).list_namespaces() is not None  # pyiceberg with its own default scope


def test_namespace_level_with_a_dot_everywhere(catalog_server: CatalogServer) -> None:
    catalog = _catalog(catalog_server)
    dotted, nested = (f"v1.2-{uuid.uuid4().hex[:6]}",), None
    catalog.create_namespace(dotted)
    nested = (dotted[0].split(".")[0], dotted[0].split(".")[1])
    catalog.create_namespace(nested[:1])
    catalog.create_namespace(nested)
    assert catalog.namespace_exists(dotted)
    head = requests.head(_url(catalog_server, f"namespaces/{quote(dotted[0])}"), headers=_headers(catalog_server))
    assert head.status_code == 204
    table = catalog.create_table((*dotted, "t"), ICE_SCHEMA)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    assert catalog.table_exists((*dotted, "t")) and not catalog.table_exists((*nested, "t"))
    assert catalog.list_tables(dotted) == [(*dotted, "t")]
    assert catalog.list_tables(nested) == []
    assert (dotted[0],) in catalog.list_namespaces()
    assert catalog.load_table((*dotted, "t")).scan().to_arrow().num_rows == 2
    assert catalog.load_table((*dotted, "t")).metadata.location.endswith(f"/{dotted[0]}/t")


def test_new_tables_get_default_properties_and_v3_works(catalog_server: CatalogServer) -> None:
    catalog = _catalog(catalog_server)
    ns = f"props_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(ns)
    plain = catalog.create_table(f"{ns}.plain", ICE_SCHEMA)
    assert plain.properties["write.parquet.compression-codec"] == "zstd"
    chosen = catalog.create_table(f"{ns}.chosen", ICE_SCHEMA, properties={"write.parquet.compression-codec": "snappy"})
    assert chosen.properties["write.parquet.compression-codec"] == "snappy"
    v3 = catalog.create_table(f"{ns}.v3", ICE_SCHEMA, properties={"format-version": "3"})
    assert v3.metadata.format_version == 3
    assert catalog.load_table(f"{ns}.v3").metadata.format_version == 3
    # A create transaction commits an upgrade-format-version update (pyiceberg's server-side update code stops
    # at 2); the catalog applies a create transaction's upgrade to 3 itself (DuckDB's iceberg extension needs it).
    transaction = catalog.create_table_transaction(f"{ns}.v3tx", ICE_SCHEMA, properties={"format-version": "3"})
    transaction.commit_transaction()
    assert catalog.load_table(f"{ns}.v3tx").metadata.format_version == 3


ODD = ["..", ".", " ", " pad", "pad ", "a\u200bb", "a\u2028b", "a\x01b", "a/b", "a\\b", "x" * 256]


def _routes(ns: str, odd: str) -> list[tuple[str, str, Any]]:
    # "%2F" stays encoded (a "/" inside a name); dots encoded so the client does not drop ".." segments.
    o = quote(odd, safe="").replace(".", "%2E")
    table_body = {"name": odd, "schema": SCHEMA}
    ident = {"namespace": [ns], "name": odd}
    good = {"namespace": [ns], "name": "fine"}
    view_body = {
        "name": odd,
        "schema": SCHEMA,
        "view-version": {
            "version-id": 1,
            "schema-id": 0,
            "timestamp-ms": 1,
            "summary": {},
            "representations": [{"type": "sql", "sql": "select 1", "dialect": "duckdb"}],
            "default-namespace": [ns],
        },
    }
    return [
        ("GET", f"namespaces/{o}", None),
        ("HEAD", f"namespaces/{o}", None),
        ("DELETE", f"namespaces/{o}", None),
        ("GET", f"namespaces?parent={o}", None),
        ("POST", "namespaces", {"namespace": [odd]}),
        ("POST", f"namespaces/{ns}/tables", table_body),
        ("POST", f"namespaces/{ns}/tables", {**table_body, "stage-create": True}),
        ("POST", f"namespaces/{ns}/register", {"name": odd, "metadata-location": "s3://x/y.json"}),
        ("GET", f"namespaces/{ns}/tables/{o}", None),
        ("HEAD", f"namespaces/{ns}/tables/{o}", None),
        ("DELETE", f"namespaces/{ns}/tables/{o}", None),
        ("POST", "tables/rename", {"source": ident, "destination": good}),
        ("POST", "tables/rename", {"source": good, "destination": ident}),
        ("POST", f"namespaces/{ns}/views", view_body),
        ("GET", f"namespaces/{ns}/views/{o}", None),
        ("HEAD", f"namespaces/{ns}/views/{o}", None),
        ("DELETE", f"namespaces/{ns}/views/{o}", None),
        ("POST", "views/rename", {"source": ident, "destination": good}),
    ]


@pytest.mark.parametrize("odd", ODD)
def test_odd_identifiers_are_400_on_every_route(catalog_server: CatalogServer, odd: str) -> None:
    ns = "odd_ids"
    headers = _headers(catalog_server)
    requests.post(_url(catalog_server, "namespaces"), json={"namespace": [ns]}, headers=headers, timeout=30)
    for method, path, body in _routes(ns, odd):
        reply = requests.request(method, _url(catalog_server, path), json=body, headers=headers, timeout=30)
        assert reply.status_code == 400, (method, path, reply.status_code, reply.text)
        if method != "HEAD":
            error = reply.json()["error"]
            assert error["type"] == "BadRequestException" and error["code"] == 400, (method, path)


def test_unexpected_failure_is_a_clean_500_with_a_request_id(catalog_server: CatalogServer, tmp_path: Path) -> None:
    # A warehouse on a bucket that does not exist: writing a metadata file fails inside pyiceberg (OSError).
    moto = catalog_server.moto
    port = free_loopback_port()
    config = write_catalog_config(tmp_path, moto, port, warehouse={"location": "s3://no-such-bucket-sqe/wh"})
    process = start_catalog_process(config, tmp_path, port)
    try:
        import contextlib
        import io

        from sqe_catalog.cli import main as catalog_cli

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert catalog_cli(["admin", "--config", str(config), "create-principal", "root", "--admin"]) == 0
        root = json.loads(out.getvalue())
        token = requests.post(
            f"http://127.0.0.1:{port}/v1/oauth/tokens",
            data={
                "grant_type": "client_credentials",
                "client_id": root["client_id"],
                "client_secret": root["client_secret"],
                "scope": "PRINCIPAL_ROLE:ALL",
            },
            timeout=30,
        ).json()["access_token"]
        base = f"http://127.0.0.1:{port}/v1/wh"
        headers = {"Authorization": f"Bearer {token}"}
        assert requests.post(f"{base}/namespaces", json={"namespace": ["n"]}, headers=headers).status_code == 200
        reply = requests.post(f"{base}/namespaces/n/tables", json={"name": "t", "schema": SCHEMA}, headers=headers)
        assert reply.status_code == 500, reply.text
        request_id = reply.headers["X-Request-ID"]
        assert reply.json() == {
            "error": {"message": f"internal server error (request id {request_id})", "type": "ServerError", "code": 500}
        }
        assert "Traceback" not in reply.text and "bucket" not in reply.text.lower()
    finally:
        stop_process(process)
    log = catalog_log_path(tmp_path).read_text(errors="replace")
    assert "Traceback" in log, "the server log keeps the exception"
    assert log.count(f"request id {request_id})") == 1, "the failure is logged once, under the client's id"
    assert token not in log and root["client_secret"] not in log


def _sandbox(tmp_path: Path, server: CatalogServer, host: str) -> tuple[Any, int, Path]:
    port = free_loopback_port()
    config = write_catalog_config(tmp_path, server.moto, port, host=host, anonymous_principal="sandbox")
    import contextlib
    import io

    from sqe_catalog.cli import main as catalog_cli

    with contextlib.redirect_stdout(io.StringIO()):
        assert catalog_cli(["admin", "--config", str(config), "create-principal", "sandbox", "--admin"]) == 0
    return start_catalog_process(config, tmp_path, port), port, config


def test_sandbox_serves_unauthenticated_requests_on_loopback(catalog_server: CatalogServer, tmp_path: Path) -> None:
    process, port, _ = _sandbox(tmp_path, catalog_server, "127.0.0.1")
    try:
        base = f"http://127.0.0.1:{port}"
        assert requests.post(f"{base}/v1/wh/namespaces", json={"namespace": ["anon"]}, timeout=30).status_code == 200
        listed = requests.get(f"{base}/v1/wh/namespaces", timeout=30).json()["namespaces"]
        assert ["anon"] in listed
        bad = requests.get(f"{base}/v1/wh/namespaces", headers={"Authorization": "Bearer nope"}, timeout=30)
        assert bad.status_code == 401, "a token that is sent is still checked"
        catalog = RestCatalog("anon", uri=base, warehouse="wh", auth={"type": "noop"})  # no credential at all
        assert ("anon",) in catalog.list_namespaces()
    finally:
        stop_process(process)
    assert "sandbox mode" in catalog_log_path(tmp_path).read_text(errors="replace")


def test_sandbox_is_refused_off_loopback(catalog_server: CatalogServer, tmp_path: Path) -> None:
    from sqe_catalog.api import create_app
    from sqe_catalog.config import load_config

    port = free_loopback_port()
    config = write_catalog_config(tmp_path, catalog_server.moto, port, host="0.0.0.0", anonymous_principal="x")
    import logging

    records: list[str] = []

    class _Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = _Capture()
    logging.getLogger("sqe_catalog").addHandler(handler)
    try:
        create_app(load_config(config))  # the app is built, not served: nothing listens on 0.0.0.0
    finally:
        logging.getLogger("sqe_catalog").removeHandler(handler)
    assert any("anonymous_principal is refused" in r for r in records)
