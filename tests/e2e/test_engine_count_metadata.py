"""A cold bare ``count(*)`` against a real moto server and sqe-catalog reads the manifest list and nothing else.

The count comes from the manifest list's per-manifest row counts of the snapshot the catalog just returned for
this user, so a table of several appends costs one GET (not one per manifest, not one per data file); it stays
exact after a row-level DELETE; any other query, filtered counts included, plans and scans as before.
S3 requests are counted from moto's own request log.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sqe.execution.cache import clear_process_caches
from tests.e2e.test_engine_footer_cache import MotoLog
from tests.e2e.test_engine_range_cache import requests_of_files, session_for

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

NAMESPACE = "count_metadata"
APPENDS = 4
ROWS_PER_APPEND = 500


@pytest.fixture(scope="module")
def reader(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> CatalogPrincipal:
    """A reader of a table written in APPENDS commits (so its snapshot lists APPENDS manifests)."""
    from tests.conftest import pyiceberg_catalog

    owner = catalog_server.admin
    pyiceberg_catalog(catalog_server, owner).create_namespace(NAMESPACE)
    with session_for(tmp_path_factory.mktemp("owner"), catalog_server, owner) as session:
        for n in range(APPENDS):
            start = n * ROWS_PER_APPEND
            rows = f"SELECT i AS id FROM range({start}, {start + ROWS_PER_APPEND}) r(i)"
            verb = f"CREATE TABLE {NAMESPACE}.events AS" if n == 0 else f"INSERT INTO {NAMESPACE}.events"
            session.sql(f"{verb} {rows}")
    grants: list[tuple[str, str | None, str | None]] = [
        ("TABLE_READ_DATA", NAMESPACE, None),
        ("NAMESPACE_READ_PROPERTIES", None, None),
    ]
    return catalog_server.principal_with_grants("cm_reader", grants)


def cold(workdir: Path, server: CatalogServer, principal: CatalogPrincipal, sql: str) -> tuple[Any, str, list[str]]:
    """(the one value, the execution path, the S3 paths of data files and manifests read) of a cold query."""
    clear_process_caches()
    log = MotoLog(server.moto.pid)
    log.mark()
    with session_for(workdir, server, principal) as session:
        [[value]] = session.sql(sql).fetchall()
        path = session.last_execution_path
    return value, path, [p for _, p in requests_of_files(log)]


def test_a_cold_bare_count_reads_only_the_manifest_list(
    catalog_server: CatalogServer, reader: CatalogPrincipal, tmp_path: Path
) -> None:
    value, path, read = cold(tmp_path, catalog_server, reader, f"SELECT count(*) FROM {NAMESPACE}.events")
    assert value == APPENDS * ROWS_PER_APPEND and path == "metadata"
    assert len(read) == 1 and read[0].rsplit("/", 1)[-1].startswith("snap-"), read  # the list; no manifest


def test_a_filtered_count_still_plans_and_scans(
    catalog_server: CatalogServer, reader: CatalogPrincipal, tmp_path: Path
) -> None:
    sql = f"SELECT count(*) FROM {NAMESPACE}.events WHERE id >= {ROWS_PER_APPEND}"
    value, path, read = cold(tmp_path, catalog_server, reader, sql)
    assert value == (APPENDS - 1) * ROWS_PER_APPEND and path != "metadata"
    manifests = [p for p in read if p.endswith(".avro") and not p.rsplit("/", 1)[-1].startswith("snap-")]
    assert len(manifests) == APPENDS and any(p.endswith(".parquet") for p in read)


def test_the_count_stays_exact_after_a_delete(
    catalog_server: CatalogServer, reader: CatalogPrincipal, tmp_path: Path
) -> None:
    table = f"{NAMESPACE}.trimmed"  # its own table: the other tests' counts stay fixed whatever the order
    with session_for(tmp_path, catalog_server, catalog_server.admin) as owner:
        owner.sql(f"CREATE TABLE {table} AS SELECT * FROM {NAMESPACE}.events")
        owner.sql(f"INSERT INTO {table} SELECT id + 100000 AS id FROM {NAMESPACE}.events")
        owner.sql(f"DELETE FROM {table} WHERE id % 10 = 0 AND id < {ROWS_PER_APPEND}")
    value, path, _ = cold(tmp_path, catalog_server, reader, f"SELECT count(*) FROM {table}")
    scanned, scan_path, _ = cold(tmp_path, catalog_server, reader, f"SELECT count(id) FROM {table}")
    assert scan_path != "metadata" and value == scanned == 2 * APPENDS * ROWS_PER_APPEND - ROWS_PER_APPEND // 10
    assert path == "metadata"
