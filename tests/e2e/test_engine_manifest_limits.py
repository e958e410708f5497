"""The engine reads a table's manifest list and manifests no further than the catalog's planning does.

A writer of the table (anyone with its write credentials) decides what those files hold: one swapped for a file
past ``MAX_MANIFEST_BYTES`` or for a deflate bomb past ``MAX_MANIFEST_DECOMPRESSED_BYTES`` makes the engine's
planning fail with :class:`sqe.errors.ManifestLimitError` naming the file kind and the limit, with the manifest
cache on or off, every time; other tables read as before. Real moto S3 and sqe-catalog; the swap is a plain
S3 write.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from sqe.errors import ManifestLimitError, SQEError
from sqe.execution.cache import clear_process_caches
from tests.conftest import pyiceberg_catalog
from tests.e2e.test_catalog_planning import _oversized_or_bomb
from tests.e2e.test_engine_range_cache import session_for

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

ROWS = 100  # per append; two appends, so two manifests


def _table(workdir: Path, server: CatalogServer) -> str:
    ns = f"mlim_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(server, server.admin).create_namespace(ns)
    with session_for(workdir, server, server.admin) as session:
        session.sql(f"CREATE TABLE {ns}.events AS SELECT i AS id FROM range(0, {ROWS}) r(i)")
        session.sql(f"INSERT INTO {ns}.events SELECT i AS id FROM range({ROWS}, {2 * ROWS}) r(i)")
    return f"{ns}.events"


def _swap(server: CatalogServer, table: str, kind: str, case: str) -> str:
    """Overwrite the table's manifest list or first manifest; the limit's text the refusal names."""
    ns, name = table.split(".")
    loaded = pyiceberg_catalog(server, server.admin).load_table((ns, name))
    snapshot = loaded.current_snapshot()
    assert snapshot is not None
    target = snapshot.manifest_list if kind == "manifest list" else snapshot.manifests(loaded.io)[0].manifest_path
    bucket, _, key = target.removeprefix("s3://").partition("/")
    s3 = server.moto.client("s3")
    data, limit = _oversized_or_bomb(case, s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    return limit


def test_a_normal_table_plans_and_reads_as_before(catalog_server: CatalogServer, tmp_path: Path) -> None:
    table = _table(tmp_path, catalog_server)
    clear_process_caches()
    with session_for(tmp_path, catalog_server, catalog_server.admin) as session:
        for _ in range(2):  # cold, then from the manifest cache
            assert session.sql(f"SELECT count(*), sum(id) FROM {table} WHERE id >= 0").fetchall() == [
                (2 * ROWS, sum(range(2 * ROWS)))
            ]
        assert session.sql(f"SELECT count(*) FROM {table}").fetchall() == [(2 * ROWS,)]


@pytest.mark.parametrize("cached", [True, False], ids=["manifest-cache", "no-manifest-cache"])
@pytest.mark.parametrize("case", ["stored", "inflated"])
@pytest.mark.parametrize("kind", ["manifest list", "manifest"])
def test_the_engine_refuses_manifests_past_the_limits(
    catalog_server: CatalogServer, tmp_path: Path, kind: str, case: str, cached: bool
) -> None:
    # Before: the engine read the file whole (any size) and pyiceberg inflated each block whole.
    table = _table(tmp_path, catalog_server)
    limit = _swap(catalog_server, table, kind, case)
    clear_process_caches()
    cache = None if cached else {"manifest_bytes": 0}
    queries = [f"SELECT sum(id) FROM {table} WHERE id >= 0"]
    if kind == "manifest list":
        queries.append(f"SELECT count(*) FROM {table}")  # answered from the manifest list alone
    with session_for(tmp_path, catalog_server, catalog_server.admin, cache) as session:
        for sql in queries * 2:  # a refused file is never kept: the second read is refused again
            with pytest.raises(SQEError) as raised:
                session.sql(sql).fetchall()
            assert type(raised.value) is ManifestLimitError, raised.value
            where = f"{catalog_server.warehouse}.{table}"
            assert str(raised.value) == f"cannot plan a scan of {where}: a {kind} of the table {limit}"
