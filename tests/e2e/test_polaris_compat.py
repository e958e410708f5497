"""SQE against ``sqe-catalog`` in Polaris mode (``[server] polaris_compat = true``): the config the README gives
for a real Polaris works unchanged, and the catalog answers as Polaris does on every point SQE depends on —
base path ``/api/catalog``, OAuth path and required scope, ``/v1/config`` with a required warehouse and
``prefix`` override, storage-credential shape, relative refresh endpoint ``.../credentials``, ErrorModel bodies."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog.rest import RestCatalog

import sqe.api
from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.distributed.coordinator import DistributedOptions
from sqe.session import Session
from sqe_stack.catalog import spawn_catalog
from sqe_stack.provision import http_status, wait_until
from tests.conftest import (
    CATALOG_WAREHOUSE,
    CatalogPrincipal,
    CatalogServer,
    MotoServer,
    WorkerFactory,
    catalog_record,
    free_loopback_port,
    stop_process,
    write_catalog_config,
    write_sqe_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BASE = "/api/catalog"
VENDED_KEYS = {"s3.access-key-id", "s3.secret-access-key", "s3.session-token", "s3.session-token-expires-at-ms"}


@pytest.fixture(scope="module")
def polaris(tmp_path_factory: pytest.TempPathFactory, moto_server: MotoServer) -> Iterator[CatalogServer]:
    workdir = tmp_path_factory.mktemp("polaris-mode")
    port = free_loopback_port()
    config_path = write_catalog_config(workdir, moto_server, port, None, polaris_compat=True)
    server = catalog_record(workdir, moto_server, port, config_path)
    process = spawn_catalog(workdir, config_path, {})
    server.pid = process.pid
    wait_until(lambda: http_status(f"{server.url}{BASE}/v1/config") == 401, "polaris-mode catalog", 60, [process])
    try:
        yield server
    finally:
        stop_process(process)


def _call(url: str, *, data: bytes | None = None, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=data)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _token(polaris: CatalogServer, principal: CatalogPrincipal, scope: str | None) -> tuple[int, Any]:
    form = {"grant_type": "client_credentials", "client_id": principal.client_id}
    form["client_secret"] = principal.client_secret
    if scope is not None:
        form["scope"] = scope
    return _call(f"{polaris.url}{BASE}/v1/oauth/tokens", data=urllib.parse.urlencode(form).encode())


def _assert_error_model(body: Any, code: int) -> None:
    assert set(body) == {"error"} and body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and isinstance(body["error"]["type"], str)


def test_oauth_and_config_answer_as_polaris(polaris: CatalogServer) -> None:
    status, body = _token(polaris, polaris.admin, "PRINCIPAL_ROLE:ALL")
    assert status == 200 and body["token_type"] == "bearer" and body["expires_in"] > 0
    assert body["issued_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
    token = body["access_token"]
    assert _token(polaris, polaris.admin, None)[1]["error"] == "invalid_scope"  # Polaris requires a scope
    status, body = _call(f"{polaris.url}{BASE}/v1/config", token=token)
    assert status == 400  # Polaris: the warehouse (catalog name) is required
    _assert_error_model(body, 400)
    status, body = _call(f"{polaris.url}{BASE}/v1/config?warehouse={CATALOG_WAREHOUSE}", token=token)
    assert status == 200 and body["overrides"] == {"prefix": CATALOG_WAREHOUSE}
    # Polaris returns the catalog's properties as defaults; sqe-catalog adds its store defaults (README table)
    assert body["defaults"]["default-base-location"] == polaris.warehouse_location
    status, body = _call(f"{polaris.url}/v1/config?warehouse={CATALOG_WAREHOUSE}", token=token)
    assert status == 404  # nothing at the root: only Polaris's base path
    _assert_error_model(body, 404)
    status, body = _call(f"{polaris.url}{BASE}/v1/{CATALOG_WAREHOUSE}/namespaces/nope/tables/t", token=token)
    assert status == 404 and body["error"]["type"] in ("NoSuchTableException", "NoSuchNamespaceException")
    _assert_error_model(body, 404)


def test_the_readme_polaris_config_works_through_vended_credentials(
    polaris: CatalogServer, tmp_path: Path, worker_process_factory: WorkerFactory
) -> None:
    writer = polaris.principal_with_grants(
        "writer",
        [
            ("TABLE_WRITE_DATA", None, None),
            ("TABLE_CREATE", None, None),
            ("NAMESPACE_CREATE", None, None),
            ("NAMESPACE_LIST", None, None),
            ("TABLE_LIST", None, None),
        ],
    )
    analyst = polaris.principal_with_grants("analyst", [("TABLE_READ_DATA", None, None), ("TABLE_LIST", None, None)])
    uri = polaris.url + BASE  # exactly as for a real Polaris: uri = <host>/api/catalog, warehouse = catalog name
    RestCatalog(
        "p",
        uri=uri,
        warehouse=CATALOG_WAREHOUSE,
        credential=f"{writer.client_id}:{writer.client_secret}",
        scope="PRINCIPAL_ROLE:ALL",
    ).create_namespace("pc")
    writer_cfg = write_sqe_config(tmp_path / "writer.toml", uri, writer, polaris.moto)
    analyst_cfg = write_sqe_config(tmp_path / "analyst.toml", uri, analyst, polaris.moto)
    with sqe.api.connect(writer_cfg) as session:
        session.sql("CREATE TABLE pc.orders AS SELECT 1 AS id, 'ada' AS who")
    with sqe.api.connect(analyst_cfg) as session:
        assert session.sql("SELECT id, who FROM pc.orders").arrow().to_pylist() == [{"id": 1, "who": "ada"}]
        explain = json.dumps(session.sql("EXPLAIN SELECT * FROM pc.orders").arrow().to_pylist())
    assert "vended" in explain

    token = _token(polaris, analyst, "PRINCIPAL_ROLE:ALL")[1]["access_token"]
    request = urllib.request.Request(f"{uri}/v1/{CATALOG_WAREHOUSE}/namespaces/pc/tables/orders")
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("X-Iceberg-Access-Delegation", "vended-credentials")
    with urllib.request.urlopen(request, timeout=30) as resp:
        loaded = json.loads(resp.read())
    (credential,) = loaded["storage-credentials"]
    assert credential["prefix"] == loaded["metadata"]["location"] and set(credential["config"]) == VENDED_KEYS
    refresh = loaded["config"]["client.refresh-credentials-endpoint"]
    assert refresh == f"v1/{CATALOG_WAREHOUSE}/namespaces/pc/tables/orders/credentials"  # relative, as Polaris
    status, refreshed = _call(f"{uri}/{refresh}", token=token)
    assert status == 200 and set(refreshed["storage-credentials"][0]["config"]) == VENDED_KEYS
    assert credential["config"]["s3.secret-access-key"] not in polaris.log_text()

    # As Polaris, the keys are also in config: the same set twice, once with a prefix and once without.
    assert {k: loaded["config"][k] for k in VENDED_KEYS} == credential["config"]
    distributed_scan_reads_the_table(analyst_cfg, worker_process_factory)


def distributed_scan_reads_the_table(config_path: Path, worker_process_factory: WorkerFactory) -> None:
    """The scan's tickets carry one set for the table location (the storage-credentials entry), not that entry
    and the config copy as two sets for one prefix, which a worker refuses as an invalid ticket."""
    worker = worker_process_factory.start()
    config = load_config(
        config_path, env={}, overrides={"coordinator": {"workers": [worker.address], "token": worker.token}}
    )
    provider = RestTableProvider(config)
    with Session(provider, config, distributed=DistributedOptions(), on_close=provider.close) as session:
        assert session.sql("SELECT id, who FROM pc.orders").arrow().to_pylist() == [{"id": 1, "who": "ada"}]
        executor = session.distributed_executor
        assert executor is not None and executor.stats.fragments_completed == 1
