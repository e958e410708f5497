"""A token endpoint's redirect is never followed: the form it would be resent with holds the client secret (or the
tokens of an exchange), and the host a redirect names is anyone's (a browser or curl sends no credential to
another origin either). Found by review: requests resent the form to the host a 307 or 308 named.

Real loopback servers: one answers every request with a redirect to the other, which records what it gets.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sqe.catalog._early_token import EarlyToken
from sqe.config import load_config
from sqe.errors import CatalogUnavailableError

SECRET = "TOKEN-FORM-SECRET-5c9"
READER_SECRET = "READER-FORM-SECRET-a21"


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@contextmanager
def redirecting(status: int) -> Iterator[tuple[str, list[bytes]]]:
    """(the redirecting catalog's URL, the bodies the host it redirects to received)."""
    received: list[bytes] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            received.append(self.rfile.read(length) if length else b"")
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    elsewhere, elsewhere_url = _serve(Elsewhere)

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            # another host name for the same loopback address: another origin
            self.send_header("Location", elsewhere_url.replace("127.0.0.1", "localhost") + "/v1/oauth/tokens")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    catalog, catalog_url = _serve(Redirect)
    try:
        yield catalog_url, received
    finally:
        for server in (catalog, elsewhere):
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("status", [307, 308, 302, 303])
@pytest.mark.parametrize("reader", [False, True])
def test_a_redirected_token_request_is_not_followed(status: int, reader: bool) -> None:
    readers = {"catalog.reader_client_id": "engine", "catalog.reader_client_secret": READER_SECRET} if reader else {}
    with redirecting(status) as (uri, received):
        config = load_config(
            None,
            env={},
            overrides={
                "catalog.uri": uri,
                "catalog.warehouse": "wh",
                "catalog.client_id": "alice",
                "catalog.client_secret": SECRET,
                "catalog.max_retries": 0,
                **readers,
            },
        )
        early = EarlyToken.start(config)
        with pytest.raises(CatalogUnavailableError, match=rf"HTTP {status}, a redirect \(not followed") as refused:
            early.wait()
        early.session.close()
    assert received == []
    assert SECRET not in str(refused.value) and READER_SECRET not in str(refused.value)
