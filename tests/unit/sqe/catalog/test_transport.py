"""Retry policy of the catalog transport, against a real fault-injecting HTTP server on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from sqe.catalog._transport import RetryPolicy, backoff_delay, make_session, retry_after_seconds
from sqe.catalog.rest import error_for_status
from sqe.errors import (
    AuthenticationError,
    CatalogUnavailableError,
    IntegrityError,
    PermissionDeniedError,
    RestrictionsNotSupportedError,
)


@dataclass
class Script:
    """Statuses to answer in order (then 200), and the requests seen."""

    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def _server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.seen_body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            script.seen.append(self.command)
            status, headers = script.answers.pop(0) if script.answers else (200, {})
            body = b'{"error":{"message":"injected","type":"X","code":%d}}' % status
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", script
    server.shutdown()
    server.server_close()


@pytest.fixture
def faulty(_server: tuple[str, Script]) -> tuple[str, Script]:
    url, script = _server
    script.answers.clear()
    script.seen.clear()
    return url, script


FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.01, timeout=5)


def test_429_is_retried_for_post(faulty: tuple[str, Script]) -> None:
    url, script = faulty
    script.answers = [(429, {}), (429, {})]
    response = make_session(FAST).post(url + "/x", data=b"{}")
    assert response.status_code == 200
    assert script.seen == ["POST", "POST", "POST"]


def test_503_with_retry_after_is_retried_for_post(faulty: tuple[str, Script]) -> None:
    url, script = faulty
    script.answers = [(503, {"Retry-After": "0"})]
    assert make_session(FAST).post(url + "/x", data=b"{}").status_code == 200
    assert script.seen == ["POST", "POST"]


def test_503_without_retry_after_is_not_retried_for_post(faulty: tuple[str, Script]) -> None:
    url, script = faulty
    script.answers = [(503, {})]
    assert make_session(FAST).post(url + "/x", data=b"{}").status_code == 503
    assert script.seen == ["POST"]


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408])
def test_server_errors_are_retried_for_get(faulty: tuple[str, Script], status: int) -> None:
    url, script = faulty
    script.answers = [(status, {})]
    assert make_session(FAST).get(url + "/x").status_code == 200
    assert script.seen == ["GET", "GET"]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 406, 409, 422])
def test_client_errors_are_never_retried(faulty: tuple[str, Script], status: int) -> None:
    url, script = faulty
    script.answers = [(status, {})]
    assert make_session(FAST).get(url + "/x").status_code == status
    assert script.seen == ["GET"]


def test_retries_stop_after_the_limit(faulty: tuple[str, Script]) -> None:
    url, script = faulty
    script.answers = [(500, {})] * 10
    assert make_session(FAST).get(url + "/x").status_code == 500
    assert len(script.seen) == FAST.max_retries + 1


def test_connection_errors_retry_only_idempotent_calls() -> None:
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = make_session(RetryPolicy(max_retries=2, base_delay=0.001, max_delay=0.01, timeout=1))
    with pytest.raises(requests.ConnectionError):
        session.get(f"http://127.0.0.1:{port}/x")


def test_retry_after_parsing_and_backoff() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480.0 - 10) == pytest.approx(10.0)
    assert retry_after_seconds("garbage") is None
    assert retry_after_seconds("\u00b2") is None  # a digit to str.isdigit, not a number to float()
    policy = RetryPolicy(base_delay=1.0, max_delay=64.0)
    assert backoff_delay(1, policy, 7.0) == 7.0  # Retry-After wins
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 64.0)]:
        delay = backoff_delay(attempt, policy, None)
        assert base <= delay <= base * 1.1


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (406, RestrictionsNotSupportedError),
        (422, IntegrityError),
        (429, CatalogUnavailableError),
        (503, CatalogUnavailableError),
    ],
)
def test_error_mapping_is_typed_and_clear(faulty: tuple[str, Script], status: int, error: type) -> None:
    url, script = faulty
    script.answers = [(status, {})] * 10
    response = make_session(RetryPolicy(max_retries=0)).get(url + "/x")
    mapped = error_for_status(response, "table demo.db.t")
    assert isinstance(mapped, error)
    assert "demo.db.t" in str(mapped) and "injected" in str(mapped)
    if status == 406:
        assert "read-restrictions" in str(mapped)
    if status == 422:
        assert "not retried" in str(mapped)


def _dropping_server(drops: int) -> tuple[str, list[int], socket.socket]:
    """A loopback server that closes the first ``drops`` connections unanswered, then answers 200; it counts
    the connections it accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            with conn:
                conn.recv(65536)
                if len(accepted) > drops:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", accepted, listener


def test_a_dropped_first_attempt_is_retried_for_get_and_counts_as_attempt_one() -> None:
    url, accepted, listener = _dropping_server(drops=2)
    try:
        response = make_session(RetryPolicy(max_retries=2, base_delay=0.001, max_delay=0.01, timeout=5)).get(url)
        assert response.content == b"ok" and len(accepted) == 3  # two dropped, the last of three attempts answered
    finally:
        listener.close()


def test_a_dropped_post_is_not_retried() -> None:
    url, accepted, listener = _dropping_server(drops=1)
    try:
        with pytest.raises(requests.ConnectionError):
            make_session(RetryPolicy(max_retries=2, base_delay=0.001, max_delay=0.01, timeout=5)).post(url, data=b"{}")
        assert len(accepted) == 1
    finally:
        listener.close()


def test_dropped_attempts_stop_at_the_limit_with_the_first_one_counted() -> None:
    url, accepted, listener = _dropping_server(drops=10)
    try:
        with pytest.raises(requests.ConnectionError):
            make_session(RetryPolicy(max_retries=2, base_delay=0.001, max_delay=0.01, timeout=5)).get(url)
        assert len(accepted) == 3  # the first attempt and two retries, no more
    finally:
        listener.close()


def test_a_retried_answer_is_released_and_its_connection_reused() -> None:
    # A retried response must not stay open: unread, it holds its pooled connection until the garbage collector
    # finds it, and every retry opens a new one.
    answers = [(503, {"Retry-After": "0"}), (429, {}), (200, {})]
    peers: list[int] = []

    class KeepAlive(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            peers.append(self.client_address[1])
            status, headers = answers.pop(0)
            body = b'{"error":{"message":"retried","type":"X","code":%d}}' % status
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    session = make_session(FAST)
    try:
        response = session.get(f"http://127.0.0.1:{server.server_address[1]}/x")
        assert response.status_code == 200
    finally:
        session.close()
        server.shutdown()
        server.server_close()
    assert len(peers) == 3 and len(set(peers)) == 1, f"one connection for all three attempts, not {peers}"
