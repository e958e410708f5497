"""Hive external tables scanned on real ``sqe-worker`` processes (``[coordinator] workers``) against real moto:
the same rows as local mode (partition values from the hive paths included), pruning on the coordinator before
tickets are built, tickets carrying the mount's keys or the ``[storage]`` pair as a ``static`` set scoped to the
mount, the worker log naming the static source, and no key in any log."""

from __future__ import annotations

import io
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.fernet import Fernet

from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.distributed.coordinator import DistributedOptions
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.session import Session
from tests.conftest import write_sqe_config
from tests.e2e.test_distributed import WorkerPool, WorkerPools, coordinator_overrides, worker_factory

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("bogus_aws_env")]
__all__ = ["worker_factory"]  # the module-scoped pool fixture, re-used from test_distributed
KEY_ENV = "SQE_EXTERNAL_TABLES_KEY"
ALL_ROWS = "SELECT id, amount, region, year FROM ext.sales ORDER BY id"
PRUNED = "SELECT id, amount, region, year FROM ext.sales WHERE region = 'eu' AND year = 2024 ORDER BY id"


# This module's own catalog: a mount fails closed on any governed table it cannot load, and other modules leave
# such tables in the shared session catalog.
@pytest.fixture(scope="module")
def catalog_server(own_catalog: CatalogServer) -> CatalogServer:
    return own_catalog


@pytest.fixture(scope="module")
def engine_writer(own_writer: CatalogPrincipal) -> CatalogPrincipal:
    return own_writer


@pytest.fixture(scope="module")
def pool(worker_factory: WorkerPools) -> WorkerPool:
    return worker_factory.pool(2)


@pytest.fixture(scope="module")
def sales(moto_server: MotoServer) -> str:
    """``.../sales/region=<r>/year=<y>/part-<n>.parquet``: 5 files, ids 1..8; the files hold no partition column."""
    base = f"hive_dist_{uuid.uuid4().hex[:6]}/sales"
    s3 = moto_server.client("s3")
    layout = {("eu", 2024): [[1, 2], [3]], ("eu", 2025): [[4]], ("us", 2024): [[5, 6]], ("us", 2025): [[7, 8]]}
    for (region, year), files in layout.items():
        for n, ids in enumerate(files):
            buffer = io.BytesIO()
            pq.write_table(pa.table({"id": ids, "amount": [i * 1.5 for i in ids]}), buffer)
            key = f"{base}/region={region}/year={year}/part-{n}.parquet"
            s3.put_object(Bucket=moto_server.bucket, Key=key, Body=buffer.getvalue())
    return f"s3://{moto_server.bucket}/{base}"


@pytest.fixture()
def sealing_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = Fernet.generate_key().decode()
    monkeypatch.setenv(KEY_ENV, key)
    return key


def config_path(tmp_path: Path, server: CatalogServer, principal: CatalogPrincipal, *, static: bool) -> Path:
    moto = server.moto
    storage = {"access_key_id": moto.access_key_id, "secret_access_key": moto.secret_access_key} if static else {}
    return write_sqe_config(
        tmp_path / "sqe.toml",
        server.url,
        principal,
        moto,
        catalog={"require_vended_credentials": False},
        storage=storage,
    )


def local_session(path: Path) -> Session:
    config = load_config(path)
    return Session(RestTableProvider(config), config)


def distributed_session(path: Path, pool: WorkerPool) -> Session:
    # "vended" on purpose: an external table has no catalog to vend for it, its tickets carry the static set anyway
    config = load_config(path, overrides=coordinator_overrides(pool, distributed_credentials="vended"))
    options = DistributedOptions(max_files_per_fragment=1, idle_timeout_seconds=10.0)
    return Session(RestTableProvider(config), config, distributed=options)


def create_sql(location: str, with_keys: str = "") -> str:
    return (
        f"CREATE EXTERNAL TABLE ext.sales (id BIGINT, amount DOUBLE) STORED AS PARQUET LOCATION '{location}' "
        f"PARTITIONED BY (region VARCHAR, year INTEGER){with_keys}"
    )


def tickets_of(session: Session) -> list[tuple[str, pb.ScanTicket]]:
    executor = session.distributed_executor
    assert executor is not None
    seen: list[tuple[str, pb.ScanTicket]] = []
    executor.ticket_observers.append(lambda worker, ticket: seen.append((worker, ticket)))
    return seen


def rows(session: Session, sql: str) -> list[dict[str, Any]]:
    return session.sql(sql).arrow().to_pylist()


def explained(session: Session, sql: str) -> dict[str, str]:
    found = {r["property"]: r["value"] for r in rows(session, sql) if r["section"].endswith("ext.sales")}
    assert found, "no EXPLAIN section for ext.sales"
    return found


def test_the_storage_pair_mount_is_read_on_workers_with_the_same_rows(
    catalog_server: CatalogServer,
    engine_writer: CatalogPrincipal,
    pool: WorkerPool,
    sales: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    moto = catalog_server.moto
    caplog.set_level(logging.DEBUG)
    path = config_path(tmp_path, catalog_server, engine_writer, static=True)
    with local_session(path) as local:
        local.sql(create_sql(sales))
        expected_all, expected_pruned = rows(local, ALL_ROWS), rows(local, PRUNED)
        expected_count = rows(local, "SELECT region, year, count(*) AS n FROM ext.sales GROUP BY ALL ORDER BY ALL")
    assert len(expected_all) == 8 and [r["id"] for r in expected_pruned] == [1, 2, 3]
    assert expected_pruned[0] == {"id": 1, "amount": 1.5, "region": "eu", "year": 2024}

    with distributed_session(path, pool) as s:
        sent = tickets_of(s)
        assert rows(s, ALL_ROWS) == expected_all
        assert len(sent) == 5 and {w for w, _ in sent} == set(pool.addresses), "one file per fragment, both workers"
        sent.clear()
        assert rows(s, PRUNED) == expected_pruned
        paths = sorted(t.data_file.file_path for _, ticket in sent for t in ticket.tasks)
        assert paths == [f"{sales}/region=eu/year=2024/part-{n}.parquet" for n in (0, 1)], "pruned before tickets"
        assert rows(s, "SELECT region, year, count(*) AS n FROM ext.sales GROUP BY ALL ORDER BY ALL") == expected_count
        plan = explained(s, "EXPLAIN SELECT * FROM ext.sales WHERE region = 'us'")
        assert (plan["files_listed"], plan["files_scanned"], plan["executed_on"]) == ("5", "2", "workers")
        credentials = [c for _, ticket in sent for c in ticket.credentials]
    assert credentials and all(c.source == pb.CREDENTIAL_SOURCE_STATIC for c in credentials)
    assert {c.prefix for c in credentials} == {sales + "/"}, "the static set is scoped to the mount"
    assert {c.access_key_id for c in credentials} == {moto.access_key_id}
    logs = pool.logs()
    assert "files (credentials: static)" in logs
    for text in (logs, caplog.text):
        assert moto.secret_access_key not in text


def test_a_mounts_own_keys_travel_to_workers_as_a_static_set(
    catalog_server: CatalogServer,
    engine_writer: CatalogPrincipal,
    pool: WorkerPool,
    sales: str,
    tmp_path: Path,
    sealing_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    moto = catalog_server.moto
    caplog.set_level(logging.DEBUG)
    keys = f" WITH (access_key_id = '{moto.access_key_id}', secret_access_key = '{moto.secret_access_key}')"
    path = config_path(tmp_path, catalog_server, engine_writer, static=False)  # no [storage] pair at all
    with local_session(path) as local:
        local.sql(create_sql(sales, keys))
        expected = rows(local, PRUNED)
    with distributed_session(path, pool) as s:
        sent = tickets_of(s)
        assert rows(s, PRUNED) == expected
        assert rows(s, "SELECT sum(id) AS total FROM ext.sales WHERE region = 'us'") == [{"total": 26}]
    credentials = [c for _, ticket in sent for c in ticket.credentials]
    assert credentials and all(c.source == pb.CREDENTIAL_SOURCE_STATIC for c in credentials)
    assert {c.secret_access_key for c in credentials} == {moto.secret_access_key}
    assert "files (credentials: static)" in pool.logs()
    for text in (pool.logs(), caplog.text):
        assert moto.secret_access_key not in text
        assert sealing_key not in text
