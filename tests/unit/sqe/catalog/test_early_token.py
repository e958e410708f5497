"""The early first token (``sqe.catalog._early_token``): its failure reaches the caller typed, it never pickles,
and its repr names no secret. (Against the real catalog: ``tests/e2e/test_early_token.py``.)"""

from __future__ import annotations

import http.server
import pickle
import threading
from pathlib import Path

import pytest

from sqe.catalog._early_token import EarlyToken
from sqe.catalog.lazy import LazyRestTableProvider
from sqe.config import load_config
from sqe.errors import CatalogUnavailableError

SECRET = "a-secret-value"


def _early() -> EarlyToken:
    config = load_config(
        None,
        overrides={
            "catalog.uri": "http://127.0.0.1:9",  # closed: the token request fails fast
            "catalog.warehouse": "wh",
            "catalog.client_id": "u",
            "catalog.client_secret": SECRET,
            "catalog.max_retries": 0,
        },
    )
    return EarlyToken.start(config)


def test_a_failed_token_request_is_raised_by_wait_typed_and_without_the_secret() -> None:
    early = _early()
    with pytest.raises(CatalogUnavailableError, match="token endpoint") as failed:
        early.wait()
    assert SECRET not in str(failed.value)
    with pytest.raises(CatalogUnavailableError):
        early.wait()  # kept: the same error again
    early.session.close()


def test_it_never_pickles_and_its_repr_names_no_secret() -> None:
    early = _early()
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(early)
    assert SECRET not in repr(early) and "wh" in repr(early)
    with pytest.raises(CatalogUnavailableError):
        early.wait()
    early.session.close()


class _CountingCatalog:
    """A loopback HTTP server that counts the requests it gets and answers each with a 503 (a real socket: a
    request to it is a request the catalog would have seen)."""

    def __init__(self) -> None:
        counts = self.requests = [0]

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                counts[0] += 1
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


def test_a_first_call_for_a_sibling_warehouse_never_contacts_the_primary_catalog(tmp_path: Path) -> None:
    """The early token is the warehouse the first call needs: a session that starts with a sibling (its own
    catalog and credentials) sends nothing to the primary's catalog, and the primary's credentials go nowhere."""
    primary = _CountingCatalog()
    try:
        path = tmp_path / "config.toml"
        path.write_text(
            "[catalog]\n"
            f'uri = "{primary.url}"\nwarehouse = "prim"\nclient_id = "p"\nclient_secret = "{SECRET}"\n'
            "max_retries = 0\n"
            "[[catalog.warehouses]]\n"
            'name = "sib"\nuri = "http://127.0.0.1:9"\nclient_id = "s"\nclient_secret = "sibling-secret"\n'
        )
        provider = LazyRestTableProvider(load_config(path, env={}))
        with pytest.raises(CatalogUnavailableError, match=r"127\.0\.0\.1:9/") as failed:
            provider.list_namespaces("sib")
        assert SECRET not in str(failed.value)
        assert primary.requests == [0]
        provider.close()
    finally:
        primary.close()


@pytest.mark.parametrize("reader", [False, True])
def test_its_repr_names_the_catalog_without_a_credential_in_its_uri(reader: bool) -> None:
    """The end user's auth, or the delegated one when a reader is configured: both name the token URL. (A uri with
    a password is refused when the config loads; a token parameter is not.)"""
    readers = {"catalog.reader_client_id": "engine", "catalog.reader_client_secret": "r-secret"} if reader else {}
    config = load_config(
        None,
        overrides={
            "catalog.uri": f"http://127.0.0.1:9/api/catalog?token={SECRET}",
            "catalog.warehouse": "wh",
            "catalog.client_id": "u",
            "catalog.client_secret": "other",
            "catalog.max_retries": 0,
            **readers,
        },
    )
    early = EarlyToken.start(config)
    assert SECRET not in repr(early) and "http://127.0.0.1:9/api/catalog?token=***" in repr(early), repr(early)
    with pytest.raises(CatalogUnavailableError):
        early.wait()
    early.session.close()
