"""``[catalog] metadata_revalidate_seconds``: the catalog round trip skipped while a cached entry is provably fresh.

A counting reverse proxy on loopback (``tests/helpers/fault_proxy.py``) sits in front of the real sqe-catalog;
SQE talks only to the proxy, so every load-table request SQE makes is counted. Real sleeps, no clock patching.
The same proxy delays one load-table to show that an interrupt during planning cancels the statement.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyiceberg.types import LongType

import sqe.api
from sqe.catalog.base import CacheOutcome
from sqe.errors import CommitConflictError
from sqe.execution.local import QueryCancelledError
from sqe.session import Session
from tests.conftest import catalog_variant, pyiceberg_catalog, write_sqe_config
from tests.helpers.fault_proxy import FaultProxy, running_proxy
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

INTERVAL = 4.0  # long enough for a second query on a busy machine, short enough to wait out once


def _table(server: CatalogServer, writer: CatalogPrincipal, workdir: Path) -> str:
    namespace = f"reval_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(server, writer).create_namespace(namespace)
    path = write_sqe_config(workdir / "direct.toml", server.url, writer, server.moto)
    with sqe.api.connect(path) as session:
        session.sql(f"CREATE TABLE {namespace}.t AS SELECT * FROM (VALUES (1), (2), (3)) v(n)")
    return f"{namespace}.t"


@pytest.fixture(scope="module")
def table(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> str:
    return _table(catalog_server, engine_writer, tmp_path_factory.mktemp("revalidation"))


@pytest.fixture()
def proxy(catalog_server: CatalogServer) -> Iterator[FaultProxy]:
    with running_proxy(catalog_server.url) as proxy:
        yield proxy


def open_session(
    proxy: FaultProxy, server: CatalogServer, writer: CatalogPrincipal, workdir: Path, **catalog: Any
) -> Session:
    path = write_sqe_config(workdir / "sqe.toml", proxy.url, writer, server.moto, catalog=catalog)
    return sqe.api.connect(path)


def loads(proxy: FaultProxy, table: str) -> int:
    namespace, name = table.split(".")
    return proxy.count("GET", rf"^/v1/wh/namespaces/{namespace}/tables/{name}(\?|$)")


def scan(session: Session, table: str) -> tuple[int, CacheOutcome]:
    """A real scan (a bare count(*) would come from manifests) and how its table entry was obtained."""
    [(count,)] = session.sql(f"SELECT count(*) FROM {table} WHERE true").fetchall()
    [stream] = session.last_streams
    return int(count), stream.plan.loaded.cache_outcome


def test_default_zero_revalidates_every_query(
    proxy: FaultProxy, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, table: str, tmp_path: Path
) -> None:
    with open_session(proxy, catalog_server, engine_writer, tmp_path) as session:
        assert scan(session, table) == (3, CacheOutcome.RELOADED)
        assert scan(session, table) == (3, CacheOutcome.REVALIDATED)
        assert loads(proxy, table) == 2  # the second query asked (If-None-Match, answered 304)


def test_within_the_interval_no_request_then_revalidated_after_it(
    proxy: FaultProxy, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, table: str, tmp_path: Path
) -> None:
    with open_session(proxy, catalog_server, engine_writer, tmp_path, metadata_revalidate_seconds=INTERVAL) as session:
        started = time.monotonic()
        assert scan(session, table) == (3, CacheOutcome.RELOADED)
        confirmed_by = time.monotonic()  # the entry's load request was sent between started and now
        second = scan(session, table)
        within = time.monotonic() - started < INTERVAL
        assert within, "the machine was too slow to run two tiny queries within the interval"
        assert second == (3, CacheOutcome.HIT)
        assert loads(proxy, table) == 1  # the second query made no catalog request at all
        time.sleep(max(0.0, INTERVAL - (time.monotonic() - confirmed_by)) + 0.1)
        assert scan(session, table) == (3, CacheOutcome.REVALIDATED)
        assert loads(proxy, table) == 2  # past the interval: asked again, answered 304
        assert scan(session, table) == (3, CacheOutcome.HIT)  # and the 304 starts a new interval
        assert loads(proxy, table) == 2


def test_own_write_drops_the_entry_even_within_the_interval(
    proxy: FaultProxy, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    table = _table(catalog_server, engine_writer, tmp_path)
    with open_session(proxy, catalog_server, engine_writer, tmp_path, metadata_revalidate_seconds=60) as session:
        assert scan(session, table) == (3, CacheOutcome.RELOADED)
        session.sql(f"INSERT INTO {table} VALUES (4)")
        assert scan(session, table) == (4, CacheOutcome.RELOADED)  # never the pre-commit entry
        session.sql(f"DELETE FROM {table} WHERE n = 1")
        assert scan(session, table) == (3, CacheOutcome.RELOADED)
        assert scan(session, table) == (3, CacheOutcome.HIT)


def test_a_failed_alter_drops_the_entry_too(
    proxy: FaultProxy, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    """An ALTER that loses a commit race proves the cached entry stale: the next query reloads it at once."""
    table = _table(catalog_server, engine_writer, tmp_path)
    with open_session(proxy, catalog_server, engine_writer, tmp_path, metadata_revalidate_seconds=60) as session:
        assert scan(session, table) == (3, CacheOutcome.RELOADED)
        with pyiceberg_catalog(catalog_server, engine_writer).load_table(table).update_schema() as update:
            update.add_column("elsewhere", LongType())  # committed behind the session's cached entry
        with pytest.raises(CommitConflictError):
            session.sql(f"ALTER TABLE {table} ADD COLUMN mine INTEGER")  # built on the cached, older schema
        assert scan(session, table) == (3, CacheOutcome.RELOADED)
        assert session.sql(f"SELECT * FROM {table}").arrow().column_names == ["n", "elsewhere"]


def test_credentials_near_their_usable_point_are_always_revalidated(
    moto_server: MotoServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """8-second vended credentials are usable for about 4 s: inside a 30 s interval, so never served unasked."""
    workdir = tmp_path_factory.mktemp("short-reval")
    with catalog_variant(
        workdir, moto_server, credential_lifetime_seconds=8, location="s3://warehouse/shortreval"
    ) as server:
        table = _table(server, server.admin, workdir)
        proxy = FaultProxy(server.url)
        proxy.start()
        try:
            with open_session(proxy, server, server.admin, workdir, metadata_revalidate_seconds=30) as session:
                assert scan(session, table) == (3, CacheOutcome.RELOADED)
                assert scan(session, table) == (3, CacheOutcome.REVALIDATED)
                assert loads(proxy, table) == 2
        finally:
            proxy.stop()


def test_interrupt_while_the_table_loads_cancels_the_statement(
    proxy: FaultProxy, catalog_server: CatalogServer, engine_writer: CatalogPrincipal, table: str, tmp_path: Path
) -> None:
    """Ctrl-C during planning (here a slow catalog; in the CLI also a first statement's lazy imports) is not lost:
    nothing runs in DuckDB yet, so the statement is cancelled as soon as planning ends, before it executes."""
    namespace, name = table.split(".")
    with open_session(proxy, catalog_server, engine_writer, tmp_path) as session:
        assert scan(session, table)[0] == 3  # client built, token fetched: only the next load is slow
        proxy.inject("GET", rf"^/v1/wh/namespaces/{namespace}/tables/{name}(\?|$)", 0, 1, delay=1.5)
        outcome: dict[str, BaseException] = {}

        def run() -> None:
            try:
                session.sql(f"SELECT count(*) FROM {table} WHERE true").fetchall()
            except BaseException as exc:
                outcome["error"] = exc

        asked = loads(proxy, table)
        worker = threading.Thread(target=run)
        worker.start()
        # Not a fixed wait: the thread may get to the load late.
        wait_until(lambda: loads(proxy, table) != asked, "the statement never asked for the table")
        session.interrupt()  # inside the delayed load-table
        worker.join(15)
        assert not worker.is_alive()
        assert isinstance(outcome.get("error"), QueryCancelledError)
        assert scan(session, table)[0] == 3  # the request does not outlive its statement
