"""SQE's catalog retry policy end to end: a fault-injecting reverse proxy on loopback in front of the real catalog.

The proxy answers the first N matching requests itself (503 with or without ``Retry-After``, 429, 422) and
forwards everything else to sqe-catalog, counting what it received per method and path. SQE's session talks
only to the proxy. Faults carry ``Retry-After: 0`` where the rule allows it, so no test waits on a backoff.
"""

from __future__ import annotations

import http.client
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

import sqe.api
from sqe.catalog.base import LoadedTable
from sqe.errors import CatalogUnavailableError, CommitConflictError, CommitStateUnknownError, IntegrityError
from sqe.session import Session
from sqe.vocabulary import S3_ENDPOINT
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.helpers.fault_proxy import FaultProxy, running_proxy

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


@pytest.fixture(scope="module")
def proxy(catalog_server: CatalogServer) -> Iterator[FaultProxy]:
    with running_proxy(catalog_server.url) as proxy:
        yield proxy


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
    """A real scan: a bare ``SELECT count(*) FROM t`` is answered from manifest record counts instead."""
    [(count,)] = session.sql(f"SELECT count(*) FROM {table} WHERE true").fetchall()
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
    """Sent once, answered 503: whether it landed is unknown (this one did not), and the error says so."""
    before = row_count(session, table)
    proxy.inject("POST", table_path(table), 503, 1)
    with pytest.raises(CommitStateUnknownError, match=r"503.*it may have landed") as caught:
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


@dataclass
class _LosesACommitAnswer(FaultProxy):
    """Forwards the next commit to ``lose`` (a path pattern), then answers it ``status`` itself: the catalog
    applied it and the answer was lost (a 503 with ``Retry-After: 0``: SQE's transport sends the commit again)."""

    lose: str = ""
    status: int = 503

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        if request.command != "POST" or not self.lose or not re.search(self.lose, request.path):
            super().handle(request)
            return
        self.lose = ""
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        target = urlsplit(self.upstream)
        upstream = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=60)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in {"host", "connection"}}
        try:
            upstream.request("POST", request.path, body=body, headers=headers)
            assert upstream.getresponse().status == 200
        finally:
            upstream.close()
        retry_after = "0" if self.status == 503 else None
        self.answer(request, self.status, "the answer was lost", "ServiceUnavailableException", retry_after)


@contextmanager
def _losing_a_commit_answer(
    catalog_server: CatalogServer,
    writer: CatalogPrincipal,
    tmp_path: Path,
    lose: str,
    status: int,
    resent: int | None = None,
) -> Iterator[Session]:
    """A session whose next POST to the path pattern ``lose`` lands in the catalog and has its answer replaced by
    ``status`` (and every resend of it by ``resent``, when given); checks on leaving that it did."""
    proxy = _LosesACommitAnswer(catalog_server.url, status=status)
    proxy.start()
    try:
        path = write_sqe_config(tmp_path / "sqe.toml", proxy.url, writer, catalog_server.moto)
        with sqe.api.connect(path) as session:
            if resent is not None:
                proxy.inject("POST", lose, resent, 100, retry_after="0")
            proxy.lose = lose
            yield session
            assert not proxy.lose  # the commit went through the proxy, and its answer was lost
    finally:
        proxy.stop()


def _fresh_table(
    catalog_server: CatalogServer, writer: CatalogPrincipal, beside: str, tmp_path: Path, *statements: str
) -> tuple[str, Path]:
    """A new table in ``beside``'s namespace made by ``statements`` (``{t}``: its name), and a config that reaches
    the catalog directly."""
    name = f"{beside.split('.')[0]}.lost_{uuid.uuid4().hex[:6]}"
    direct = write_sqe_config(tmp_path / "direct.toml", catalog_server.url, writer, catalog_server.moto)
    with sqe.api.connect(direct) as session:
        for statement in statements:
            session.sql(statement.format(t=name))
    return name, direct


def _rows(config: Path, name: str) -> list[tuple[Any, ...]]:
    with sqe.api.connect(config) as session:
        return sorted(session.sql(f"SELECT n FROM {name}").fetchall())


def test_a_dml_commit_that_landed_keeps_its_files_when_its_answer_was_lost(
    catalog_server: CatalogServer, writer: CatalogPrincipal, table: str, tmp_path: Path
) -> None:
    # Found by review: a commit the catalog applied whose 503 answer SQE's transport retried gets a 409 (its
    # snapshot is already there), so the DML deleted the data files the table's current snapshot now references
    # (and pyiceberg its manifests): every later read of the table failed.
    create = "CREATE TABLE {t} AS SELECT * FROM (VALUES (1), (2), (3)) v(n)"
    name, direct = _fresh_table(catalog_server, writer, table, tmp_path, create)
    # No commit retries of pyiceberg's own (a legitimate table setting): its retry would find the snapshot.
    namespace, short = name.split(".")
    with pyiceberg_catalog(catalog_server, writer).load_table((namespace, short)).transaction() as transaction:
        transaction.set_properties({"commit.retry.num-retries": "0"})
    with _losing_a_commit_answer(catalog_server, writer, tmp_path, table_path(name), 503) as session:
        session.sql(f"DELETE FROM {name} WHERE n = 1")
    assert _rows(direct, name) == [(2,), (3,)]


@pytest.mark.parametrize(("answer", "resent"), [(502, None), (503, 429)], ids=["5xx", "resend-refused"])
def test_optimize_keeps_its_files_when_the_answer_to_its_landed_commit_was_lost(
    catalog_server: CatalogServer,
    writer: CatalogPrincipal,
    table: str,
    tmp_path: Path,
    answer: int,
    resent: int | None,
) -> None:
    # Found by review: OPTIMIZE deleted its new files on any catalog error, whose commit may well have landed: a
    # 502 (a proxy's answer to a commit the catalog applied), or once the transport has sent the commit again (a
    # 503 with Retry-After), a 429 from a rate limiter, since the last answer says nothing about the first send.
    # The table's current snapshot then named deleted files. Since the table's snapshot shows the commit landed,
    # OPTIMIZE also reports success (it was reported failed).
    statements = ("CREATE TABLE {t} AS SELECT * FROM (VALUES (1), (2)) v(n)", "INSERT INTO {t} VALUES (3)")
    name, direct = _fresh_table(catalog_server, writer, table, tmp_path, *statements)
    with _losing_a_commit_answer(catalog_server, writer, tmp_path, table_path(name), answer, resent=resent) as session:
        session.sql(f"OPTIMIZE {name}")
    assert _rows(direct, name) == [(1,), (2,), (3,)]  # the commit landed: its files are the table's


@pytest.mark.parametrize("answer", [502, 503], ids=["5xx", "resent-then-409"])
def test_a_create_table_as_whose_create_answer_was_lost_writes_its_rows(
    catalog_server: CatalogServer, writer: CatalogPrincipal, table: str, tmp_path: Path, answer: int
) -> None:
    # Found by review: the catalog created the table and its answer was lost (a 502; or a 503 the transport
    # resends, answered 409 "already exists"): CTAS failed and left an empty table behind under its name.
    namespace = table.split(".")[0]
    name = f"{namespace}.ctas_{uuid.uuid4().hex[:6]}"
    creates = rf"^/v1/wh/namespaces/{namespace}/tables(\?|$)"
    with _losing_a_commit_answer(catalog_server, writer, tmp_path, creates, answer) as session:
        counted = session.sql(f"CREATE TABLE {name} AS SELECT * FROM (VALUES (1), (2)) v(n)").fetchall()
    assert counted == [(2,)]
    direct = write_sqe_config(tmp_path / "direct.toml", catalog_server.url, writer, catalog_server.moto)
    assert _rows(direct, name) == [(1,), (2,)]


def test_a_create_table_as_over_anothers_table_still_fails_and_leaves_it(
    catalog_server: CatalogServer, writer: CatalogPrincipal, table: str, tmp_path: Path
) -> None:
    """The name was taken before the statement: a 409 is the answer, and the other table is left as it was."""
    create = "CREATE TABLE {t} AS SELECT * FROM (VALUES (5)) v(n)"
    name, direct = _fresh_table(catalog_server, writer, table, tmp_path, create)
    with sqe.api.connect(direct) as session, pytest.raises(CommitConflictError, match=name.split(".")[1]):
        session.sql(f"CREATE TABLE {name} AS SELECT * FROM (VALUES (6)) v(n)")
    assert _rows(direct, name) == [(5,)]


def test_a_commit_without_an_answer_is_of_unknown_outcome(
    proxy: FaultProxy, catalog_server: CatalogServer, writer: CatalogPrincipal, table: str, tmp_path: Path
) -> None:
    """The commit reached the catalog and its answer did not come in time: it may have landed (here it did)."""
    path = write_sqe_config(
        tmp_path / "sqe.toml", proxy.url, writer, catalog_server.moto, catalog={"request_timeout_seconds": 1.0}
    )
    with sqe.api.connect(path) as session:
        before = row_count(session, table)
        proxy.inject("POST", table_path(table), 0, 1, delay=3.0)  # forwarded after 3 s: the client gave up at 1 s
        with pytest.raises(CommitStateUnknownError, match=r"Timeout.*it may have landed"):
            session.sql(f"INSERT INTO {table} VALUES (400)")
        proxy.reset()
        deadline = time.monotonic() + 30
        while row_count(session, table) == before and time.monotonic() < deadline:
            time.sleep(0.1)  # the delayed commit reaches the catalog after the client gave up
        assert row_count(session, table) == before + 1
