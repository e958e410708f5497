"""The catalog transport reads the proxy environment once, when its session is made (real servers on loopback).

A "proxy" here is a real HTTP server: a proxied request reaches it with the absolute URL in its request line,
a direct one reaches the target server with just the path."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sqe.catalog._transport import RetryPolicy, make_session

POLICY = RetryPolicy(max_retries=0, timeout=5)
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


def _recording_server(seen: list[str], answer: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    return server


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list[str], str, list[str]]]:
    """(target url, paths the target saw, proxy url, paths the proxy saw), with no proxy in the environment."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    target_seen: list[str] = []
    proxy_seen: list[str] = []
    target = _recording_server(target_seen, b"direct")
    proxy = _recording_server(proxy_seen, b"proxied")
    yield (
        f"http://127.0.0.1:{target.server_address[1]}",
        target_seen,
        f"http://127.0.0.1:{proxy.server_address[1]}",
        proxy_seen,
    )
    for server in (target, proxy):
        server.shutdown()
        server.server_close()


def test_a_proxy_set_before_the_session_is_used(
    servers: tuple[str, list[str], str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    target, target_seen, proxy, proxy_seen = servers
    monkeypatch.setenv("HTTP_PROXY", proxy)
    session = make_session(POLICY)
    monkeypatch.delenv("HTTP_PROXY")  # read at creation: removing it later changes nothing for this session
    assert session.get(target + "/v1/config").content == b"proxied"
    assert session.get(target + "/v1/config").content == b"proxied"
    assert proxy_seen == [target + "/v1/config"] * 2
    assert target_seen == []


def test_a_proxy_set_after_the_session_is_not_read(
    servers: tuple[str, list[str], str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    target, target_seen, proxy, proxy_seen = servers
    session = make_session(POLICY)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    assert session.get(target + "/v1/config").content == b"direct"
    assert (target_seen, proxy_seen) == (["/v1/config"], [])


@pytest.mark.parametrize(
    ("variables", "proxied"),
    [
        ({"HTTP_PROXY": "{proxy}", "NO_PROXY": "example.invalid,127.0.0.1"}, False),  # NO_PROXY names the host
        ({"http_proxy": "{proxy}", "no_proxy": "example.invalid"}, True),  # it names another host only
        # requests reads ``no_proxy or NO_PROXY``; the standard library's proxy table drops "no" for an empty
        # lowercase variable, which would send a host the operator excluded through the proxy.
        ({"HTTP_PROXY": "{proxy}", "NO_PROXY": "127.0.0.1", "no_proxy": ""}, False),
    ],
    ids=["no-proxy-names-the-host", "no-proxy-names-another-host", "empty-lowercase-does-not-hide-uppercase"],
)
def test_no_proxy_decides_as_requests_does(
    servers: tuple[str, list[str], str, list[str]],
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    proxied: bool,
) -> None:
    target, target_seen, proxy, proxy_seen = servers
    for name, value in variables.items():
        monkeypatch.setenv(name, value.format(proxy=proxy))
    session = make_session(POLICY)
    assert session.get(target + "/t").content == (b"proxied" if proxied else b"direct")
    assert (target_seen, proxy_seen) == (([], [target + "/t"]) if proxied else (["/t"], []))


def test_the_ca_bundle_variable_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/first-bundle.crt")
    session = make_session(POLICY)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/second-bundle.crt")
    assert session.verify == "/etc/ssl/certs/first-bundle.crt"
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    assert make_session(POLICY).verify is True
