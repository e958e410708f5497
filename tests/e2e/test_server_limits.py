"""``sqe serve``'s per-engine limits (``[server] engine_memory_bytes``, ``engine_threads``, ``engine_spill_bytes``)
and what a user's SQL sees of the server's directories: a real server process on loopback with tight limits,
driven by ADBC as two users of the session's catalog.

Found by review: each user's engine kept DuckDB's defaults (80% of the memory, every core, 90% of the free disk to
spill into), so one user's query could take the memory or the disk of the whole server; and ``current_setting``
showed every user the server's home directory.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.test_server import Served, _principal, _write_configs, start_server

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENGINE_MEMORY = 64 << 20
# needs far more than 64 MiB sorted in memory, and may not spill a byte
TOO_BIG = "SELECT count(*) AS n FROM (SELECT md5(x::VARCHAR) AS s FROM range(3000000) t(x) ORDER BY s)"


@pytest.fixture(scope="module")
def limited(catalog_server: CatalogServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.helpers.processes import stop_child

    suffix = uuid.uuid4().hex[:6]
    users = {
        who: _principal(catalog_server, f"lim_{who}_{suffix}", [("NAMESPACE_LIST", None)]) for who in ("alice", "bob")
    }
    workdir = tmp_path_factory.mktemp("limited")
    config = _write_configs(
        workdir, catalog_server, engine_memory_bytes=ENGINE_MEMORY, engine_threads=1, engine_spill_bytes=0
    )
    proc, port = start_server(workdir, config)
    world = Served(catalog_server, "", f"grpc://127.0.0.1:{port}", proc, workdir / "server.log", workdir, users)
    try:
        yield world
    finally:
        stop_child(proc)


def _query(conn: Any, sql: str) -> list[dict[str, Any]]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetch_arrow_table().to_pylist())


def test_a_query_past_its_engines_limits_fails_typed_while_another_users_runs(limited: Served) -> None:
    settings = (
        "SELECT current_setting('memory_limit') AS m, current_setting('threads') AS t, "
        "current_setting('max_temp_directory_size') AS s"
    )
    failures: list[str] = []

    def alices_big_query() -> None:
        with limited.adbc("alice") as alice, pytest.raises(Exception) as failed:
            _query(alice, TOO_BIG)
        failures.append(str(failed.value))

    with limited.adbc("bob") as bob:
        assert _query(bob, settings) == [{"m": "64.0 MiB", "t": 1, "s": "0 bytes"}], "his engine has the limits"
        hers = threading.Thread(target=alices_big_query)
        hers.start()
        try:
            assert _query(bob, "SELECT count(*) AS n FROM range(100000)") == [{"n": 100000}]
        finally:
            hers.join()
        assert _query(bob, "SELECT sum(x) AS n FROM range(1000) t(x)") == [{"n": 499500}]
    [failure] = failures
    assert "QueryResourceError: Out of Memory Error" in failure and "Traceback" not in failure
    with limited.adbc("alice") as alice:  # her next query, on a new engine, runs
        assert _query(alice, "SELECT count(*) AS n FROM range(10)") == [{"n": 10}]
    assert "each engine may take 67108864 bytes of memory, 1 threads and 0 bytes of spill space" in limited.log_text()


def test_a_user_sees_no_directory_of_the_servers_account(limited: Served) -> None:
    shown = "SELECT current_setting('home_directory') AS h, current_setting('secret_directory') AS s"
    with limited.adbc("alice") as alice:
        assert _query(alice, shown) == [{"h": "/nonexistent", "s": "/nonexistent"}]
        paths = _query(alice, "SELECT value AS v FROM duckdb_settings() WHERE name = 'allowed_paths'")
        assert paths == [{"v": "[]"}], "no file of the server's working directory is named (or allowed)"
