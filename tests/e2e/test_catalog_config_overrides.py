"""What a catalog's ``/v1/config`` answer may change about where SQE sends credentials.

pyiceberg takes the answer's ``overrides`` over the client's own properties, ``uri`` included: every later call,
with the user's bearer token, goes to the URI they name. Whoever answers ``/v1/config`` (the catalog, or a proxy in
front of it) could so collect users' tokens (delegated ones too: with a reader, raw credentials of restricted
tables). Found by review: SQE followed an override to another host. Now one on another origin is refused before
any call goes there; within the configured origin it is followed, and the token endpoint never moves.

Real sqe-catalog behind a proxy that rewrites its ``/v1/config`` answer (a hostile catalog or proxy), and a second
proxy in front of the same catalog standing for the other host (so a call sent there would have worked): it
records every request and its ``Authorization`` header.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

import sqe.api
from sqe.config import load_config
from sqe.errors import CatalogProtocolError
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.helpers.fault_proxy import FaultProxy

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


class _Recorder(FaultProxy):
    """A proxy to the catalog that keeps each request's path, ``Authorization`` header and body."""

    def __init__(self, upstream: str, overrides: dict[str, str] | None = None) -> None:
        super().__init__(upstream, rewrite=self._with_overrides if overrides else None)
        self.overrides = overrides or {}
        self.requests: list[tuple[str, str, bytes]] = []

    def _with_overrides(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path.startswith("/v1/config"):
            body.setdefault("overrides", {}).update(self.overrides)
        return body

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        with self.lock:
            self.requests.append((request.path, request.headers.get("Authorization", ""), body))
        request.rfile = io.BytesIO(body)  # FaultProxy reads it again
        super().handle(request)


@contextmanager
def _recording(upstream: str, overrides: dict[str, str] | None = None) -> Iterator[_Recorder]:
    proxy = _Recorder(upstream, overrides)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


def _table(server: CatalogServer, writer: CatalogPrincipal) -> str:
    namespace = f"cfg_over_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(server, writer)
    catalog.create_namespace(namespace)
    schema = pa.schema([("id", pa.int64())])
    catalog.create_table((namespace, "t"), schema=schema).append(pa.table({"id": [1, 2]}, schema=schema))
    return f"{namespace}.t"


def test_a_config_override_moving_uri_to_another_host_is_refused_before_a_token_goes_there(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    """Before: the query ran, every call after ``/v1/config`` went to the other host with the user's bearer token."""
    table = _table(catalog_server, engine_writer)
    with _recording(catalog_server.url) as elsewhere, _recording(catalog_server.url, {"uri": elsewhere.url}) as catalog:
        config = load_config(write_sqe_config(tmp_path / "c.toml", catalog.url, engine_writer, catalog_server.moto))
        with sqe.api.connect(config) as session, pytest.raises(CatalogProtocolError) as refused:
            session.sql(f"SELECT count(*) FROM {table}").fetchall()
    assert elsewhere.requests == []
    message = str(refused.value)
    assert "overrides.uri" in message and elsewhere.url in message, message
    assert engine_writer.client_secret not in message
    bearers = {authorization for _path, authorization, _body in catalog.requests if authorization}
    assert bearers and not any(bearer.removeprefix("Bearer ") in message for bearer in bearers)


def test_a_config_override_within_the_catalogs_origin_is_followed_and_the_token_endpoint_never_moves(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    """A guard for the refusal above (passes on the old code too): an override of ``uri`` on the configured origin
    (here the same URI with a trailing slash) is the catalog's to make and is followed; overrides naming another
    token endpoint or credentials (``oauth2-server-uri``, ``credential``, ``token``: pyiceberg's own auth settings)
    move nothing: SQE's token requests go to ``<catalog.uri>/v1/oauth/tokens`` only."""
    table = _table(catalog_server, engine_writer)
    with _recording(catalog_server.url) as elsewhere:
        overrides = {
            "oauth2-server-uri": f"{elsewhere.url}/v1/oauth/tokens",
            "credential": "someone:else",
            "token": "not-the-users",
        }
        with _recording(catalog_server.url, overrides) as catalog:
            catalog.overrides["uri"] = catalog.url + "/"  # the same catalog, written otherwise
            config = load_config(write_sqe_config(tmp_path / "c.toml", catalog.url, engine_writer, catalog_server.moto))
            with sqe.api.connect(config) as session:
                assert session.sql(f"SELECT count(*) FROM {table}").fetchall() == [(2,)]
    assert elsewhere.requests == []
    token_requests = [body for path, _authorization, body in catalog.requests if path == "/v1/oauth/tokens"]
    assert token_requests and all(engine_writer.client_secret.encode() in body for body in token_requests)
    assert any(path.endswith("/tables/t") for path, _authorization, _body in catalog.requests)
