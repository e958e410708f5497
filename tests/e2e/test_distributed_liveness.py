"""Liveness of distributed scans on real ``sqe-worker`` processes (loopback gRPC, moto + ``sqe-catalog``).

- A coordinator that stops answering (frozen with SIGSTOP: to the worker it is a coordinator lost to a network
  partition; a process killed on the same machine has its sockets closed by the kernel at once) loses its
  fragment slot on the worker through gRPC keepalive, instead of holding it for the TCP timeouts (hours).
- A worker whose fragment stalls (its object store hangs, through ``tests/helpers/fault_proxy.py``) while it keeps
  answering Health has the fragment retried on another worker, by the missing progress heartbeats.
- A fragment that progresses without sending anything (a partial aggregate of a slowly read file) is not cut.
- A frozen worker fails the coordinator's calls on its connection through the channel's keepalive, even with no
  heartbeats and no idle health checks.

Intervals are short and set per test; nothing asserts a duration beyond "eventually, within a generous bound".
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from sqe.config import load_config
from sqe.distributed.coordinator.client import WorkerClient
from sqe.execution.local import QueryCancelledError
from sqe.session import Session
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.e2e.test_distributed import (
    WRITER_GRANTS,
    Tables,
    TicketLog,
    WorkerPools,
    coordinator_overrides,
    distributed_session,
    tables,  # noqa: F401  (the module-scoped table fixture)
    worker_factory,  # noqa: F401  (the module-scoped pool fixture)
)
from tests.helpers.fault_proxy import FaultProxy
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import CatalogServer

pytestmark = pytest.mark.e2e

# A client that runs one Execute call, reads its first message (the fragment now holds a slot), says so and waits.
_HOLDING_CLIENT = """
import sys, time
from sqe.distributed.protocol._proto import worker_pb2 as pb, worker_pb2_grpc
import grpc
address, token, ticket_path = sys.argv[1:4]
stub = worker_pb2_grpc.WorkerStub(grpc.insecure_channel(address))
with open(ticket_path, "rb") as fh:
    ticket = pb.ScanTicket.FromString(fh.read())
stream = stub.Execute(ticket, metadata=(("authorization", "Bearer " + token),))
next(stream)
print("running", flush=True)
time.sleep(3600)
"""


@pytest.fixture
def proxy(catalog_server: CatalogServer) -> Iterator[FaultProxy]:
    """A fault proxy in front of moto that forwards the client's Host (SigV4 signs it)."""
    running = FaultProxy(catalog_server.moto.url, keep_host=True)
    running.start()
    yield running
    running.stop()


def _proxied_config(server: CatalogServer, source: Tables, proxy: FaultProxy, path: Path) -> Path:
    """The reader's config with the object store reached through ``proxy`` (by the coordinator and the workers)."""
    return write_sqe_config(path, server.url, source.reader, server.moto, storage={"endpoint": proxy.url})


def _query_in_thread(session: Session, sql: str) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["table"] = session.sql(sql).arrow()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_a_frozen_coordinators_fragment_slot_is_freed_on_the_worker(
    catalog_server: CatalogServer,
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    tmp_path: Path,
) -> None:
    pool = worker_factory.pool(1, "--max-fragments", "1", "--keepalive-ms", "500", "--keepalive-timeout-ms", "1000")
    worker = pool.workers[0]
    path = write_sqe_config(tmp_path / "reader.toml", catalog_server.url, tables.reader, catalog_server.moto)
    config = load_config(path, env={}, overrides=coordinator_overrides(pool))
    with distributed_session(config) as session:  # a real ticket, with the reader's real keys
        log = TicketLog().attach(session)
        session.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE true").fetchall()
    ticket = log.tickets[0][1]
    ticket.fragment_id = f"held-{uuid.uuid4().hex[:8]}"
    ticket.pace_ms_per_file = 120_000  # left alone, the fragment would hold its slot for minutes
    ticket_path = tmp_path / "ticket.bin"
    ticket_path.touch(0o600)
    ticket_path.write_bytes(ticket.SerializeToString())
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDING_CLIENT, worker.address, pool.token, str(ticket_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    client = WorkerClient(worker.address, pool.token, tls_ca=None, max_message_bytes=1 << 20)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"running"
        assert client.health(timeout=5).running_fragments == 1  # the slot is taken: the worker is at capacity
        os.kill(holder.pid, signal.SIGSTOP)  # the coordinator stops answering, its connection stays open
        wait_until(
            lambda: client.health(timeout=5).running_fragments == 0, timeout=40, what="the worker freed the slot"
        )
        assert client.stats(timeout=5).fragments_cancelled >= 1
    finally:
        holder.kill()  # a stopped process is killed too
        holder.wait(10)
        client.close()


def _one_data_file(server: CatalogServer, source: Tables) -> str:
    """A path pattern matching one data file of ``events`` (the first one its scan plans)."""
    table = pyiceberg_catalog(server, source.reader).load_table((source.namespace, "events"))
    name = next(iter(table.scan().plan_files())).file.file_path.rsplit("/", 1)[1]
    return "/" + re.escape(name) + "$"


def test_a_stalled_fragment_is_retried_on_another_worker(
    catalog_server: CatalogServer,
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    proxy: FaultProxy,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = worker_factory.pool(2)
    path = _proxied_config(catalog_server, tables, proxy, tmp_path / "reader.toml")
    config = load_config(path, env={}, overrides=coordinator_overrides(pool))
    # Reads of one data file hang (the store never answers them: a read timeout or the S3 client's retries would
    # take minutes) until the coordinator has given that fragment up and moved it; then the store recovers.
    victim = _one_data_file(catalog_server, tables)
    proxy.inject("GET", victim, 0, times=10_000, delay=600)
    # The worker answers its health checks all along (every 0.5 s of silence): they must not hide the stall.
    options = {"heartbeat_seconds": 0.15, "stall_heartbeats": 8, "idle_timeout_seconds": 0.5, "max_attempts": 4}
    caplog.set_level(logging.WARNING, logger="sqe.distributed")
    with distributed_session(config, **options) as session:
        executor = session.distributed_executor
        assert executor is not None
        thread, result = _query_in_thread(session, f"SELECT id FROM {tables.namespace}.events")
        wait_until(lambda: executor.stats.fragments_retried >= 1, timeout=60, what="the fragment was moved")
        hung = proxy.count("GET", victim)
        proxy.reset()
        thread.join(60)
        assert not thread.is_alive(), "the query hangs on the stalled fragment"
        assert "error" not in result, result.get("error")
    assert hung >= 1 and proxy.count("GET", victim) >= 1  # it hung, and was served once the store recovered
    assert "stalled, no progress" in caplog.text
    assert sorted(result["table"].column("id").to_pylist()) == list(range(tables.rows))
    # The stalled worker was also told so explicitly (Cancel), not only by the end of its call.
    lines = [line for line in caplog.text.splitlines() if "stalled, no progress" in line]
    stalled = [w for w in pool.workers if any(f"worker {w.address}, fragment" in line for line in lines)]
    assert stalled
    wait_until(
        lambda: any(re.search(r"cancel: \d+ fragment", w.log_text()) for w in stalled),
        timeout=30,
        what="the stalled worker got the coordinator's Cancel call",
    )


SLOW_ROWS = 40_000
SLOW_ROW_GROUP = 1_000


@pytest.fixture(scope="module")
def slow_table(catalog_server: CatalogServer, tables: Tables) -> str:  # noqa: F811
    """One data file of many row groups: read through a slow store it takes many reads, none long."""
    writer = catalog_server.principal_with_grants(f"live_writer_{uuid.uuid4().hex[:6]}", WRITER_GRANTS)
    catalog = pyiceberg_catalog(catalog_server, writer)
    rows = pa.table(
        {
            "grp": pa.array([("a", "b", "c")[i % 3] for i in range(SLOW_ROWS)], pa.string()),
            "amount": pa.array(range(SLOW_ROWS), pa.int64()),
            # Unread and incompressible: it keeps the read columns of each row group apart (one read each).
            "padding": pa.array([os.urandom(32) for _ in range(SLOW_ROWS)], pa.binary()),
        }
    )
    properties = {"write.parquet.row-group-limit": str(SLOW_ROW_GROUP)}
    table = catalog.create_table((tables.namespace, "slow"), schema=rows.schema, properties=properties)
    table.append(rows)
    return f"{tables.namespace}.slow"


def test_a_long_fragment_that_progresses_silently_is_not_cut(
    catalog_server: CatalogServer,
    tables: Tables,  # noqa: F811
    slow_table: str,
    worker_factory: WorkerPools,  # noqa: F811
    proxy: FaultProxy,
    tmp_path: Path,
) -> None:
    # Without the data cache, which would fetch this small file whole in one read.
    pool = worker_factory.pool(1, "--data-cache-bytes", "0", "--decoded-cache-bytes", "0")
    path = _proxied_config(catalog_server, tables, proxy, tmp_path / "reader.toml")
    config = load_config(path, env={}, overrides=coordinator_overrides(pool))
    # Every read of the data file is slow (but answered): the partial aggregate sends nothing until its end,
    # far longer than the stall limit (0.15 s x 12), while reading one row group after another.
    proxy.inject("GET", r"/slow/data/.*\.parquet", 0, times=10_000, delay=0.4)
    options = {"heartbeat_seconds": 0.15, "stall_heartbeats": 12, "idle_timeout_seconds": 600.0, "max_attempts": 1}
    sql = f"SELECT grp, count(*) AS n, sum(amount) AS s FROM {slow_table} GROUP BY grp"
    with distributed_session(config, **options) as session:
        log = TicketLog().attach(session)
        answer = sorted(session.sql(sql).fetchall())
        executor = session.distributed_executor
        assert executor is not None and executor.stats.fragments_retried == 0
    assert all(ticket.HasField("partial_aggregate") for _, ticket in log.tickets)
    expected = {g: [i for i in range(SLOW_ROWS) if ("a", "b", "c")[i % 3] == g] for g in ("a", "b", "c")}
    assert answer == [(g, len(ids), sum(ids)) for g, ids in expected.items()]
    # It did outlast the stall limit several times over: far more slow reads than a few run at once in 1.8 s.
    assert proxy.outcomes["delayed"] >= 30


@contextmanager
def _a_worker_frozen_mid_query(
    server: CatalogServer, source: Tables, workers: WorkerPools, tmp_path: Path, options: dict[str, Any]
) -> Iterator[tuple[Session, threading.Thread, dict[str, Any], str]]:
    """``SELECT id FROM events`` over two workers, the first frozen (SIGSTOP: its connections stay open, it answers
    nothing) once files are being read, and thawed on exit: the session, the query's thread and result, and the
    frozen worker's address."""
    pool = workers.pool(2, "--max-files-in-flight", "1")
    path = write_sqe_config(tmp_path / "reader.toml", server.url, source.reader, server.moto)
    config = load_config(path, env={}, overrides=coordinator_overrides(pool))
    frozen = pool.workers[0]
    with distributed_session(config, **options) as session:
        thread, result = _query_in_thread(session, f"SELECT id FROM {source.namespace}.events")
        wait_until(lambda: (session.progress() or {}).get("files_done", 0) >= 1, timeout=30, what="files read")
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            yield session, thread, result, frozen.address
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)


def test_a_frozen_worker_fails_the_coordinators_calls_through_keepalive(
    catalog_server: CatalogServer,
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No heartbeats and no idle health checks here: only the channel's keepalive notices the frozen worker."""
    options = {
        "slots_per_worker": 1,
        "pace_ms_per_file": 200,
        "heartbeat_seconds": 0,
        "idle_timeout_seconds": 600.0,
        "keepalive_seconds": 2.0,
        "keepalive_timeout_seconds": 1.0,
    }
    caplog.set_level(logging.WARNING, logger="sqe.distributed")
    with _a_worker_frozen_mid_query(catalog_server, tables, worker_factory, tmp_path, options) as running:
        _, thread, result, frozen = running
        thread.join(60)
        assert not thread.is_alive(), "the query waits on the frozen worker"
        assert "error" not in result, result.get("error")
    assert f"worker {frozen}" in caplog.text and "UNAVAILABLE" in caplog.text
    assert sorted(result["table"].column("id").to_pylist()) == list(range(tables.rows))


def _frozen_worker_options(rpc_timeout: float) -> dict[str, Any]:
    """No heartbeats and a keepalive too slow to matter here: only the idle health check notices a frozen
    worker, after ``rpc_timeout`` of no answer."""
    return {
        "slots_per_worker": 1,
        "pace_ms_per_file": 200,
        "heartbeat_seconds": 0,
        "idle_timeout_seconds": 0.3,
        "rpc_timeout_seconds": rpc_timeout,
        "keepalive_seconds": 600.0,
    }


def test_a_health_check_of_a_frozen_worker_never_holds_up_the_callers_thread(
    catalog_server: CatalogServer,
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The caller's thread hands out batches and sees a cancel while the frozen worker's check waits its 30 s:
    it used to wait with it, and then again for each Cancel call to that worker."""
    options = _frozen_worker_options(rpc_timeout=30.0)
    with _a_worker_frozen_mid_query(catalog_server, tables, worker_factory, tmp_path, options) as running:
        session, thread, result, _ = running
        time.sleep(1.0)  # its stream is silent past the idle timeout: the health check is on its way
        session.interrupt()
        thread.join(10)
        assert not thread.is_alive(), "the caller's thread waits on the frozen worker's health check"
    assert isinstance(result.get("error"), QueryCancelledError), result


def test_an_unanswered_health_check_moves_the_fragment_to_another_worker(
    catalog_server: CatalogServer,
    tables: Tables,  # noqa: F811
    worker_factory: WorkerPools,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sqe.distributed")
    options = _frozen_worker_options(rpc_timeout=1.0)
    with _a_worker_frozen_mid_query(catalog_server, tables, worker_factory, tmp_path, options) as running:
        session, thread, result, frozen = running
        thread.join(60)
        assert not thread.is_alive(), "the query waits on the frozen worker"
        assert "error" not in result, result.get("error")
        executor = session.distributed_executor
        assert executor is not None and executor.stats.fragments_retried >= 1
    assert f"worker {frozen}" in caplog.text
    assert sorted(result["table"].column("id").to_pylist()) == list(range(tables.rows))
