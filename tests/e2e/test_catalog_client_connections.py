"""A new catalog client's first table load goes over the connection its ``/v1/config`` request opened.

pyiceberg fetches the config through a session it closes at once and makes another for every later call, so
the first load of each new client (each new SQE session, each ``sqe -e``) paid a TCP handshake of its own.
Real sqe-catalog; the connections are counted by the client's own connection pool.
"""

from __future__ import annotations

import http.client
import select
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from tests.conftest import pyiceberg_catalog, restartable_catalog, write_sqe_config
from tests.helpers.fault_proxy import FaultProxy

if TYPE_CHECKING:
    from urllib3 import HTTPConnectionPool

    from sqe.catalog.rest import SQERestCatalog
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


def _pool(catalog: SQERestCatalog, url: str) -> HTTPConnectionPool:
    """The client's one connection pool, for the catalog's host (the one its requests went through)."""
    pools = catalog._session.get_adapter(url).poolmanager.pools
    [pool] = [pools[key] for key in pools.keys()]  # noqa: SIM118 (urllib3's container refuses iteration)
    assert (pool.host, pool.port) == (urlsplit(url).hostname, urlsplit(url).port)
    return pool


def test_the_first_table_load_reuses_the_connection_of_the_config_request(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    pyiceberg_catalog(catalog_server, engine_writer).create_namespace("conn_reuse")
    pyiceberg_catalog(catalog_server, engine_writer).create_table(
        ("conn_reuse", "t"), schema=pa.schema([("id", pa.int64())])
    )
    config = load_config(write_sqe_config(tmp_path / "c.toml", catalog_server.url, engine_writer, catalog_server.moto))
    provider = RestTableProvider(config)
    try:
        catalog = provider.catalog(config.catalog.warehouse)  # GET /v1/config
        pool = _pool(catalog, catalog_server.url)
        assert (pool.num_connections, pool.num_requests) == (1, 1)
        status, raw, _etag = catalog.get_table_raw(("conn_reuse",), "t", None)
        assert status == 200 and raw is not None
        assert (pool.num_connections, pool.num_requests) == (1, 2)  # the same connection served the load
    finally:
        provider.close()


class _HeaderRecorder(FaultProxy):
    """The catalog behind a proxy that records each request's headers, and whose ``/v1/config`` answer names a
    header override (``header.X-Config-Named``) as a catalog's config may."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, rewrite=self._with_header_override)
        self.headers: list[tuple[str, dict[str, str]]] = []

    @staticmethod
    def _with_header_override(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.startswith("/v1/config"):
            body.setdefault("overrides", {})["header.X-Config-Named"] = "from-config"
        return body

    def _upstream(self, request: Any, body: bytes) -> Any:
        with self.lock:
            self.headers.append((request.path, dict(request.headers.items())))
        return super()._upstream(request, body)


def test_header_overrides_of_the_config_answer_go_on_every_later_request(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    # A review of the connection reuse: the kept session got its headers before the config's overrides joined the
    # properties, so their header.* entries (which pyiceberg's own second session carried) were dropped.
    writer = pyiceberg_catalog(catalog_server, engine_writer)
    writer.create_namespace("conn_headers")
    writer.create_table(("conn_headers", "t"), schema=pa.schema([("id", pa.int64())]))
    proxy = _HeaderRecorder(catalog_server.url)
    proxy.start()
    try:
        config_path = write_sqe_config(tmp_path / "c.toml", proxy.url, engine_writer, catalog_server.moto)
        provider = RestTableProvider(load_config(config_path))
        try:
            catalog = provider.catalog(provider.default_warehouse())
            catalog.get_table_raw(("conn_headers",), "t", None)
        finally:
            provider.close()
    finally:
        proxy.stop()
    [(_path, loaded)] = [(path, headers) for path, headers in proxy.headers if "/tables/t" in path]
    assert loaded.get("X-Config-Named") == "from-config", loaded


def _idle_connection(url: str) -> http.client.HTTPConnection:
    """A connection to the catalog that has answered one request in full and is now idle (kept alive)."""
    connection = http.client.HTTPConnection(urlsplit(url).netloc, timeout=5)
    connection.request("GET", "/v1/config")
    connection.getresponse().read()
    return connection


def _closed_by_server(connection: http.client.HTTPConnection) -> bool:
    assert connection.sock is not None
    readable, _, _ = select.select([connection.sock], [], [], 0)
    return bool(readable) and connection.sock.recv(1, socket.MSG_PEEK) == b""


def test_an_idle_connection_is_kept_for_the_configured_seconds(
    catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Before: uvicorn's 5 s. A client pausing about that long (a test waiting out a 5 s credential) sent its next
    # POST just as the server closed the connection and got it reset ("Remote end closed connection without
    # response"), which no client resends. The default is 75 s now; a short setting shows the key is applied.
    workdir = tmp_path_factory.mktemp("keep_alive")
    with restartable_catalog(workdir, catalog_server.moto, {}, keep_alive_seconds=1) as (short, _restart):
        kept, dropped = _idle_connection(catalog_server.url), _idle_connection(short.url)
        try:
            time.sleep(2.2)
            assert _closed_by_server(dropped)
            assert not _closed_by_server(kept)
            kept.request("GET", "/v1/config")
            assert kept.getresponse().status in (200, 401)
        finally:
            kept.close()
            dropped.close()
