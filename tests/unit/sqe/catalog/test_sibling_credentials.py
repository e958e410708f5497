"""No catalog client sends ``[catalog]``'s credentials to a sibling warehouse on another catalog unless that sibling
opts in (``inherit_credentials = true``): not the early first token (``sqe.catalog._early_token``), not the REST
client. Checked against loopback HTTP servers that record every request they get (a real socket: a request to
one is a request that catalog's operator would have seen).

The config is built in code, as ``sqe.api.connect`` accepts it, so no ``load_config`` check stands in front.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from urllib.parse import parse_qs

import pytest

from sqe.catalog._early_token import EarlyToken
from sqe.catalog.lazy import LazyRestTableProvider
from sqe.config import CatalogConfig, SiblingWarehouseConfig, SQEConfig
from sqe.errors import CatalogUnavailableError, ConfigError

SECRET = "PRIMARY-SECRET-7b0"


class _RecordingCatalog:
    """A loopback HTTP server that records each request's path and form and answers it with a 503."""

    def __init__(self) -> None:
        received: list[tuple[str, dict[str, list[str]]]] = []
        self.received = received

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                received.append((self.path, parse_qs(body)))
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def catalogs() -> Iterator[tuple[_RecordingCatalog, _RecordingCatalog]]:
    primary, other = _RecordingCatalog(), _RecordingCatalog()
    try:
        yield primary, other
    finally:
        primary.close()
        other.close()


def _config(primary: str, other: str, *, inherit: bool) -> SQEConfig:
    opt_in = {"inherit_credentials": True} if inherit else {}  # unset: the config a user wrote before the key
    sibling = SiblingWarehouseConfig(name="sib", uri=other, **opt_in)
    catalog = CatalogConfig(
        uri=primary,
        warehouse="prim",
        client_id="alice",
        client_secret=SECRET,
        max_retries=0,
        warehouses=(sibling,),
    )
    return SQEConfig(catalog=catalog)


def test_the_early_token_of_a_sibling_on_another_catalog_sends_nothing_without_the_opt_in(
    catalogs: tuple[_RecordingCatalog, _RecordingCatalog],
) -> None:
    primary, other = catalogs
    with pytest.raises(ConfigError, match=r"^catalog\.warehouses\[0\]\.uri: ") as refused:
        EarlyToken.start(_config(primary.url, other.url, inherit=False), "sib")
    assert SECRET not in str(refused.value) and other.url in str(refused.value)
    assert other.received == [] and primary.received == []


def test_the_rest_client_of_a_sibling_on_another_catalog_sends_nothing_without_the_opt_in(
    catalogs: tuple[_RecordingCatalog, _RecordingCatalog],
) -> None:
    """A session's first call naming the sibling (the lazy provider starts that warehouse's early token, then
    builds the REST client for every warehouse), and a first call naming the primary: both refused before any
    request, to either catalog."""
    primary, other = catalogs
    for first in ("sib", "prim"):
        provider = LazyRestTableProvider(_config(primary.url, other.url, inherit=False))
        with pytest.raises(ConfigError, match="inherit_credentials = true"):
            provider.list_namespaces(first)
        provider.close()
    assert other.received == [] and primary.received == []


def test_opting_in_sends_the_primarys_client_credentials_to_that_catalog_only(
    catalogs: tuple[_RecordingCatalog, _RecordingCatalog],
) -> None:
    """What ``inherit_credentials = true`` is documented to do: the sibling's token requests carry ``[catalog]``'s
    client credentials, to the sibling's own token endpoint; the primary's catalog sees none of them."""
    primary, other = catalogs
    early = EarlyToken.start(_config(primary.url, other.url, inherit=True), "sib")
    with pytest.raises(CatalogUnavailableError):
        early.wait()
    early.session.close()
    assert [(path, form.get("client_id"), form.get("client_secret")) for path, form in other.received] == [
        ("/v1/oauth/tokens", ["alice"], [SECRET])
    ]
    assert primary.received == []
