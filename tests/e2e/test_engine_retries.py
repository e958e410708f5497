"""SQE's catalog retry policy end to end: a fault-injecting reverse proxy on loopback in front of the real catalog.

The proxy answers the first N matching requests itself (503 with or without ``Retry-After``, 429, 422) and
forwards everything else to sqe-catalog, counting what it received per method and path. SQE's session talks
only to the proxy. Faults carry ``Retry-After: 0`` where the rule allows it, so no test waits on a backoff.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

import sqe.api
from sqe.catalog.base import LoadedTable
from sqe.errors import CatalogUnavailableError, IntegrityError
from sqe.session import Session
from sqe.vocabulary import S3_ENDPOINT
from tests.conftest import pyiceberg_catalog, write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade"}
Rewrite = Callable[[str, str, dict[str, Any]], dict[str, Any]]


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    remaining: int
    retry_after: str | None = None


@dataclass
class FaultProxy:
    """A threading HTTP reverse proxy: injects queued faults, forwards the rest, counts every request."""

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    received: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request
    rewrite: Rewrite | None = None  # edits forwarded JSON bodies (a hostile catalog)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def inject(self, method: str, path: str, status: int, times: int, retry_after: str | None = None) -> None:
        with self.lock:
            self.faults.append(Fault(method, re.compile(path), status, times, retry_after))

    def count(self, method: str, path: str) -> int:
        pattern = re.compile(path)
        with self.lock:
            return sum(1 for m, p in self.received if m == method and pattern.search(p))

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.received.clear()
        self.rewrite = None

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.received.append((method, path))
            for fault in self.faults:
                if fault.remaining > 0 and fault.method == method and fault.path.search(path):
                    fault.remaining -= 1
                    return fault
        return None

    def start(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures anyway
                pass

            def do_GET(self) -> None:
                proxy.handle(self)

            do_POST = do_DELETE = do_HEAD = do_PUT = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        fault = self.take_fault(request.command, request.path)
        if fault is not None:
            self.answer_fault(request, fault)
        else:
            self.forward(request, body)

    @staticmethod
    def answer_fault(request: BaseHTTPRequestHandler, fault: Fault) -> None:
        payload = {"error": {"message": f"injected {fault.status}", "type": "InjectedFault", "code": fault.status}}
        data = json.dumps(payload).encode()
        request.send_response(fault.status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        if fault.retry_after is not None:
            request.send_header("Retry-After", fault.retry_after)
        request.end_headers()
        request.wfile.write(data)

    def forward(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        target = urlsplit(self.upstream)
        connection = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=60)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
        connection.request(request.command, request.path, body=body or None, headers=headers)
        response = connection.getresponse()
        data = response.read()
        connection.close()
        if self.rewrite is not None and data and "json" in (response.getheader("Content-Type") or ""):
            data = json.dumps(self.rewrite(request.command, request.path, json.loads(data))).encode()
        request.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                request.send_header(name, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(data)


@pytest.fixture(scope="module")
def proxy(catalog_server: CatalogServer) -> Iterator[FaultProxy]:
    proxy = FaultProxy(catalog_server.url)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture(autouse=True)
def clean_proxy(proxy: FaultProxy) -> Iterator[None]:
    proxy.reset()
    yield
    proxy.reset()


@pytest.fixture(scope="module")
def writer(engine_writer: CatalogPrincipal) -> CatalogPrincipal:
    return engine_writer


@pytest.fixture(scope="module")
def table(catalog_server: CatalogServer, writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory) -> str:
    namespace = f"retries_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(catalog_server, writer).create_namespace(namespace)
    path = write_sqe_config(
        tmp_path_factory.mktemp("retries") / "direct.toml", catalog_server.url, writer, catalog_server.moto
    )
    with sqe.api.connect(path) as session:
        session.sql(f"CREATE TABLE {namespace}.t AS SELECT * FROM (VALUES (1), (2), (3)) v(n)")
    return f"{namespace}.t"


@pytest.fixture()
def session(
    proxy: FaultProxy, catalog_server: CatalogServer, writer: CatalogPrincipal, tmp_path: Path
) -> Iterator[Session]:
    """A session whose catalog is the proxy; at most 3 retries."""
    path = write_sqe_config(tmp_path / "sqe.toml", proxy.url, writer, catalog_server.moto, catalog={"max_retries": 3})
    with sqe.api.connect(path) as session:
        yield session


def table_path(table: str) -> str:
    namespace, name = table.split(".")
    return rf"^/v1/wh/namespaces/{namespace}/tables/{name}(\?|$)"


def row_count(session: Session, table: str) -> int:
    [(count,)] = session.sql(f"SELECT count(*) FROM {table}").fetchall()
    return int(count)


@pytest.mark.parametrize(
    ("status", "retry_after"),
    [(503, "0"), (429, "0"), (429, None), (503, None)],
    ids=["503-retry-after", "429-retry-after", "429-bare", "503-bare-idempotent"],
)
def test_load_table_is_retried(
    proxy: FaultProxy, session: Session, table: str, status: int, retry_after: str | None
) -> None:
    times = 2 if retry_after is not None else 1  # a bare fault costs a real backoff (0.5 s): keep it to one
    proxy.inject("GET", table_path(table), status, times, retry_after)
    assert row_count(session, table) == 3
    assert proxy.count("GET", table_path(table)) == times + 1


def test_load_table_gives_up_after_max_retries_with_a_typed_error(
    proxy: FaultProxy, session: Session, table: str
) -> None:
    proxy.inject("GET", table_path(table), 503, 10, retry_after="0")
    with pytest.raises(CatalogUnavailableError, match="HTTP 503") as caught:
        session.sql(f"SELECT * FROM {table}")
    assert proxy.count("GET", table_path(table)) == 4  # one try plus catalog.max_retries = 3
    assert caught.value.status == 503 and "\n" not in str(caught.value)


def test_commit_503_without_retry_after_is_not_retried(proxy: FaultProxy, session: Session, table: str) -> None:
    before = row_count(session, table)
    proxy.inject("POST", table_path(table), 503, 1)
    with pytest.raises(CatalogUnavailableError, match="503") as caught:
        session.sql(f"INSERT INTO {table} VALUES (100)")
    assert proxy.count("POST", table_path(table)) == 1  # a commit is not idempotent: one attempt only
    assert caught.value.status == 503
    assert row_count(session, table) == before


def test_commit_is_retried_after_429_and_503_with_retry_after(proxy: FaultProxy, session: Session, table: str) -> None:
    before = row_count(session, table)
    proxy.inject("POST", table_path(table), 429, 1, retry_after="0")
    proxy.inject("POST", table_path(table), 503, 1, retry_after="0")
    session.sql(f"INSERT INTO {table} VALUES (200)")
    assert proxy.count("POST", table_path(table)) == 3
    assert row_count(session, table) == before + 1


def test_422_is_an_integrity_error_and_never_retried(proxy: FaultProxy, session: Session, table: str) -> None:
    before = row_count(session, table)
    proxy.inject("POST", table_path(table), 422, 5)
    with pytest.raises(IntegrityError, match="422") as caught:
        session.sql(f"INSERT INTO {table} VALUES (300)")
    assert proxy.count("POST", table_path(table)) == 1
    assert caught.value.status == 422
    loads = proxy.count("GET", table_path(table))
    proxy.inject("GET", table_path(table), 422, 5)
    with pytest.raises(IntegrityError, match="not retried"):
        session.sql(f"SELECT * FROM {table}")
    assert proxy.count("GET", table_path(table)) == loads + 1
    proxy.reset()
    assert row_count(session, table) == before


def test_hostile_catalog_response_cannot_choose_fileio_or_endpoint(
    proxy: FaultProxy, session: Session, table: str
) -> None:
    """A catalog (here: the proxy) that puts py-io-impl and friends into the load-table response config and
    the table properties: SQE's allowlist drops them all, and its own endpoint wins."""
    hostile = {
        "py-io-impl": "sqe_no_such_module.EvilFileIO",
        "s3.retry-strategy-impl": "sqe_no_such_module.EvilRetryStrategy",
        "s3.proxy-uri": "http://127.0.0.1:9",
        "s3.signer.uri": "http://127.0.0.1:9",
    }

    def poison(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "GET" and re.search(table_path(table), path) and "metadata" in body:
            body["config"] = {**body.get("config", {}), **hostile, "s3.endpoint": "http://127.0.0.1:9"}
            body["metadata"]["properties"] = {**body["metadata"].get("properties", {}), **hostile}
        return body

    proxy.rewrite = poison
    assert row_count(session, table) >= 3
    [stream] = session.last_streams
    loaded: LoadedTable = stream.plan.loaded
    assert loaded.raw["config"]["py-io-impl"] == hostile["py-io-impl"]  # SQE really received the poison
    assert loaded.table.properties["py-io-impl"] == hostile["py-io-impl"]
    data_file = next(iter(loaded.table.scan().plan_files())).file.file_path
    properties = loaded.io.resolve(data_file).properties  # type: ignore[attr-defined]
    assert not set(properties) & set(hostile)
    assert properties[S3_ENDPOINT] != "http://127.0.0.1:9"  # [storage] endpoint wins over the catalog's
