"""``sqe-worker --data-cache-bytes / --decoded-cache-bytes``: the worker process's caches, counted in real S3 requests.

Two real workers on the session's moto + ``sqe-catalog``: one with the default bounds, one with both caches off.
The same query runs twice through each; a repeat fragment on the caching worker reads no data file, while on the
other it reads every file again (data-file GETs counted from moto's own request log), and both give the answer
of the local run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import sqe.api
from sqe.config import CacheConfig, load_config
from tests.e2e.test_distributed import (
    FILES,
    Tables,
    WorkerPools,
    coordinator_overrides,
    distributed_session,
    reader_config,
    tables,
    worker_factory,
)
from tests.e2e.test_engine_footer_cache import MotoLog

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e
__all__ = ["reader_config", "tables", "worker_factory"]  # module fixtures re-used from test_distributed

QUERY = "SELECT region, sum(amount) AS total, max(note) AS last FROM {ns}.events WHERE amount >= 0 GROUP BY region"


def _repeat_data_reads(
    catalog_server: CatalogServer, config_path: Path, pool_args: tuple[str, ...], sql: str, pools: WorkerPools
) -> tuple[list[tuple[str, str]], list[tuple[object, ...]], str]:
    """Run ``sql`` twice on a fresh worker started with ``pool_args``: the repeat's data-file requests, its
    sorted rows and the worker's log."""
    pool = pools.pool(1, *pool_args)
    config = load_config(config_path, env={}, overrides=coordinator_overrides(pool))
    log = MotoLog(catalog_server.moto.pid)
    with distributed_session(config) as session:
        session.sql(sql).fetchall()
        log.mark()
        rows = sorted(session.sql(sql).fetchall())
        reads = log.data_requests()
    return reads, rows, pool.logs()


def test_worker_cache_bounds_decide_whether_a_repeat_fragment_reads_the_store(
    catalog_server: CatalogServer, tables: Tables, reader_config: Path, worker_factory: WorkerPools
) -> None:
    sql = QUERY.format(ns=tables.namespace)
    with sqe.api.connect(reader_config) as local:
        expected = sorted(local.sql(sql).fetchall())

    cached_reads, cached_rows, cached_log = _repeat_data_reads(catalog_server, reader_config, (), sql, worker_factory)
    off = ("--data-cache-bytes", "0", "--decoded-cache-bytes", "0", "--keep-freed-bytes", "0")
    uncached_reads, uncached_rows, uncached_log = _repeat_data_reads(
        catalog_server, reader_config, off, sql, worker_factory
    )

    assert cached_rows == uncached_rows == expected
    assert cached_reads == [], "the caching worker read data files again on a repeat fragment"
    assert len({path for method, path in uncached_reads if method == "GET"}) == FILES, (
        "the uncached worker did not re-read"
    )
    defaults = CacheConfig()
    assert f"data ranges {defaults.data_bytes} bytes, decoded columns {defaults.decoded_bytes} bytes" in cached_log
    assert (
        "data ranges 0 bytes, decoded columns 0 bytes; freed memory kept: 0 bytes (off); prefetch off" in uncached_log
    )
    assert "; prefetch off" in cached_log  # off unless --prefetch
