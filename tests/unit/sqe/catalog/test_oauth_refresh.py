"""OAuth client-credentials tokens are refreshed before they expire (real token server on loopback)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from sqe.catalog._auth import BearerAuth
from sqe.catalog._transport import RetryPolicy, make_session
from sqe.errors import AuthenticationError

SECRET = "s3cr3t-client-secret"


@pytest.fixture(scope="module")
def token_server() -> Iterator[tuple[str, list[str]]]:
    issued: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
            if form.get("client_secret") != [SECRET]:
                self._send(401, {"error": "invalid_client", "error_description": "bad client credentials"})
                return
            token = f"token-{len(issued)}"
            issued.append(token)
            self._send(200, {"access_token": token, "token_type": "bearer", "expires_in": 1})

        def do_GET(self) -> None:
            self._send(200, {"authorization": self.headers.get("Authorization")})

        def _send(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", issued
    server.shutdown()
    server.server_close()


def _auth(url: str, secret: str = SECRET) -> BearerAuth:
    return BearerAuth(
        make_session(RetryPolicy(max_retries=0)),
        url + "/v1/oauth/tokens",
        client_id="alice",
        client_secret=secret,
        scope="PRINCIPAL_ROLE:ALL",
    )


def test_token_is_reused_then_refreshed_before_expiry(token_server: tuple[str, list[str]]) -> None:
    url, issued = token_server
    issued.clear()
    auth = _auth(url)
    seen = [requests.get(url + "/x", auth=auth, timeout=5).json()["authorization"] for _ in range(3)]
    assert seen == ["Bearer token-0"] * 3  # one token for calls well inside its lifetime
    time.sleep(0.85)  # a 1 s token is refreshed 20 % before it expires
    assert requests.get(url + "/x", auth=auth, timeout=5).json()["authorization"] == "Bearer token-1"
    assert issued == ["token-0", "token-1"]


def test_rejected_client_is_a_typed_error_without_the_secret(token_server: tuple[str, list[str]]) -> None:
    url, _ = token_server
    with pytest.raises(AuthenticationError) as info:
        _auth(url, secret="wrong-secret-value").current_token()
    assert "bad client credentials" in str(info.value)
    assert "wrong-secret-value" not in str(info.value)
    assert SECRET not in repr(_auth(url))
