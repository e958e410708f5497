"""Requests per data file against a real moto server: no HEAD (files open with the manifest's size) and, on a
repeat query under the same vended credential set, no footer GET (the kept Parquet fragment). A reader with
its own vended set never gets another reader's kept fragment.

S3 requests are counted from moto's own request log (the server writes one line per request to its stderr).
The data-range cache is off here (``[cache] data_bytes = 0``) so the data GETs stay visible; it has its own test
(test_engine_range_cache.py).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sqe.api
from sqe.config import load_config
from sqe.execution.cache import FRAGMENTS, clear_process_caches
from sqe.session import Session
from tests.conftest import pyiceberg_catalog, write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]

NAMESPACE = "footer_cache"
QUERY = f"SELECT count(*) AS n, sum(id) AS total FROM {NAMESPACE}.events"
EXPECTED = [(5, 15)]
_DATA_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD) (/\S+\.parquet)\S* HTTP')


class MotoLog:
    """moto's request log, found through the server process's own stderr."""

    def __init__(self, pid: int) -> None:
        self.path = Path(os.readlink(f"/proc/{pid}/fd/2"))
        self._offset = 0

    def mark(self) -> None:
        time.sleep(0.1)  # a line is written just after the response
        self._offset = self.path.stat().st_size

    def data_requests(self) -> list[tuple[str, str]]:
        time.sleep(0.1)
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            return _DATA_REQUEST.findall(fh.read().decode("utf-8", "replace"))


@pytest.fixture(scope="module")
def readers(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> list[CatalogPrincipal]:
    """Two principals with the same read grant on a two-file table, written by the admin."""
    owner = catalog_server.admin
    pyiceberg_catalog(catalog_server, owner).create_namespace(NAMESPACE)
    with open_session(tmp_path_factory.mktemp("owner"), catalog_server, owner) as session:
        session.sql(f"CREATE TABLE {NAMESPACE}.events AS SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'c')) v(id, t)")
        session.sql(f"INSERT INTO {NAMESPACE}.events VALUES (4, 'd'), (5, 'e')")
    grants: list[tuple[str, str | None, str | None]] = [
        ("TABLE_READ_DATA", NAMESPACE, None),
        ("NAMESPACE_READ_PROPERTIES", None, None),
    ]
    return [catalog_server.principal_with_grants(name, grants) for name in ("fc_alice", "fc_bob")]


def open_session(workdir: Path, server: CatalogServer, principal: CatalogPrincipal) -> Session:
    path = write_sqe_config(workdir / f"{principal.name}.toml", server.url, principal, server.moto)
    return sqe.api.connect(load_config(path, env={}, overrides={"cache.data_bytes": 0}))


def test_no_head_and_no_repeat_footer_get_and_no_sharing_across_credential_sets(
    catalog_server: CatalogServer, readers: list[CatalogPrincipal], tmp_path: Path
) -> None:
    alice, bob = readers
    log = MotoLog(catalog_server.moto.pid)
    clear_process_caches()
    with open_session(tmp_path, catalog_server, alice) as session:
        log.mark()
        assert session.sql(QUERY).fetchall() == EXPECTED
        first = log.data_requests()
        [stream] = session.last_streams
        files = {urlpath(task.file.file_path) for task in stream.plan.tasks}
        assert len(files) == 2
        assert not [r for r in first if r[0] == "HEAD"], first  # sized opens: no HEAD on any data file
        assert {path for _, path in first} == files
        assert len(first) == 2 * len(files)  # footer GET + data GET each

        hits = FRAGMENTS.stats.hits
        log.mark()
        assert session.sql(QUERY).fetchall() == EXPECTED
        repeat = log.data_requests()
        assert sorted(repeat) == sorted(("GET", path) for path in files)  # the data only: footers were kept
        assert FRAGMENTS.stats.hits == hits + len(files)

    with open_session(tmp_path, catalog_server, bob) as session:
        hits, kept = FRAGMENTS.stats.hits, len(FRAGMENTS)
        log.mark()
        assert session.sql(QUERY).fetchall() == EXPECTED
        # bob's vended set is his own: alice's kept fragments (her keys) never serve him.
        assert FRAGMENTS.stats.hits == hits and len(FRAGMENTS) == kept + len(files)
        assert len(log.data_requests()) == 2 * len(files)


def urlpath(location: str) -> str:
    return "/" + location.split("://", 1)[1]
