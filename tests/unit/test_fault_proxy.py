"""The fault proxy's own counting, which tests of concurrent reads assert on: what it calls "in flight at once"
must be only requests received since the last reset."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.waiting import wait_until


class _Ok(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    running = FaultProxy(f"http://127.0.0.1:{upstream.server_address[1]}")
    running.start()
    yield running
    running.stop()
    upstream.shutdown()
    upstream.server_close()


def _get(proxy: FaultProxy, path: str) -> bytes:
    with urllib.request.urlopen(proxy.url + path, timeout=30) as answer:
        body: bytes = answer.read()
        return body


def _settles(proxy: FaultProxy) -> None:
    """Wait until no request is counted in flight: a handler lowers the count just after its answer is sent, so
    right after a client returns it may still be counted."""
    wait_until(lambda: proxy.in_flight == 0, "requests stay counted in flight (or the count went below zero)")


def test_a_request_received_before_a_reset_is_not_counted_in_flight_after_it(proxy: FaultProxy) -> None:
    proxy.inject("GET", "^/slow$", 0, 1, delay=0.5)
    slow = threading.Thread(target=_get, args=(proxy, "/slow"))
    slow.start()
    wait_until(lambda: proxy.in_flight == 1, "the slow request never reached the proxy")
    proxy.reset()
    assert _get(proxy, "/fast") == b"ok"
    assert proxy.max_in_flight == 1
    slow.join()
    _settles(proxy)  # the slow request ending does not lower the new count below zero
    assert _get(proxy, "/after") == b"ok"
    assert proxy.max_in_flight == 1
    _settles(proxy)
