"""Signed S3 reads against the real moto server: the same bytes and errors as pyarrow's path, without its HEAD.

Objects are written with the catalog's IAM key (the session's static key) and read back both through
:mod:`sqe.credentials.signed_reads` and through pyiceberg's pyarrow FileIO built from the same properties.
Requests are counted from moto's own request log; 5xx answers and stalls come from the fault-injecting proxy in
front of moto (``tests/helpers/fault_proxy.py``).
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO

from sqe.credentials import ResolvedCredentials, parse_settings
from sqe.credentials.pool import FILE_IOS, MIN_HOLD_SECONDS
from sqe.credentials.signed_reads import POOL_CONNECTIONS_PER_HOST, SignedObject, signed_object
from sqe.execution.cache import clear_process_caches
from sqe.vocabulary import (
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT,
    S3_FORCE_VIRTUAL_ADDRESSING,
    S3_REGION,
    S3_REQUEST_TIMEOUT,
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
)
from tests.e2e.test_engine_footer_cache import MotoLog
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import MotoServer

pytestmark = [pytest.mark.e2e]

CONTENT = bytes(range(256)) * 64 + b"tail"  # 16,388 bytes
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD) (/\S+/signed-reads/\S+) HTTP')


def properties(moto: MotoServer, **overrides: str) -> dict[str, str]:
    """FileIO properties as SQE resolves them for moto: endpoint, region, path style, the key pair."""
    base = {
        S3_ENDPOINT: moto.url,
        S3_REGION: moto.region,
        S3_FORCE_VIRTUAL_ADDRESSING: "false",
        S3_ACCESS_KEY_ID: moto.access_key_id,
        S3_SECRET_ACCESS_KEY: moto.secret_access_key,
    }
    return {**base, **overrides}


@pytest.fixture(scope="module")
def stored(moto_server: MotoServer) -> str:
    """An object with an awkward key (spaces, unicode, reserved characters), as ``s3://bucket/key``."""
    key = f"signed-reads/{uuid.uuid4().hex}/part one=ä+b&c~.parquet"
    moto_server.client("s3").put_object(Bucket=moto_server.bucket, Key=key, Body=CONTENT)
    return f"s3://{moto_server.bucket}/{key}"


def reader(location: str, props: dict[str, str]) -> SignedObject:
    """A signed reader of the resolved set these properties stand for (settings parsed by the one parser)."""
    scope = ResolvedCredentials(MappingProxyType(props), "vended", None, None, parse_settings(props, "properties"))
    found = signed_object(location, scope)
    assert found is not None
    return found


def requests_since(log: MotoLog) -> list[tuple[str, str]]:
    log.data_requests()  # waits for the server to write its last lines
    with log.path.open("rb") as fh:
        fh.seek(log._offset)
        return _REQUEST.findall(fh.read().decode("utf-8", "replace"))


def pyarrow_read(location: str, props: dict[str, str]) -> bytes:
    with PyArrowFileIO(properties=props).new_input(location).open(seekable=False) as stream:
        data: bytes = stream.read()
    return data


@pytest.mark.parametrize("path_style", ["false", None], ids=["path-style", "endpoint-default"])
def test_whole_and_ranged_reads_match_pyarrow_with_one_get_each_and_no_head(
    moto_server: MotoServer, stored: str, path_style: str | None
) -> None:
    props = properties(moto_server)
    if path_style is None:  # no addressing property: pyarrow addresses an endpoint path style
        del props[S3_FORCE_VIRTUAL_ADDRESSING]
    log = MotoLog(moto_server.pid)
    log.mark()
    expected = pyarrow_read(stored, props)
    assert expected == CONTENT
    through_pyarrow = requests_since(log)
    assert [method for method, _ in through_pyarrow] == ["HEAD", "GET"]

    log.mark()
    signed = reader(stored, props)
    assert signed.read_all() == CONTENT
    assert signed.read_at(100, 16_000) == CONTENT[16_000:16_100]
    assert signed.read_at(4, len(CONTENT) - 4) == b"tail"
    assert signed.read_at(0, 5) == b""  # nothing asked, nothing sent
    sent = requests_since(log)
    assert [method for method, _ in sent] == ["GET", "GET", "GET"]
    assert {path for _, path in sent} == {through_pyarrow[1][1]}  # the very object pyarrow addressed


def test_session_tokens_sign_the_request_and_never_reach_a_log(
    moto_server: MotoServer, stored: str, caplog: pytest.LogCaptureFixture
) -> None:
    assumed = moto_server.client("sts").assume_role(RoleArn=moto_server.role_arn, RoleSessionName="signed-reads")
    keys = assumed["Credentials"]
    props = properties(
        moto_server,
        **{
            S3_ACCESS_KEY_ID: keys["AccessKeyId"],
            S3_SECRET_ACCESS_KEY: keys["SecretAccessKey"],
            S3_SESSION_TOKEN: keys["SessionToken"],
        },
    )
    caplog.set_level(logging.DEBUG)  # from here: the test's own STS call logged the token it got
    signed = reader(stored, props)
    assert signed.read_at(10, 0) == CONTENT[:10] == pyarrow_read(stored, props)[:10]
    assert signed.read_all() == CONTENT
    assert caplog.records  # DEBUG logging really was on (urllib3, pyiceberg)
    assert keys["SessionToken"] not in caplog.text and keys["SecretAccessKey"] not in caplog.text
    # botocore's own clients still log their signing at DEBUG: only this module's records are dropped.
    caplog.clear()
    # The catalog caps botocore at INFO when it has run in this process (earlier tests): ask for its DEBUG here.
    caplog.set_level(logging.DEBUG, logger="botocore")
    moto_server.client("s3").head_bucket(Bucket=moto_server.bucket)
    assert "CanonicalRequest" in caplog.text


def test_a_missing_object_is_file_not_found_as_on_the_pyarrow_path(moto_server: MotoServer, stored: str) -> None:
    props = properties(moto_server)
    missing = stored.replace(".parquet", "-gone.parquet")
    with pytest.raises(FileNotFoundError):
        pyarrow_read(missing, props)
    with pytest.raises(FileNotFoundError) as whole:
        reader(missing, props).read_all()
    with pytest.raises(FileNotFoundError) as ranged:
        reader(missing, props).read_at(10, 0)
    for failure in (whole, ranged):
        assert "HTTP 404 NoSuchKey" in str(failure.value) and "-gone.parquet" in str(failure.value)
        assert "\n" not in str(failure.value)


@pytest.mark.parametrize(
    "override",
    [
        {S3_SECRET_ACCESS_KEY: "wrong-secret-" + "x" * 28},  # a known key signed with the wrong secret
        {S3_ACCESS_KEY_ID: "AKIAIOSFODNN7UNKNOWN", S3_SECRET_ACCESS_KEY: "unknown-secret-" + "y" * 25},
    ],
    ids=["wrong-secret", "unknown-key"],
)
def test_refused_keys_are_permission_errors_naming_no_secret(
    moto_server: MotoServer, stored: str, override: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    props = properties(moto_server, **override)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(OSError) as through_pyarrow:
        pyarrow_read(stored, props)
    assert not isinstance(through_pyarrow.value, FileNotFoundError)  # refused, not missing, on both paths
    signed = reader(stored, props)
    for read in (signed.read_all, lambda: signed.read_at(10, 0)):
        with pytest.raises(PermissionError) as failure:
            read()
        assert "HTTP 403" in str(failure.value) and "\n" not in str(failure.value)
    shown = str(failure.value) + repr(signed) + caplog.text
    assert props[S3_SECRET_ACCESS_KEY] not in shown and moto_server.secret_access_key not in shown
    with pytest.raises(TypeError):
        pickle.dumps(signed)


@pytest.fixture()
def proxy(moto_server: MotoServer) -> Iterator[FaultProxy]:
    """The fault proxy in front of moto. It forwards with its own Host, so a forwarded signed read would not
    verify: tests use it only for answers it makes itself (5xx) and for stalls."""
    running = FaultProxy(moto_server.url)
    running.start()
    yield running
    running.stop()


def test_5xx_answers_are_retried_then_typed_as_os_errors(
    moto_server: MotoServer, stored: str, proxy: FaultProxy
) -> None:
    props = properties(moto_server, **{S3_ENDPOINT: proxy.url})
    proxy.inject("GET", "signed-reads", 503, times=10)
    with pytest.raises(OSError) as failure:
        reader(stored, props).read_at(10, 0)
    assert not isinstance(failure.value, (FileNotFoundError, PermissionError))
    assert "HTTP 503" in str(failure.value)
    assert proxy.count("GET", "signed-reads") == 3  # three attempts, as pyarrow's S3 client makes


class _FlakyStore(BaseHTTPRequestHandler):
    """A loopback store that answers 503 (``Retry-After: 0``) to the first ``failures`` GETs, then serves
    CONTENT's requested range; it records every request's headers."""

    failures = 0
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers.items()))
        if len(type(self).seen) <= type(self).failures:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, last = (int(n) for n in self.headers["Range"].removeprefix("bytes=").split("-"))
        body = CONTENT[first : last + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture()
def flaky_store() -> Iterator[str]:
    _FlakyStore.failures, _FlakyStore.seen = 2, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyStore)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_transient_503_is_retried_until_the_store_answers(moto_server: MotoServer, flaky_store: str) -> None:
    props = properties(moto_server, **{S3_ENDPOINT: flaky_store, S3_SESSION_TOKEN: "token-" + "t" * 30})
    assert reader("s3://bucket/some/key.parquet", props).read_at(16, 256) == CONTENT[256:272]
    assert len(_FlakyStore.seen) == 3
    sent = _FlakyStore.seen[-1]
    assert sent["Host"] == flaky_store.removeprefix("http://")  # path style on the endpoint
    assert sent["Range"] == "bytes=256-271" and sent["X-Amz-Security-Token"] == props[S3_SESSION_TOKEN]
    assert sent["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={moto_server.access_key_id}/")


def test_a_stalled_store_times_out_as_an_os_error(moto_server: MotoServer, stored: str, proxy: FaultProxy) -> None:
    props = properties(moto_server, **{S3_ENDPOINT: proxy.url, S3_REQUEST_TIMEOUT: "0.2"})
    proxy.inject("GET", "signed-reads", 0, times=10, delay=1.0)
    with pytest.raises(OSError) as failure:
        reader(stored, props).read_all()
    assert "after retries" in str(failure.value) and "Timeout" in str(failure.value)
    # The client gave up on the last attempt without an answer: the proxy's handler may not have recorded it yet.
    wait_until(lambda: proxy.count("GET", "signed-reads") >= 3, "the proxy never recorded a third attempt")
    assert proxy.count("GET", "signed-reads") == 3


def test_only_the_store_error_code_and_message_are_shown(moto_server: MotoServer, stored: str) -> None:
    """moto's SignatureDoesNotMatch document echoes the string to sign; the error shows only Code and Message."""
    props = properties(moto_server, **{S3_SECRET_ACCESS_KEY: "another-wrong-secret-" + "z" * 19})
    with pytest.raises(PermissionError) as failure:
        reader(stored, props).read_all()
    text = str(failure.value)
    assert "StringToSign" not in text and "AWS4-HMAC-SHA256" not in text and "Signature" in text


class _SlowStore(BaseHTTPRequestHandler):
    """Serves CONTENT's requested range after a short pause, recording the most requests in flight at once."""

    protocol_version = "HTTP/1.1"  # keep-alive, as S3 and moto speak
    lock = threading.Lock()
    in_flight = 0
    most = 0

    def do_GET(self) -> None:
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
        time.sleep(0.05)
        first, last = (int(n) for n in self.headers["Range"].removeprefix("bytes=").split("-"))
        body = CONTENT[first : last + 1]
        with cls.lock:
            cls.in_flight -= 1
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_connections_per_host_are_bounded(moto_server: MotoServer) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowStore)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        props = properties(moto_server, **{S3_ENDPOINT: f"http://127.0.0.1:{server.server_address[1]}"})
        signed = reader("s3://bucket/k.parquet", props)
        readers = POOL_CONNECTIONS_PER_HOST * 2
        with ThreadPoolExecutor(readers) as pool:
            got = list(pool.map(lambda i: signed.read_at(8, i), range(readers)))
    finally:
        server.shutdown()
        server.server_close()
    assert got == [CONTENT[i : i + 8] for i in range(readers)]
    assert 1 < _SlowStore.most <= POOL_CONNECTIONS_PER_HOST


def sockets_to(port: int) -> int:
    """This process's open TCP sockets whose peer port is ``port`` (its descriptors' inodes in /proc/self/net/tcp)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
            count += 1
    return count


def test_kept_connections_close_once_the_last_credential_set_is_released(moto_server: MotoServer) -> None:
    """The pool's kept-alive sockets to the store outlive no credential set: once the process's last set is
    released at its expiry, they close, as the released sets' filesystems' do (the soak bounds them on Ceph,
    which keeps connections alive; moto closes its own)."""
    clear_process_caches()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowStore)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        props = properties(moto_server, **{S3_ENDPOINT: f"http://127.0.0.1:{port}"})
        FILE_IOS.file_io("one-short-set", props, expires_at=time.time() + 0.5)  # released on time by the pool
        assert reader("s3://bucket/k.parquet", props).read_at(8, 0) == CONTENT[:8]
        assert sockets_to(port) == 1, "the connection was not kept alive: this test would prove nothing"
        deadline = time.monotonic() + MIN_HOLD_SECONDS + 10
        while len(FILE_IOS) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(FILE_IOS) == 0
        assert sockets_to(port) == 0
    finally:
        server.shutdown()
        server.server_close()


class _LimitStore(BaseHTTPRequestHandler):
    """Serves the body the path names (``/b/<size>-<framing>``): ``length`` with a Content-Length, ``chunked``
    in 7-byte chunks, ``close`` delimited by closing the connection. Records each new connection."""

    protocol_version = "HTTP/1.1"
    connections: list[int] = []

    def setup(self) -> None:
        super().setup()
        type(self).connections.append(id(self))

    def do_GET(self) -> None:
        size, framing = self.path.rsplit("/", 1)[1].split("-")
        body = bytes(i % 251 for i in range(int(size)))
        self.send_response(200)
        if framing == "length":
            self.send_header("Content-Length", str(len(body)))
        elif framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        if framing == "chunked":
            for start in range(0, len(body), 7):
                chunk = body[start : start + 7]
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.wfile.write(body)
        if framing == "close":
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture()
def limit_store() -> Iterator[str]:
    _LimitStore.connections = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LimitStore)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_a_limited_read_returns_at_most_the_limit_and_reuses_only_a_fully_read_connection(
    moto_server: MotoServer, limit_store: str, framing: str
) -> None:
    from sqe.credentials.signed_reads import close_pool

    close_pool()  # a fresh pool: connections are counted from here
    props = properties(moto_server, **{S3_ENDPOINT: limit_store})
    limit = 1000
    full = bytes(i % 251 for i in range(limit + 1))
    assert reader(f"s3://b/{limit}-{framing}", props).read_all(limit=limit) == full[:limit]  # exactly the limit
    assert reader(f"s3://b/{limit - 1}-{framing}", props).read_all(limit=limit) == full[: limit - 1]
    reused = 1 if framing != "close" else 2  # read to its end: the same connection serves the next request
    assert len(_LimitStore.connections) == reused
    for size in (limit + 1, 100 * limit):  # one byte more, then much more
        assert reader(f"s3://b/{size}-{framing}", props).read_all(limit=limit) == full[:limit]  # cut short
        assert reader(f"s3://b/{limit}-{framing}", props).read_all(limit=limit) == full[:limit]  # not a leftover
    assert len(_LimitStore.connections) >= reused + (1 if framing != "close" else 4)  # a cut one is closed
    assert reader(f"s3://b/0-{framing}", props).read_all(limit=limit) == b""
    close_pool()
