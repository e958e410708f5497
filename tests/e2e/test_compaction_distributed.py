"""OPTIMIZE with ``[coordinator] workers``: real ``sqe-worker`` processes rewrite the bins with the tickets'
vended (write) credentials, the coordinator commits one ``replace`` snapshot. A worker SIGKILLed after writing an
output leaves no orphan (the coordinator deletes the attempt's paths, then retries elsewhere); a concurrent delete
of an input fails the compaction and removes its outputs; a concurrent append survives."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import EqualTo

from sqe.catalog.rest import RestTableProvider
from sqe.config import load_config
from sqe.distributed.coordinator import DistributedOptions
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.errors import CompactionConflictError, DataFileError
from sqe.session import Session
from tests.conftest import write_sqe_config
from tests.e2e.test_compaction import SCHEMA, fingerprint, small_files_table
from tests.e2e.test_distributed import WorkerPool, WorkerPools, coordinator_overrides, worker_factory
from tests.helpers.orphans import data_objects, referenced
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, WorkerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("bogus_aws_env")]
__all__ = ["worker_factory"]  # the module-scoped pool fixture, re-used from test_distributed
TARGET = "64 * 1024 * 1024"


def session_on(pool: WorkerPool, server: CatalogServer, writer: CatalogPrincipal, tmp_path: Path) -> Session:
    path = write_sqe_config(tmp_path / "sqe.toml", server.url, writer, server.moto)
    config = load_config(path, env={}, overrides=coordinator_overrides(pool, distributed_credentials="vended"))
    return Session(RestTableProvider(config), config, distributed=DistributedOptions(max_attempts=3))


def stats(worker: WorkerProcess) -> Any:
    return worker.stub().Stats(pb.StatsRequest(), metadata=worker.metadata(), timeout=5)


def test_workers_rewrite_and_the_coordinator_commits_one_replace(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, worker_factory: WorkerPools, tmp_path: Path
) -> None:
    pool = worker_factory.pool(2)
    name, table = small_files_table(catalog_server, engine_writer, 40)
    with session_on(pool, catalog_server, engine_writer, tmp_path) as s:
        before = fingerprint(s, name)
        result = s.sql(f"OPTIMIZE {name} WITH (target_file_size = {TARGET})").arrow().to_pylist()[0]
        assert result["rewritten_files"] == 40 and result["added_files"] >= 1
        assert fingerprint(s, name) == before
    table.refresh()
    assert table.current_snapshot().summary.operation.value == "replace"
    live = {t.file.file_path for t in table.scan().plan_files()}
    assert len(live) == result["added_files"] and all("/compact-" in p for p in live)
    written = sum(stats(w).rewrite_files_written for w in pool.workers)
    assert written == result["added_files"], "the workers, not the coordinator, wrote the new files"
    assert data_objects(catalog_server, table) <= referenced(table)
    assert catalog_server.moto.secret_access_key not in pool.logs()


def test_a_worker_killed_mid_rewrite_leaves_no_orphan(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, worker_factory: WorkerPools, tmp_path: Path
) -> None:
    slow = worker_factory.pool(1, "--pace-ms-per-file", "1500").workers[0]
    fast = worker_factory.pool(1).workers[0]
    pool = WorkerPool(worker_factory.token, [slow, fast])  # one bin: its first attempt goes to the slow worker
    name, table = small_files_table(catalog_server, engine_writer, 3)

    def kill_after_first_output() -> None:
        wait_until(lambda: stats(slow).rewrite_files_written >= 1, "the slow worker wrote a file", timeout=60)
        slow.proc.send_signal(signal.SIGKILL)  # an output is written but not yet reported or committed

    killer = threading.Thread(target=kill_after_first_output, daemon=True)
    killer.start()
    with session_on(pool, catalog_server, engine_writer, tmp_path) as s:
        before = fingerprint(s, name)
        result = s.sql(f"OPTIMIZE {name} WITH (target_file_size = {TARGET})").arrow().to_pylist()[0]
        killer.join(timeout=30)
        assert slow.proc.wait(timeout=10) == -signal.SIGKILL
        assert result["rewritten_files"] == 3
        assert fingerprint(s, name) == before
    assert stats(fast).rewrites_completed >= 1
    objects = data_objects(catalog_server, table)
    assert objects <= referenced(table), f"orphans: {sorted(objects - referenced(table))}"
    assert sum("/compact-" in p for p in objects) == result["added_files"]


def _optimize_in_background(session: Session, name: str) -> tuple[threading.Thread, list[BaseException], list[Any]]:
    errors: list[BaseException] = []
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(session.sql(f"OPTIMIZE {name} WITH (target_file_size = {TARGET})").arrow().to_pylist())
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors, results


def test_concurrent_delete_of_an_input_fails_and_removes_worker_outputs(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, worker_factory: WorkerPools, tmp_path: Path
) -> None:
    pool = worker_factory.pool(1, "--pace-ms-per-file", "700")
    name, table = small_files_table(catalog_server, engine_writer, 4)
    with session_on(pool, catalog_server, engine_writer, tmp_path) as s:
        started = stats(pool.workers[0]).rewrites_started
        thread, errors, _ = _optimize_in_background(s, name)
        wait_until(lambda: stats(pool.workers[0]).rewrites_started > started, "a rewrite started", timeout=60)
        table.delete(EqualTo("id", 0))  # another writer removes small-0000 (its only row) meanwhile
        thread.join(timeout=120)
    assert len(errors) == 1 and isinstance(errors[0], CompactionConflictError)
    assert "a concurrent commit removed 1 of its input files" in str(errors[0])
    table.refresh()
    assert table.current_snapshot().summary.operation.value != "replace"
    assert not any("/compact-" in p for p in data_objects(catalog_server, table))


def test_concurrent_append_survives_a_distributed_compaction(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, worker_factory: WorkerPools, tmp_path: Path
) -> None:
    pool = worker_factory.pool(1, "--pace-ms-per-file", "700")
    name, table = small_files_table(catalog_server, engine_writer, 4)
    with session_on(pool, catalog_server, engine_writer, tmp_path) as s:
        before = fingerprint(s, name)[0]
        started = stats(pool.workers[0]).rewrites_started
        thread, errors, results = _optimize_in_background(s, name)
        wait_until(lambda: stats(pool.workers[0]).rewrites_started > started, "a rewrite started", timeout=60)
        table.append(pa.table({"id": [1000], "name": ["late"]}, schema=SCHEMA))
        thread.join(timeout=120)
        assert not errors and results[0][0]["rewritten_files"] == 4
        after = fingerprint(s, name)[0]
        assert after[0] == before[0] + 1 and after[1] == before[1] + 1000
        assert s.sql(f"SELECT name FROM {name} WHERE id = 1000").fetchall() == [("late",)]


def _add_short_group_file(server: CatalogServer, table: Any) -> None:
    """Add a file of two row groups of 1,000 rows whose footer says 1,005 and 995 (every count agreeing: 2,000):
    pyarrow reads 1,000 of the first group and 995 of the second, without error."""
    from tests.unit.sqe.execution.test_row_group_rows import restated_counts

    moto = server.moto
    ids = list(range(1000, 3000))
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": ids, "name": [f"n{v}" for v in ids]}, schema=SCHEMA), buffer, row_group_size=1000)
    data = restated_counts(buffer.getvalue().to_pybytes(), 1000, {0: 1005, 1: 995})
    bucket, _, prefix = table.location().removeprefix("s3://").partition("/")
    key = f"{prefix}/data/short-groups.parquet"
    moto.client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    table.add_files([f"s3://{bucket}/{key}"])


def test_workers_refuse_a_row_group_short_of_its_stated_rows_in_scans_and_rewrites(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, worker_factory: WorkerPools, tmp_path: Path
) -> None:
    # Before: a worker's rewrite (pyiceberg's ArrowScan) read 1,995 of the file's 2,000 rows without error and the
    # coordinator committed them (count(*) 2,006 before, 2,001 after). A worker's scan refused the file (its
    # decoded-cache reader counts) but as "internal error (QueryError)", retried on every worker, then a
    # WorkerError. Now the worker's reason reaches the query as a DataFileError, not retried.
    pool = worker_factory.pool(2)
    name, table = small_files_table(catalog_server, engine_writer, 3)
    _add_short_group_file(catalog_server, table)
    table.refresh()
    snapshot = table.current_snapshot().snapshot_id
    refused = "cannot read a data file of the table: its row group 0 states 1005 rows, its pages held 1000"
    with session_on(pool, catalog_server, engine_writer, tmp_path) as s:
        rewrites = sum(stats(w).rewrites_started for w in pool.workers)
        with pytest.raises(DataFileError) as raised:
            s.sql(f"OPTIMIZE {name} WITH (target_file_size = {TARGET})")
        assert refused in str(raised.value)
        assert sum(stats(w).rewrites_started for w in pool.workers) > rewrites  # rewritten by the workers
        started = sum(stats(w).fragments_started for w in pool.workers)
        with pytest.raises(DataFileError) as raised:
            s.sql(f"SELECT sum(id) FROM {name} WHERE id >= 0").fetchall()
        assert refused in str(raised.value)
        assert sum(stats(w).fragments_started for w in pool.workers) > started  # read by the workers
    table.refresh()
    assert table.current_snapshot().snapshot_id == snapshot  # nothing committed
