"""Signed reads through the quick-acknowledging connections, against a loopback store that writes like RGW.

The store below answers on kept-alive HTTP/1.1 connections and, as Ceph RGW's beast front end does without
``tcp_nodelay=1``, writes each response's head and body in two ``send`` calls with Nagle's algorithm on. What
the connections change is timing (measured by ``bench/vs_duckdb.py --store ceph``, never asserted here); these
tests hold what must not change with them: the bytes, the ranges, the status handling and connection reuse.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from types import MappingProxyType

import pytest

from sqe.credentials import ResolvedCredentials, parse_settings
from sqe.credentials._quick_ack import POOL_CLASSES
from sqe.credentials.signed_reads import _pool, close_pool, signed_object
from sqe.vocabulary import S3_ACCESS_KEY_ID, S3_ENDPOINT, S3_REGION, S3_SECRET_ACCESS_KEY

OBJECT = bytes(range(256)) * 40  # 10,240 bytes: one small body, as a manifest's


class SplitWritesStore(socketserver.ThreadingTCPServer):
    """GET /b/k answers OBJECT (or a ``Range``), anything else 404; head and body go out in separate sends."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.requests: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(socketserver.StreamRequestHandler):
    server: SplitWritesStore

    def handle(self) -> None:
        self.server.connections += 1
        while True:
            request_line = self.rfile.readline().decode("latin-1").strip()
            if not request_line:
                return  # the client closed its kept-alive connection
            headers = {}
            for line in iter(self.rfile.readline, b"\r\n"):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            self.server.requests.append(request_line)
            status, body = self._answer(request_line, headers.get("range"))
            head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
            self.connection.sendall(head.encode("latin-1"))
            self.connection.sendall(body)

    @staticmethod
    def _answer(request_line: str, byte_range: str | None) -> tuple[str, bytes]:
        if request_line.split()[1] != "/b/k":
            return "404 Not Found", b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"
        if byte_range is None:
            return "200 OK", OBJECT
        first, last = (int(part) for part in byte_range.removeprefix("bytes=").split("-"))
        return "206 Partial Content", OBJECT[first : last + 1]


@pytest.fixture
def store() -> Iterator[SplitWritesStore]:
    server = SplitWritesStore()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    close_pool()  # a pool of this test's own: its connection count is the store's
    try:
        yield server
    finally:
        close_pool()
        server.shutdown()
        server.server_close()


def credentials(endpoint: str) -> ResolvedCredentials:
    properties = {S3_ENDPOINT: endpoint, S3_REGION: "us-east-1", S3_ACCESS_KEY_ID: "AK", S3_SECRET_ACCESS_KEY: "SK"}
    return ResolvedCredentials(
        MappingProxyType(properties), "vended", None, None, parse_settings(properties, "test properties")
    )


def test_the_process_pool_uses_the_quick_acknowledging_connections() -> None:
    close_pool()
    try:
        assert _pool().pool_classes_by_scheme == POOL_CLASSES
    finally:
        close_pool()


def test_whole_and_ranged_reads_return_the_stored_bytes_over_one_kept_connection(store: SplitWritesStore) -> None:
    found = signed_object("s3://b/k", credentials(store.endpoint))
    assert found is not None
    assert found.read_all() == OBJECT
    assert found.read_at(100, 5_000) == OBJECT[5_000:5_100]
    assert found.read_at(1, len(OBJECT) - 1) == OBJECT[-1:]
    assert found.read_all() == OBJECT
    assert len(store.requests) == 4
    assert store.connections == 1  # the connection stays alive between reads


def test_a_missing_object_is_still_the_typed_error(store: SplitWritesStore) -> None:
    missing = signed_object("s3://b/gone", credentials(store.endpoint))
    assert missing is not None
    with pytest.raises(FileNotFoundError, match="HTTP 404 NoSuchKey: gone"):
        missing.read_all()
