"""The decoded-column cache against a real moto server and sqe-catalog with vended credentials.

Repeat queries give the same rows with the cache on and off — plain and filtered scans, a restricted table (row
filter, then a mask) read by a restricted user through the trusted reader, a table with positional deletes and a
schema-evolved one (a renamed column) — and a repeat query of the same user is served from the cache, counted
by the cache's own counters, while another user with their own vended credential never reads the first one's
entries. Nothing decoded (the restricted table's raw values) reaches logs, EXPLAIN or the cache's repr.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyiceberg.types import StringType

from sqe.execution.byte_cache import DEFAULT_DATA_BYTES, DEFAULT_MANIFEST_BYTES
from sqe.execution.cache import clear_process_caches, configure_process_caches
from sqe.execution.decoded_cache import DECODED, DEFAULT_DECODED_BYTES
from tests.conftest import pyiceberg_catalog
from tests.e2e.test_engine_range_cache import PEOPLE, restricted_people, session_for
from tests.unit.sqe.iceberg_local import DELETED_POSITIONS, add_positional_deletes

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

NAMESPACE = "decoded_cache"
ROWS_PER_FILE = 20_000
OFF = {"decoded_bytes": 0}
QUERIES = [
    f"SELECT count(*), sum(id), sum(x), max(note) FROM {NAMESPACE}.events",
    f"SELECT id, x, note FROM {NAMESPACE}.events WHERE id BETWEEN 19990 AND 20010 ORDER BY id",  # pushed to files
    f"SELECT count(*), sum(x) FROM {NAMESPACE}.events WHERE note LIKE 'note-1%'",  # filtered after the scan
    f"SELECT id, x FROM {NAMESPACE}.events ORDER BY id LIMIT 5",
]
EVOLVED = f"SELECT id, renamed FROM {NAMESPACE}.evolved ORDER BY id"
# Filters on the renamed column and on one the first file lacks, with what each must return.
EVOLVED_FILTERED = [
    (f"SELECT id FROM {NAMESPACE}.evolved WHERE renamed IN ('a', 'c') ORDER BY id", [(1,), (3,)]),
    (f"SELECT id FROM {NAMESPACE}.evolved WHERE added = 'z' ORDER BY id", [(3,)]),
    (f"SELECT id FROM {NAMESPACE}.evolved WHERE added IS NULL ORDER BY id", [(1,), (2,)]),
    (f"SELECT id, added FROM {NAMESPACE}.evolved WHERE renamed <> 'b' ORDER BY id", [(1, None), (3, "z")]),
]
DELETED = f"SELECT count(*), min(id), sum(id) FROM {NAMESPACE}.deleted"


@pytest.fixture(autouse=True)
def default_caches() -> Iterator[None]:
    """Each test starts cold with the default bounds (sessions re-bound the process caches)."""
    configure_process_caches(
        data_bytes=DEFAULT_DATA_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES
    )
    clear_process_caches()
    yield
    configure_process_caches(
        data_bytes=DEFAULT_DATA_BYTES, manifest_bytes=DEFAULT_MANIFEST_BYTES, decoded_bytes=DEFAULT_DECODED_BYTES
    )
    clear_process_caches()


def rows_of(
    workdir: Path, server: CatalogServer, principal: CatalogPrincipal, sql: str, cache: dict[str, int] | None = None
) -> list[tuple[Any, ...]]:
    """The rows of one query in a new session (so it is planned and read again, not answered by the session)."""
    with session_for(workdir, server, principal, cache) as session:
        return list(session.sql(sql).fetchall())


@pytest.fixture(scope="module")
def readers(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, CatalogPrincipal]:
    """alice and bob may read the namespace: a two-file ``events``, ``deleted`` (positional deletes) and
    ``evolved`` (a column renamed between its two files)."""
    owner = catalog_server.admin
    catalog = pyiceberg_catalog(catalog_server, owner)
    catalog.create_namespace(NAMESPACE)
    with session_for(tmp_path_factory.mktemp("owner"), catalog_server, owner) as session:
        for start in (1, ROWS_PER_FILE + 1):
            rows = (
                f"SELECT i AS id, i * 0.25 AS x, 'note-' || i AS note FROM range({start}, {start + ROWS_PER_FILE}) r(i)"
            )
            verb = f"CREATE TABLE {NAMESPACE}.events AS" if start == 1 else f"INSERT INTO {NAMESPACE}.events"
            session.sql(f"{verb} {rows}")
    ids = pa.table({"id": pa.array(range(1, 2001), pa.int64())})
    catalog.create_table((NAMESPACE, "deleted"), schema=ids.schema).append(ids)
    add_positional_deletes(catalog.load_table((NAMESPACE, "deleted")))
    evolved = catalog.create_table((NAMESPACE, "evolved"), schema=pa.schema([("id", pa.int64()), ("old", pa.string())]))
    evolved.append(pa.table({"id": pa.array([1, 2], pa.int64()), "old": ["a", "b"]}))
    with evolved.update_schema() as update:
        update.rename_column("old", "renamed")
        update.add_column("added", StringType())  # absent from the first file
    evolved.append(pa.table({"id": pa.array([3], pa.int64()), "renamed": ["c"], "added": ["z"]}))
    grants: list[tuple[str, str | None, str | None]] = [
        ("TABLE_READ_DATA", NAMESPACE, None),
        ("NAMESPACE_READ_PROPERTIES", None, None),
    ]
    return {name: catalog_server.principal_with_grants(f"dc_{name}", grants) for name in ("alice", "bob")}


@pytest.mark.parametrize("sql", QUERIES)
def test_a_repeat_query_is_served_decoded_and_equals_the_uncached_rows(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path, sql: str
) -> None:
    alice = readers["alice"]
    uncached = rows_of(tmp_path, catalog_server, alice, sql, OFF)
    assert uncached and len(DECODED) == 0  # off: nothing kept
    assert rows_of(tmp_path, catalog_server, alice, sql) == uncached  # cold: decoded and kept
    kept, hits, misses = len(DECODED), DECODED.stats.hits, DECODED.stats.misses
    assert kept > 0
    assert rows_of(tmp_path, catalog_server, alice, sql) == uncached  # repeat, in a new session
    assert DECODED.stats.hits > hits and DECODED.stats.misses == misses and len(DECODED) == kept


def test_the_filtered_query_has_the_rows_it_should(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path
) -> None:
    for _ in range(2):
        got = rows_of(tmp_path, catalog_server, readers["alice"], QUERIES[1])
        assert [row[0] for row in got] == list(range(19990, 20011)) and got[0][2] == "note-19990"
        # No column is returned, only the pushed filter's: every matching row still counts.
        counted = f"SELECT count(*) FROM {NAMESPACE}.events WHERE id BETWEEN 19990 AND 20010"
        assert rows_of(tmp_path, catalog_server, readers["alice"], counted) == [(21,)]


def test_positional_deletes_and_a_renamed_column_read_the_same_with_the_cache_on_and_off(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path
) -> None:
    alice = readers["alice"]
    deleted_ids = {position + 1 for position in DELETED_POSITIONS}
    live = [i for i in range(1, 2001) if i not in deleted_ids]
    evolved = [(1, "a"), (2, "b"), (3, "c")]
    for cache in (OFF, None, None):  # off, cold, repeat
        assert rows_of(tmp_path, catalog_server, alice, DELETED, cache) == [(len(live), min(live), sum(live))]
        assert rows_of(tmp_path, catalog_server, alice, EVOLVED, cache) == evolved
        for sql, expected in EVOLVED_FILTERED:
            assert rows_of(tmp_path, catalog_server, alice, sql, cache) == expected, sql


def test_another_users_own_credential_never_reads_the_first_users_entries(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path: Path
) -> None:
    sql = QUERIES[0]
    expected = rows_of(tmp_path, catalog_server, readers["alice"], sql)
    alice_kept, alice_identities = len(DECODED), {key[0] for key in DECODED.snapshot_keys()}
    hits, misses = DECODED.stats.hits, DECODED.stats.misses
    assert rows_of(tmp_path, catalog_server, readers["bob"], sql) == expected
    # bob's vended set has its own identity: every lookup of his missed, and he decoded and kept his own columns.
    assert DECODED.stats.hits == hits and DECODED.stats.misses - misses == alice_kept
    identities = {key[0] for key in DECODED.snapshot_keys()}
    assert len(DECODED) == 2 * alice_kept and alice_identities < identities
    hits = DECODED.stats.hits
    assert rows_of(tmp_path, catalog_server, readers["bob"], sql) == expected  # now his own entries serve him
    assert DECODED.stats.hits - hits == alice_kept


@pytest.fixture(scope="module")
def restricted(
    catalog_server: CatalogServer, readers: dict[str, CatalogPrincipal], tmp_path_factory: pytest.TempPathFactory
) -> CatalogPrincipal:
    """``people`` restricted for dan (EU rows, ssn nulled); his sessions read through the trusted reader."""
    return restricted_people(catalog_server, NAMESPACE, "dc_dan", tmp_path_factory.mktemp("restrictions"))


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (f"SELECT id, region, ssn FROM {NAMESPACE}.people ORDER BY id", [(1, "EU", None), (3, "EU", None)]),
        (f"SELECT id, ssn FROM {NAMESPACE}.people WHERE id > 1 ORDER BY id", [(3, None)]),  # filter column not shown
        # A predicate on the masked column sees the mask, not the kept raw value: masks run before user predicates.
        (f"SELECT id FROM {NAMESPACE}.people WHERE ssn = '333-44-5555'", []),
        (f"SELECT count(*) FROM {NAMESPACE}.people WHERE ssn IS NULL", [(2,)]),
    ],
)
def test_a_restricted_repeat_query_filters_then_masks_the_decoded_raw_values_and_shows_none_of_them(
    catalog_server: CatalogServer,
    catalog_reader: CatalogPrincipal,
    restricted: CatalogPrincipal,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    sql: str,
    expected: list[tuple[Any, ...]],
) -> None:
    reader = {"reader_client_id": catalog_reader.client_id, "reader_client_secret": catalog_reader.client_secret}

    def rows(cache: dict[str, int] | None = None) -> list[tuple[Any, ...]]:
        with session_for(tmp_path, catalog_server, restricted, cache, **reader) as session:
            return list(session.sql(sql).fetchall())

    assert rows(OFF) == expected
    caplog.set_level(logging.DEBUG)
    assert rows() == expected
    hits, misses = DECODED.stats.hits, DECODED.stats.misses
    with session_for(tmp_path, catalog_server, restricted, None, **reader) as session:
        assert list(session.sql(sql).fetchall()) == expected  # the row filter, then the mask, on cached columns
        explained = json.dumps(session.explain(sql).to_pylist())
    assert DECODED.stats.hits > hits and DECODED.stats.misses == misses
    shown = caplog.text + explained + repr(DECODED)
    # (a value the query itself names is in its own text, which the logs and EXPLAIN show)
    assert not [value for value in PEOPLE.column("ssn").to_pylist() if value in shown and value not in sql]
    assert not [secret for secret in catalog_server.secrets if secret in shown]
