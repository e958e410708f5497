"""Credential expiry and the metadata cache, against a catalog vending 12-second credentials.

A 12 s token is "short" (< 10 min), so SQE uses it for half its remaining lifetime: about 6 s. Within that
window a second load is revalidated with ``If-None-Match`` (304, same credentials); after it the next load is a
full load with new credentials, and a prepared statement re-plans. Real sleeps, no clock patching. (moto does
not refuse expired session tokens; the Ceph tier shows that expired keys really die.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import sqe.api
from sqe.catalog.base import CacheOutcome, LoadedTable, TableIdent
from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.session import Session
from sqe.vocabulary import S3_ACCESS_KEY_ID
from tests.conftest import catalog_variant, pyiceberg_catalog, write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

LIFETIME_SECONDS = 12  # usable for ~6 s: room for a few queries on a busy machine, then one short sleep
QUERY = "SELECT count(*) AS n, sum(id) AS total FROM ns.events"
EXPECTED = [(5, 15)]


@pytest.fixture(scope="module")
def short_catalog(tmp_path_factory: pytest.TempPathFactory, moto_server: MotoServer) -> Iterator[CatalogServer]:
    workdir = tmp_path_factory.mktemp("short-lived-catalog")
    with catalog_variant(
        workdir, moto_server, credential_lifetime_seconds=LIFETIME_SECONDS, location="s3://warehouse/shortlived"
    ) as server:
        yield server


@pytest.fixture(scope="module")
def events(short_catalog: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """ns.events with two data files (CTAS, then INSERT), written by the admin through vended credentials."""
    owner = short_catalog.admin  # holds every privilege (saves slow admin calls)
    pyiceberg_catalog(short_catalog, owner).create_namespace("ns")
    with open_session(tmp_path_factory.mktemp("owner"), short_catalog, owner) as session:
        session.sql("CREATE TABLE ns.events AS SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) v(id, tag)")
        session.sql("INSERT INTO ns.events VALUES (4, 'd'), (5, 'e')")
    return "ns.events"


@pytest.fixture(scope="module")
def readers(short_catalog: CatalogServer) -> tuple[CatalogPrincipal, CatalogPrincipal]:
    """Two principals holding the same role, hence the same grants (and the same table ETags)."""
    grants: list[tuple[str, str | None, str | None]] = [
        ("TABLE_READ_DATA", "ns", None),
        ("NAMESPACE_READ_PROPERTIES", None, None),
    ]
    alice = short_catalog.principal_with_grants("alice", grants)
    bob = short_catalog.create_principal("bob")
    short_catalog.admin_cli("assign-role", "bob", "alice_role")
    return alice, bob


def open_session(workdir: Path, server: CatalogServer, principal: CatalogPrincipal) -> Session:
    path = write_sqe_config(workdir / f"{principal.name}.toml", server.url, principal, server.moto)
    return sqe.api.connect(path)


def explain(session: Session) -> dict[str, Any]:
    [row] = session.explain_tables(QUERY).to_pylist()
    return dict(row)


def query(session: Session) -> LoadedTable:
    """Run QUERY, check its rows, return the table it scanned."""
    assert session.sql(QUERY).fetchall() == EXPECTED
    [stream] = session.last_streams
    return stream.plan.loaded


def access_key(loaded: LoadedTable) -> str:
    return str(loaded.io.resolve(loaded.table.location()).properties[S3_ACCESS_KEY_ID])  # type: ignore[attr-defined]


def sleep_until(epoch: float) -> None:
    time.sleep(max(0.0, epoch - time.time()))


def test_revalidates_while_usable_reloads_after_and_prepared_statement_follows(
    short_catalog: CatalogServer, events: str, readers: tuple[CatalogPrincipal, CatalogPrincipal], tmp_path: Path
) -> None:
    with open_session(tmp_path, short_catalog, readers[0]) as session:
        first = query(session)
        assert first.cache_outcome is CacheOutcome.RELOADED and first.credential_source == "vended"
        assert first.expires_at is not None and first.usable_until is not None
        # Short token: usable for half of what was left when it arrived (a few seconds), not until 5 min before.
        received = first.io.received_at  # type: ignore[attr-defined]
        assert first.usable_until == pytest.approx(received + (first.expires_at - received) / 2)
        assert first.usable_until - received < LIFETIME_SECONDS / 2 + 0.5
        assert explain(session)["cache"] == "304"
        prepared = session.prepare(QUERY)
        [planned] = prepared.tables.values()
        assert planned.cache_outcome is CacheOutcome.REVALIDATED and access_key(planned) == access_key(first)
        assert prepared.execute().fetchall() == EXPECTED
        assert time.time() < first.usable_until, "the machine was too slow to stay inside the usable window"

        sleep_until(first.usable_until + 0.2)
        after = explain(session)
        assert after["cache"] == "reload"  # never a 304 past the usable point: that would hand back dead keys
        assert after["credential_usable_until"] > explain_time(first)
        fresh = query(session)
        assert access_key(fresh) != access_key(first)
        assert prepared.execute().fetchall() == EXPECTED
        [replanned] = prepared.tables.values()
        assert access_key(replanned) == access_key(fresh) and replanned.is_usable(time.time())


def explain_time(loaded: LoadedTable) -> str:
    assert loaded.usable_until is not None
    return datetime.fromtimestamp(loaded.usable_until, UTC).isoformat(timespec="seconds")


def test_cache_entries_are_per_principal(
    short_catalog: CatalogServer, events: str, readers: tuple[CatalogPrincipal, CatalogPrincipal], tmp_path: Path
) -> None:
    """Two readers with the same grants get the same ETag: a shared entry would 304 the second one with the
    first one's credentials. Each must do its own full load and get its own vended key."""
    alice, bob = readers
    with open_session(tmp_path, short_catalog, alice) as a, open_session(tmp_path, short_catalog, bob) as b:
        a_loaded = query(a)
        b_loaded = query(b)
        assert a_loaded.cache_outcome is CacheOutcome.RELOADED
        assert b_loaded.cache_outcome is CacheOutcome.RELOADED  # not a 304 on alice's entry
        assert access_key(b_loaded) != access_key(a_loaded)
        # alice's entry was live all along (so a shared cache would have served bob from it).
        assert explain(a)["cache"] == "304"


def test_a_write_drops_the_cache_entry_so_the_next_load_is_a_full_load(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    """The production provider forgets its entry after a commit (``TableProvider.invalidate``): the next load
    is a full load of the new metadata, not a revalidation of what the table was before the write."""
    namespace = "cache_after_write"
    pyiceberg_catalog(catalog_server, engine_writer).create_namespace(namespace)
    path = write_sqe_config(tmp_path / "writer.toml", catalog_server.url, engine_writer, catalog_server.moto)
    config = load_config(path)
    provider = RestTableProvider(config)
    ident = TableIdent(config.catalog.warehouse, (namespace,), "t")
    with Session(provider, config) as session:
        session.sql(f"CREATE TABLE {namespace}.t AS SELECT * FROM (VALUES (1), (2)) v(id)")
        before = provider.load_table(ident).table.metadata_location  # the Table object itself is shared
        assert provider.load_table(ident).cache_outcome is CacheOutcome.REVALIDATED  # the entry is live
        session.sql(f"INSERT INTO {namespace}.t VALUES (3)")
        after = provider.load_table(ident)
        assert after.cache_outcome is CacheOutcome.RELOADED
        assert after.table.metadata_location != before
        assert session.sql(f"SELECT count(*) FROM {namespace}.t").fetchall() == [(3,)]
        # invalidate on its own: an unchanged table answers 304 until its entry is dropped, then loads in full.
        assert provider.load_table(ident).cache_outcome is CacheOutcome.REVALIDATED
        provider.invalidate(ident)
        reloaded = provider.load_table(ident)
        assert reloaded.cache_outcome is CacheOutcome.RELOADED
        assert reloaded.table.metadata_location == after.table.metadata_location
