"""Distributed scans on real ``sqe-worker`` processes (loopback gRPC) against moto + ``sqe-catalog`` (flow tier).

The coordinator runs inside the test process as a normal SQE session with ``[coordinator] workers`` set; the
workers are subprocesses started with a token file. The same queries run locally and distributed and must give
the same answers; tickets actually sent are recorded through the executor's observer hook.
"""
# Counts below carry "WHERE true": a bare `SELECT count(*) FROM t` is answered from manifest record counts
# (sqe.execution.metadata_answers) and would never reach a worker.

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa
import pytest

import sqe.api
from sqe.catalog.rest import RestTableProvider
from sqe.config import SQEConfig, load_config
from sqe.distributed.coordinator import DistributedOptions, DistributedScanStream
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol._proto import worker_pb2_grpc
from sqe.errors import CredentialError, NoVendedCredentialsError, WorkerError
from sqe.execution.local import QueryCancelledError
from sqe.session import Session
from tests.conftest import WorkerFactory, WorkerProcess, catalog_variant, pyiceberg_catalog, write_sqe_config
from tests.helpers.waiting import wait_until
from workers.auth import BearerTokenInterceptor
from workers.service import WorkerService

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

FILES = 12
ROWS_PER_FILE = 40
WRITER_GRANTS: list[tuple[str, str | None, str | None]] = [
    ("NAMESPACE_FULL_METADATA", None, None),
    ("TABLE_CREATE", None, None),
    ("TABLE_WRITE_DATA", None, None),
]
QUERIES = (
    "SELECT count(*) AS n, sum(amount) AS total FROM {ns}.events",
    "SELECT region, count(*) AS n, sum(amount) AS total FROM {ns}.events GROUP BY region ORDER BY region",
    "SELECT id, note FROM {ns}.events WHERE amount > 900 ORDER BY id",
    "SELECT e.id, r.label FROM {ns}.events e JOIN {ns}.regions r ON e.region = r.region WHERE e.id % 37 = 0 "
    "ORDER BY e.id",
    "SELECT a.id FROM {ns}.events a JOIN {ns}.events b ON a.id = b.id + 1 WHERE a.id < 50 ORDER BY a.id",
    "SELECT * FROM {ns}.events ORDER BY id LIMIT 5",
)


# ---------------------------------------------------------------------------------------------------------
# Worker pools (also used by test_distributed_ceph.py)


@dataclass
class WorkerPool:
    token: str = field(repr=False)
    workers: list[WorkerProcess]

    @property
    def addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    def logs(self) -> str:
        return "\n".join(w.log_text() for w in self.workers)


class WorkerPools:
    """Pools of real ``sqe-worker`` processes (the session's ``worker_process_factory``) sharing one coordinator
    token; every worker a module started is stopped when the module ends."""

    def __init__(self, factory: WorkerFactory) -> None:
        self._factory = factory
        self.token = secrets.token_hex(16)
        self.started: list[WorkerProcess] = []

    def pool(self, count: int, *extra: str) -> WorkerPool:
        workers = [self._factory.start("--log-level", "DEBUG", *extra, token=self.token) for _ in range(count)]
        self.started.extend(workers)
        return WorkerPool(self.token, workers)

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


@pytest.fixture(scope="module")
def worker_factory(worker_process_factory: WorkerFactory) -> Iterator[WorkerPools]:
    pools = WorkerPools(worker_process_factory)
    try:
        yield pools
    finally:
        pools.stop_all()


def coordinator_overrides(pool: WorkerPool, **coordinator: Any) -> dict[str, Any]:
    return {"coordinator": {"workers": pool.addresses, "token": pool.token, **coordinator}}


def distributed_session(config: SQEConfig, **options: Any) -> Session:
    """A session whose scans run on ``config``'s workers (small fragments so every worker gets some)."""
    settings: dict[str, Any] = {"max_files_per_fragment": 2, "idle_timeout_seconds": 10.0, **options}
    return Session(RestTableProvider(config), config, distributed=DistributedOptions(**settings))


@dataclass
class TicketLog:
    """Every ticket and push the coordinator sent (through the executor's observer hooks)."""

    tickets: list[tuple[str, pb.ScanTicket]] = field(default_factory=list)
    pushes: list[tuple[float, str, pb.RefreshRequest]] = field(default_factory=list)

    def attach(self, session: Session) -> TicketLog:
        executor = session.distributed_executor
        assert executor is not None
        executor.ticket_observers.append(lambda worker, ticket: self.tickets.append((worker, ticket)))
        executor.push_observers.append(lambda worker, request: self.pushes.append((time.time(), worker, request)))
        return self

    def credential_sets(self) -> list[pb.CredentialSet]:
        sets = [c for _, ticket in self.tickets for c in ticket.credentials]
        return sets + [c for _, _, request in self.pushes for c in request.credentials]

    def secrets(self) -> set[str]:
        sets = self.credential_sets()
        return {s for s in [c.secret_access_key for c in sets] + [c.session_token for c in sets] if s}


def worker_stats(session: Session) -> dict[str, pb.StatsResponse]:
    executor = session.distributed_executor
    assert executor is not None
    return executor.worker_stats()


# ---------------------------------------------------------------------------------------------------------
# Catalog fixtures


@dataclass(frozen=True)
class Tables:
    namespace: str
    reader: CatalogPrincipal
    rows: int


def _events(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array([("EU", "US", "APAC")[i % 3] for i in ids], pa.string()),
            "amount": pa.array([(i * 37) % 1000 for i in ids], pa.int64()),
            "note": pa.array([f"note-{i}" for i in ids], pa.string()),
        }
    )


@pytest.fixture(scope="module")
def tables(catalog_server: CatalogServer) -> Tables:
    suffix = uuid.uuid4().hex[:6]
    writer = catalog_server.principal_with_grants(f"dist_writer_{suffix}", WRITER_GRANTS)
    reader = catalog_server.principal_with_grants(f"dist_reader_{suffix}", [("TABLE_READ_DATA", None, None)])
    catalog = pyiceberg_catalog(catalog_server, writer)
    namespace = f"dist_{suffix}"
    catalog.create_namespace(namespace)
    events = catalog.create_table((namespace, "events"), schema=_events(0, 1).schema)
    for n in range(FILES):  # one data file per append
        events.append(_events(n * ROWS_PER_FILE, ROWS_PER_FILE))
    regions = pa.table({"region": ["EU", "US", "APAC"], "label": ["Europe", "United States", "Asia-Pacific"]})
    catalog.create_table((namespace, "regions"), schema=regions.schema).append(regions)
    return Tables(namespace, reader, FILES * ROWS_PER_FILE)


BIG_FILES = 3
BIG_ROWS_PER_FILE = 20_000  # a file's batch is larger than a 64 KiB message


@pytest.fixture(scope="module")
def big_files(catalog_server: CatalogServer, tables: Tables) -> str:
    """``<namespace>.events_big``: 3 files whose batches a worker with 64 KiB messages sends in slices."""
    writer = catalog_server.principal_with_grants(f"dist_big_writer_{uuid.uuid4().hex[:6]}", WRITER_GRANTS)
    catalog = pyiceberg_catalog(catalog_server, writer)
    table = catalog.create_table((tables.namespace, "events_big"), schema=_events(0, 1).schema)
    for n in range(BIG_FILES):
        table.append(_events(n * BIG_ROWS_PER_FILE, BIG_ROWS_PER_FILE))
    return f"{tables.namespace}.events_big"


@pytest.fixture(scope="module")
def workers(worker_factory: WorkerPools) -> WorkerPool:
    return worker_factory.pool(2)


@pytest.fixture
def reader_config(catalog_server: CatalogServer, tables: Tables, tmp_path: Path) -> Path:
    return write_sqe_config(tmp_path / "reader.toml", catalog_server.url, tables.reader, catalog_server.moto)


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    rows = table.to_pylist()
    return sorted(rows, key=lambda row: tuple((v is None, str(v)) for v in row.values()))


# ---------------------------------------------------------------------------------------------------------
# Tests


def test_distributed_answers_equal_local_answers(reader_config: Path, tables: Tables, workers: WorkerPool) -> None:
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    with sqe.api.connect(reader_config) as local, distributed_session(config) as distributed:
        log = TicketLog().attach(distributed)
        before = {address: stats.fragments_completed for address, stats in worker_stats(distributed).items()}
        for query in QUERIES:
            sql = query.format(ns=tables.namespace)
            expected = local.sql(sql).arrow()
            got = distributed.sql(sql).arrow()
            assert got.schema == expected.schema, sql
            assert _sorted(got) == _sorted(expected), sql
        assert distributed.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE true").fetchall() == [
            (tables.rows,)
        ]
        progress = distributed.progress()
        assert progress is not None and progress["files_done"] == progress["files_total"] == FILES
        after = worker_stats(distributed)
    assert log.tickets, "no ticket was sent: the scans did not run on the workers"
    assert all(after[address].fragments_completed > before[address] for address in workers.addresses)


def test_restrictions_apply_on_workers_like_locally(
    catalog_server: CatalogServer,
    tables: Tables,
    workers: WorkerPool,
    tmp_path: Path,
    catalog_reader: CatalogPrincipal,
) -> None:
    grants: list[tuple[str, str | None, str | None]] = [("TABLE_READ_DATA", None, None)]
    restricted = catalog_server.principal_with_grants(f"dist_masked_{uuid.uuid4().hex[:6]}", grants)
    rules = tmp_path / "restrictions.json"
    rules.write_text(
        '{"required-column-projections": [{"field-id": 4, "action": "mask-alphanum"}],'
        ' "required-row-filter": {"type": "not-eq", "left": {"type": "reference", "id": 2}, "right": "US"}}'
    )
    catalog_server.admin_cli(
        "set-restrictions", "--warehouse", catalog_server.warehouse, "--namespace", tables.namespace,
        "--table", "events", "--principal", restricted.name, "--file", str(rules),
    )  # fmt: skip
    # Restricted tables are served only through a trusted reader: the engine exchanges the end user's token
    # with the reader's (RFC 8693) itself, locally and as the coordinator of the workers.
    reader = {"reader_client_id": catalog_reader.client_id, "reader_client_secret": catalog_reader.client_secret}
    path = tmp_path / "masked.toml"
    write_sqe_config(path, catalog_server.url, restricted, catalog_server.moto, catalog=reader)
    config = load_config(path, env={}, overrides=coordinator_overrides(workers))
    sql = f"SELECT id, region, note FROM {tables.namespace}.events WHERE id % 5 = 0"
    with sqe.api.connect(path) as local, distributed_session(config) as distributed:
        log = TicketLog().attach(distributed)
        expected, got = local.sql(sql).arrow(), distributed.sql(sql).arrow()
    assert _sorted(got) == _sorted(expected)
    assert got.num_rows and "US" not in set(got.column("region").to_pylist())
    assert all(note.startswith("xxxx-") for note in got.column("note").to_pylist())
    assert all(ticket.restriction_plan_json for _, ticket in log.tickets)


def test_vended_mode_tickets_never_carry_the_static_key(
    catalog_server: CatalogServer, tables: Tables, workers: WorkerPool, tmp_path: Path
) -> None:
    moto = catalog_server.moto
    static = {"access_key_id": moto.access_key_id, "secret_access_key": moto.secret_access_key}
    path = write_sqe_config(tmp_path / "vended.toml", catalog_server.url, tables.reader, moto, storage=static)
    overrides = coordinator_overrides(workers, distributed_credentials="vended")
    config = load_config(path, env={}, overrides=overrides)
    assert config.catalog.require_vended_credentials and config.static_key_pair() is not None
    with distributed_session(config) as session:
        log = TicketLog().attach(session)
        assert session.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE true").fetchall() == [(tables.rows,)]
    sets = log.credential_sets()
    assert len(log.tickets) >= FILES // 2 and sets
    assert all(c.source == pb.CREDENTIAL_SOURCE_VENDED and c.session_token and c.expires_at_ms for c in sets)
    assert not any(moto.access_key_id in (c.access_key_id, c.secret_access_key) for c in sets)
    assert not any(moto.secret_access_key in ticket.SerializeToString().decode("latin-1") for _, ticket in log.tickets)


def test_tables_without_vended_credentials_fail_in_vended_mode_and_use_static_in_auto(
    catalog_server: CatalogServer, workers: WorkerPool, tmp_path: Path
) -> None:
    moto = catalog_server.moto
    static = {"access_key_id": moto.access_key_id, "secret_access_key": moto.secret_access_key}
    with catalog_variant(tmp_path, moto, vend_credentials=False) as plain:
        writer = plain.principal_with_grants("plain_writer", WRITER_GRANTS)
        from pyiceberg.catalog.rest import RestCatalog

        catalog = RestCatalog(
            "plain", uri=plain.url, warehouse=plain.warehouse, credential=writer.credential, scope="PRINCIPAL_ROLE:ALL",
            **{"s3.endpoint": moto.url, "s3.access-key-id": moto.access_key_id,
               "s3.secret-access-key": moto.secret_access_key, "s3.region": moto.region},
        )  # fmt: skip
        namespace = f"plain_{uuid.uuid4().hex[:6]}"
        catalog.create_namespace(namespace)
        catalog.create_table((namespace, "t"), schema=_events(0, 1).schema).append(_events(0, 30))
        catalog_keys = {"require_vended_credentials": False}
        path = write_sqe_config(tmp_path / "plain.toml", plain.url, writer, moto, catalog=catalog_keys, storage=static)
        vended = load_config(path, env={}, overrides=coordinator_overrides(workers, distributed_credentials="vended"))
        with distributed_session(vended) as session, pytest.raises(NoVendedCredentialsError, match="vended"):
            session.sql(f"SELECT count(*) FROM {namespace}.t WHERE true").fetchall()
        auto = load_config(path, env={}, overrides=coordinator_overrides(workers, distributed_credentials="auto"))
        with distributed_session(auto) as session:
            log = TicketLog().attach(session)
            assert session.sql(f"SELECT count(*) FROM {namespace}.t WHERE true").fetchall() == [(30,)]
    assert log.tickets and all(c.source == pb.CREDENTIAL_SOURCE_STATIC for c in log.credential_sets())


def test_a_killed_worker_costs_no_rows_and_no_duplicates(
    reader_config: Path, tables: Tables, worker_factory: WorkerPools
) -> None:
    pool = worker_factory.pool(2, "--max-files-in-flight", "1")
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(pool))
    sql = f"SELECT id, amount FROM {tables.namespace}.events"
    with sqe.api.connect(reader_config) as local:
        expected = local.sql(sql).arrow()
    with distributed_session(config, slots_per_worker=1, pace_ms_per_file=250) as session:
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(table=session.sql(sql).arrow()), daemon=True)
        thread.start()
        wait_until(lambda: (session.progress() or {}).get("files_done", 0) >= 2, "two files read")
        victim = pool.workers[0]
        os.kill(victim.proc.pid, signal.SIGKILL)
        thread.join(60)
        executor = session.distributed_executor
        assert executor is not None and executor.stats.fragments_retried >= 1
    assert victim.proc.wait(5) == -signal.SIGKILL
    got = result["table"]
    assert got.num_rows == expected.num_rows == tables.rows
    assert sorted(got.column("id").to_pylist()) == list(range(tables.rows))  # every row exactly once


def test_fragment_batches_reach_the_consumer_before_the_fragment_completes(
    reader_config: Path, tables: Tables, workers: WorkerPool
) -> None:
    """Streaming, by order of events: with one queued batch and 6 batches per fragment, the consumer holds the
    first batch while no fragment can have completed (a fragment held back until ``complete`` could not)."""
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    with distributed_session(config, slots_per_worker=1, max_files_per_fragment=6, max_queued_batches=1) as session:
        session.sql(f"SELECT id FROM {tables.namespace}.events").fetchall()
        stream = session.last_streams[-1]
        assert isinstance(stream, DistributedScanStream)
        executor = session.distributed_executor
        assert executor is not None
        events: list[str] = []
        executor.batch_observers.append(lambda worker, fragment, rows: events.append(f"batch {fragment}"))
        completed = executor.stats.fragments_completed
        reader = pa.RecordBatchReader.from_stream(stream)  # a fresh distributed run, pulled batch by batch
        first = reader.read_next_batch()
        assert first.num_rows == ROWS_PER_FILE
        assert executor.stats.fragments_completed == completed  # both fragments are still streaming
        events.append("consumer has its first batch")
        rest = reader.read_all()
    assert first.num_rows + rest.num_rows == tables.rows
    assert executor.stats.fragments_completed == completed + 2
    assert events.index("consumer has its first batch") < len(events) - 1  # batches kept coming afterwards
    ids = first.column("id").to_pylist() + rest.column("id").to_pylist()
    assert sorted(ids) == list(range(tables.rows))


def _killer_on_first_batch(victim: Any, from_victim: list[int]) -> Callable[[str, str, int], None]:
    """A batch observer that SIGKILLs ``victim`` once the coordinator forwarded its first batch, and records the rows
    of every batch forwarded from it: messages its stream had already received before the kill are still read and
    forwarded (gRPC delivers them before the stream's failure), so the first batch may not be the last."""

    def kill_on_first_batch(worker: str, fragment: str, rows: int) -> None:
        if worker != victim.address:
            return
        from_victim.append(rows)
        if len(from_victim) == 1:
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait(5)

    return kill_on_first_batch


def test_a_worker_killed_after_forwarding_a_batch_is_resumed_without_duplicates(
    reader_config: Path, big_files: str, worker_factory: WorkerPools
) -> None:
    """The victim (64 KiB messages: a file's batch goes out in slices) is killed right after the coordinator
    forwarded its fragment's first slice; the retry on the other worker (whole batches) re-reads the fragment and
    skips exactly the rows forwarded from the victim, by row position (a slice inside a batch): every row once."""
    victim = worker_factory.pool(1, "--max-files-in-flight", "1", "--max-message-bytes", "65536").workers[0]
    spare = worker_factory.pool(1, "--max-files-in-flight", "1").workers[0]
    pool = WorkerPool(worker_factory.token, [victim, spare])
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(pool))
    sql = f"SELECT * FROM {big_files}"
    with sqe.api.connect(reader_config) as local:
        expected = local.sql(sql).arrow()
    from_victim: list[int] = []
    kill_on_first_batch = _killer_on_first_batch(victim, from_victim)
    options = {"slots_per_worker": 1, "max_files_per_fragment": 6, "pace_ms_per_file": 300}
    with distributed_session(config, **options) as session:
        executor = session.distributed_executor
        assert executor is not None
        executor.batch_observers.append(kill_on_first_batch)
        got = session.sql(sql).arrow()
        stats = executor.stats.snapshot()
    assert victim.proc.returncode == -signal.SIGKILL
    assert from_victim and 0 < from_victim[0] < BIG_ROWS_PER_FILE  # the kill came inside a file
    assert stats["fragments_resumed"] == 1
    assert stats["rows_skipped"] == sum(from_victim)  # re-read by the retry and dropped, nothing more
    assert stats["rows_forwarded"] == expected.num_rows == BIG_FILES * BIG_ROWS_PER_FILE  # each row once
    assert _sorted(got) == _sorted(expected)


class _NoPositionsWorker:
    """A real ``WorkerService`` behind a worker that sends no row positions (``row_positions`` false, batches
    without task index or offset), as the protocol allows: a worker that does not send them."""

    def __init__(self, service: WorkerService) -> None:
        self._service = service

    def Execute(self, request: pb.ScanTicket, context: Any) -> Iterator[pb.ExecuteResponse]:
        for message in self._service.Execute(request, context):
            response = (
                message if isinstance(message, pb.ExecuteResponse) else pb.ExecuteResponse.FromString(message.data)
            )
            kind = response.WhichOneof("payload")
            if kind == "schema":
                response.schema.row_positions = False
            elif kind == "batch":
                response.batch.ClearField("task_index")
                response.batch.ClearField("row_offset")
            yield response

    def __getattr__(self, name: str) -> Any:  # RefreshCredentials, Cancel, Health, Stats, Rewrite: as they are
        return getattr(self._service, name)


def test_a_resumed_fragment_is_never_retried_on_a_stream_without_positions(
    reader_config: Path, big_files: str, worker_factory: WorkerPools
) -> None:
    """The victim forwarded part of a fragment, then died; the only worker left sends no row positions, so the
    rows it re-sends cannot be told apart from those already forwarded: the query fails, it never duplicates."""
    victim = worker_factory.pool(1, "--max-files-in-flight", "1", "--max-message-bytes", "65536").workers[0]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8), interceptors=[BearerTokenInterceptor(worker_factory.token)]
    )
    worker_pb2_grpc.add_WorkerServicer_to_server(_NoPositionsWorker(WorkerService()), server)
    spare = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    overrides = {"coordinator": {"workers": [victim.address, spare], "token": worker_factory.token}}
    config = load_config(reader_config, env={}, overrides=overrides)
    sql = f"SELECT * FROM {big_files}"
    from_victim: list[int] = []
    kill_on_first_batch = _killer_on_first_batch(victim, from_victim)
    options = {"slots_per_worker": 1, "max_files_per_fragment": 6, "pace_ms_per_file": 300}
    try:
        with distributed_session(config, **options) as session:
            executor = session.distributed_executor
            assert executor is not None
            executor.batch_observers.append(kill_on_first_batch)
            streamed: list[int] = []  # what a streaming client (Flight SQL) has been sent when the error comes
            with pytest.raises(WorkerError) as failed:
                for batch in session.sql(sql).reader():
                    streamed.extend(batch.column("id").to_pylist())
    finally:
        server.stop(grace=None)
    assert from_victim and victim.proc.returncode == -signal.SIGKILL
    assert len(streamed) == len(set(streamed)), f"{len(streamed) - len(set(streamed))} rows were streamed twice"
    assert "no row positions" in str(failed.value)


def test_a_worker_killed_before_its_first_batch_is_retried_from_scratch(
    reader_config: Path, tables: Tables, worker_factory: WorkerPools
) -> None:
    """The victim dies while its fragment waits to read its first file: nothing was forwarded, a plain retry."""
    pool = worker_factory.pool(2, "--max-files-in-flight", "1")
    victim = pool.workers[0]
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(pool))
    sql = f"SELECT * FROM {tables.namespace}.events WHERE id < {4 * ROWS_PER_FILE}"
    with sqe.api.connect(reader_config) as local:
        expected = local.sql(sql).arrow()
    forwarded_by: list[str] = []
    options = {"slots_per_worker": 1, "max_files_per_fragment": 6, "pace_ms_per_file": 1500}
    with distributed_session(config, **options) as session:
        executor = session.distributed_executor
        assert executor is not None
        log = TicketLog().attach(session)
        executor.batch_observers.append(lambda worker, fragment, rows: forwarded_by.append(worker))
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(table=session.sql(sql).arrow()), daemon=True)
        thread.start()
        victim_client = executor.client_for(victim.address)
        wait_until(lambda: victim_client.stats(timeout=5).fragments_running >= 1, "a fragment running on the victim")
        os.kill(victim.proc.pid, signal.SIGKILL)  # it is sleeping before its first file (1.5 s pace)
        thread.join(60)
        stats = executor.stats.snapshot()
    assert victim.proc.wait(5) == -signal.SIGKILL
    assert any(worker == victim.address for worker, _ in log.tickets)
    assert victim.address not in forwarded_by
    assert stats["fragments_retried"] >= 1
    assert stats["fragments_resumed"] == stats["rows_skipped"] == 0
    assert _sorted(result["table"]) == _sorted(expected)


def test_cancelling_the_query_cancels_its_fragments(
    reader_config: Path, tables: Tables, worker_factory: WorkerPools
) -> None:
    pool = worker_factory.pool(1, "--max-files-in-flight", "1")
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(pool))
    with distributed_session(config, slots_per_worker=1, pace_ms_per_file=1000) as session:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                session.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE true").fetchall()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_until(lambda: _stat(session, "fragments_running") >= 1, "a fragment running")
        session.interrupt()
        thread.join(30)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], QueryCancelledError)
        wait_until(lambda: _stat(session, "fragments_running") == 0, "no fragment running", timeout=10)
        assert _stat(session, "fragments_cancelled") >= 1
        assert _stat(session, "fragments_completed") == 0


def test_a_wrong_token_is_a_clear_worker_error(reader_config: Path, tables: Tables, workers: WorkerPool) -> None:
    overrides = coordinator_overrides(workers)
    overrides["coordinator"]["token"] = "not-the-token"
    config = load_config(reader_config, env={}, overrides=overrides)
    with distributed_session(config) as session, pytest.raises(WorkerError, match="rejected the coordinator's token"):
        session.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE true").fetchall()


def test_tickets_and_credentials_never_reach_a_log(
    reader_config: Path, tables: Tables, workers: WorkerPool, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    caplog.set_level(logging.DEBUG)
    with distributed_session(config) as session:
        log = TicketLog().attach(session)
        session.sql(f"SELECT count(*), max(note) FROM {tables.namespace}.events").fetchall()
        executor = session.distributed_executor
        assert executor is not None
        [lease] = executor.refresher.leases()
        executor.refresher.refresh_now(lease)  # the catalog serves its cached set again: nothing to push
        text = caplog.text + "\n" + workers.logs() + "\n" + repr(lease) + repr(executor) + repr(session.last_streams)
    leaked = log.secrets() | {workers.token}
    assert log.tickets and leaked
    assert not [s for s in leaked if s in text]
    assert not any(c.access_key_id in text for c in log.credential_sets())


def test_a_table_without_credentials_a_worker_may_use_fails_before_any_ticket(
    catalog_server: CatalogServer, tables: Tables, workers: WorkerPool, tmp_path: Path
) -> None:
    path = write_sqe_config(tmp_path / "static.toml", catalog_server.url, tables.reader, catalog_server.moto,
                            catalog={"require_vended_credentials": False})  # fmt: skip
    config = load_config(path, env={}, overrides=coordinator_overrides(workers, distributed_credentials="static"))
    with distributed_session(config) as session, pytest.raises(CredentialError, match="static"):
        log = TicketLog().attach(session)
        session.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE true").fetchall()
    assert log.tickets == []


def test_a_worker_that_stops_answering_is_replaced(
    reader_config: Path, tables: Tables, worker_factory: WorkerPools, caplog: pytest.LogCaptureFixture
) -> None:
    pool = worker_factory.pool(2, "--max-files-in-flight", "1")
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(pool))
    options = {"slots_per_worker": 1, "pace_ms_per_file": 200, "idle_timeout_seconds": 1.0, "rpc_timeout_seconds": 1.0}
    frozen = pool.workers[0]
    with distributed_session(config, **options) as session:
        result: dict[str, Any] = {}
        sql = f"SELECT id FROM {tables.namespace}.events"
        thread = threading.Thread(target=lambda: result.update(table=session.sql(sql).arrow()), daemon=True)
        thread.start()
        wait_until(lambda: (session.progress() or {}).get("files_done", 0) >= 1, "a file read")
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            thread.join(60)
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        executor = session.distributed_executor
        assert executor is not None and executor.stats.fragments_retried >= 1
    assert f"worker {frozen.address}" in caplog.text and "stopped answering" in caplog.text
    assert sorted(result["table"].column("id").to_pylist()) == list(range(tables.rows))


def test_unreachable_workers_fail_the_query_clearly(reader_config: Path, tables: Tables) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"  # closed again below: nothing listens there
    config = load_config(reader_config, env={}, overrides={"coordinator": {"workers": [nobody], "token": "t"}})
    with distributed_session(config) as session, pytest.raises(WorkerError, match="no worker left"):
        session.sql(f"SELECT count(*) FROM {tables.namespace}.events WHERE true").fetchall()


def test_tls_workers_are_reached_through_the_configured_ca(
    reader_config: Path, tables: Tables, worker_factory: WorkerPools, tmp_path: Path
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    pool = worker_factory.pool(1, "--tls-cert", str(cert), "--tls-key", str(key))
    sql = f"SELECT count(*) FROM {tables.namespace}.events WHERE true"
    trusted = load_config(reader_config, env={}, overrides=coordinator_overrides(pool, tls_ca=str(cert)))
    with distributed_session(trusted) as session:
        assert session.sql(sql).fetchall() == [(tables.rows,)]
    plaintext = load_config(reader_config, env={}, overrides=coordinator_overrides(pool))
    with distributed_session(plaintext) as session, pytest.raises(WorkerError):
        session.sql(sql).fetchall()


def _stat(session: Session, name: str) -> int:
    return sum(int(getattr(stats, name)) for stats in worker_stats(session).values())


def test_every_open_of_a_distributed_stream_is_a_run_of_its_own(
    reader_config: Path, tables: Tables, workers: WorkerPool
) -> None:
    """Two readers of one stream (as DuckDB opens a table read twice in one statement) get distinct fragment ids,
    so a worker never refuses the second as a duplicate of the first."""
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    with distributed_session(config) as session:
        log = TicketLog().attach(session)
        session.sql(f"SELECT id FROM {tables.namespace}.events WHERE amount > 900").arrow()
        stream = session.last_streams[0]
        assert isinstance(stream, DistributedScanStream)
        log.tickets.clear()
        first, second = stream.reader(), stream.reader()
        assert first.read_all().num_rows == second.read_all().num_rows > 0
    ids = [ticket.fragment_id for _, ticket in log.tickets]
    assert len(ids) > 2 and len(set(ids)) == len(ids)
