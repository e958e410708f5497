"""The Polaris quickstart's bootstrap never follows a redirect: urllib resent ``Authorization`` (the root
principal's token) to whatever host a 3xx named, and turned a POST into a GET without its body, which then looked
like success (the catalog, principal or grant was never made). Found by review.

Real loopback servers: Polaris' address answers every request with a redirect to another host name, which records
what it receives and answers 200 ``{}``.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sqe_stack.provision import StackError
from sqe_stack.quickstart import _polaris_call, _polaris_root_token

ROOT_TOKEN = "ROOT-TOKEN-e41"
ROOT_SECRET = "ROOT-SECRET-0b7"


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@contextmanager
def _redirecting(status: int) -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    """(Polaris' base URL, what the host it redirects to received: method, Authorization, body)."""
    received: list[tuple[str, str, bytes]] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            received.append((self.command, self.headers.get("Authorization", ""), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    elsewhere, elsewhere_url = _serve(Elsewhere)

    class Redirect(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            # another host name for the same loopback address: another origin
            self.send_header("Location", elsewhere_url.replace("127.0.0.1", "localhost") + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    polaris, polaris_url = _serve(Redirect)
    try:
        yield polaris_url, received
    finally:
        for server in (polaris, elsewhere):
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize(("method", "body"), [("GET", None), ("POST", {"catalog": {"name": "demo"}})])
def test_a_redirected_polaris_management_call_is_refused_not_followed(
    status: int, method: str, body: object | None
) -> None:
    refusal = rf"^Polaris {method} /catalogs: HTTP {status}$"
    with _redirecting(status) as (base, received), pytest.raises(StackError, match=refusal):
        _polaris_call(base, method, "/catalogs", ROOT_TOKEN, body)
    assert received == []


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirected_root_token_request_is_refused_not_followed(status: int) -> None:
    refused_token = pytest.raises(StackError, match="could not get a token")
    with _redirecting(status) as (base, received), refused_token as refused:
        _polaris_root_token(base, "root", ROOT_SECRET)
    assert received == []
    assert ROOT_SECRET not in str(refused.value)
