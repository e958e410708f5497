"""Fingerprints of stored metadata files: local files by content, unknown schemes and missing files give None."""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sqe_catalog.config import WarehouseConfig
from sqe_catalog.integrity.fingerprint import storage_fingerprint


def test_a_local_file_is_fingerprinted_by_its_bytes(tmp_path: Path) -> None:
    fingerprint = storage_fingerprint(WarehouseConfig(name="w", location=f"file://{tmp_path}"))
    path = tmp_path / "v1.metadata.json"
    path.write_text('{"a": 1}')
    first = fingerprint(f"file://{path}")
    assert first is not None and fingerprint(f"file://{path}") == first
    path.write_text('{"a": 2}')  # same size, written at once
    assert fingerprint(f"file://{path}") not in (None, first)


def test_no_fingerprint_for_a_missing_file_or_another_scheme(tmp_path: Path) -> None:
    fingerprint = storage_fingerprint(WarehouseConfig(name="w", location=f"file://{tmp_path}"))
    assert fingerprint(f"file://{tmp_path}/missing.metadata.json") is None
    assert fingerprint("gs://bucket/t/v1.metadata.json") is None


def _s3_warehouse(endpoint: str) -> WarehouseConfig:
    return WarehouseConfig(
        name="w",
        location="s3://bucket/wh",
        endpoint=endpoint,
        access_key_id="AKIDFINGERPRINTTEST",
        secret_access_key="fingerprint-test-secret",  # type: ignore[arg-type]  # pydantic coerces to SecretStr
    )


def test_an_unreachable_store_or_an_unaddressable_location_gives_no_fingerprint() -> None:
    with socket.socket() as probe:  # a loopback port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    fingerprint = storage_fingerprint(_s3_warehouse(f"http://127.0.0.1:{port}"))
    assert fingerprint("s3://bucket/wh/t/v1.metadata.json") is None
    assert fingerprint("s3://bucket/wh/t/v1.metadata.json?versionId=1") is None  # not addressed: the file is read


def test_a_store_answering_an_error_gives_no_fingerprint_and_the_request_is_signed() -> None:
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            seen.append((self.path, self.headers.get("Authorization", "")))
            self.send_response(403)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        fingerprint = storage_fingerprint(_s3_warehouse(f"http://127.0.0.1:{server.server_address[1]}"))
        assert fingerprint("s3://bucket/wh/t/v1.metadata.json") is None
    finally:
        server.shutdown()
        server.server_close()
    [(path, authorization)] = seen
    assert path == "/bucket/wh/t/v1.metadata.json"  # path style, as configured
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDFINGERPRINTTEST/")
    assert "fingerprint-test-secret" not in authorization


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    return server


def test_a_redirect_is_never_followed_so_no_session_token_reaches_another_server(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # botocore never follows a redirect; a signed HEAD that did would hand the session token (not stripped like
    # Authorization) to whatever host the store names.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDREDIRECTTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "redirect-test-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "redirect-test-session-token")
    elsewhere: list[dict[str, str]] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            elsewhere.append(dict(self.headers.items()))
            self.send_response(200)
            for name, value in (("ETag", '"e"'), ("Last-Modified", "Tue, 01 Dec 2026 00:00:00 GMT")):
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    other = _serve(Elsewhere)

    class Redirecting(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{other.server_address[1]}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    store = _serve(Redirecting)
    try:
        warehouse = WarehouseConfig(
            name="w", location="s3://bucket/wh", endpoint=f"http://127.0.0.1:{store.server_address[1]}"
        )
        with caplog.at_level(logging.DEBUG):
            assert storage_fingerprint(warehouse)("s3://bucket/wh/t/v1.metadata.json") is None, "no fingerprint: read"
    finally:
        for server in (store, other):
            server.shutdown()
            server.server_close()
    assert elsewhere == [], "nothing was sent to the redirect's target"
    assert caplog.records, "the HEAD was logged at DEBUG"
    for secret in ("redirect-test-secret", "redirect-test-session-token", "Signature="):
        assert secret not in caplog.text
