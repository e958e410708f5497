"""Partial aggregation on real ``sqe-worker`` processes against moto + ``sqe-catalog`` (flow tier).

Eligible aggregates run as partial aggregates on the workers and a final merge on the coordinator; every answer
is compared with the same statement run locally (same names, Arrow types and values). Ineligible shapes keep the
old path; a restricted user's partial rows are computed on restricted values; tickets with bad aggregates are
refused by the worker with a typed error; a killed worker's fragment is retried without duplicated groups; an
interrupted statement stops its fragments on the workers.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa
import pytest

import sqe.api
from sqe.config import load_config
from sqe.distributed.coordinator import DistributedScanStream
from sqe.distributed.coordinator.job import PartialAggregatePlan, ScanJob
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import ERROR_KIND_KEY, KIND_INVALID_TICKET
from sqe.distributed.protocol.partial import PartialAggregate
from sqe.errors import WorkerError
from sqe.execution.local import QueryCancelledError
from sqe.execution.stream import QueryContext
from sqe.session import Session, explain_sections
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.e2e.test_distributed import (
    WRITER_GRANTS,
    TicketLog,
    WorkerPool,
    WorkerPools,
    coordinator_overrides,
    distributed_session,
    worker_factory,  # noqa: F401  (the module-scoped pool fixture)
    worker_stats,
)
from tests.helpers.waiting import wait_until

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

FILES = 6
ROWS_PER_FILE = 50
ROWS = FILES * ROWS_PER_FILE
ELIGIBLE = (
    "SELECT grp, count(*) AS n, count(amount) AS c, sum(amount) AS s, min(amount), max(amount) FROM {t} GROUP BY grp",
    "SELECT count(*), sum(id), sum(small), min(label), max(label), count(label) FROM {t}",
    "SELECT min(label) AS lo, max(label) AS hi, grp FROM {t} GROUP BY grp",
    "SELECT grp, small FROM {t} GROUP BY grp, small",
    "SELECT sum(amount) FROM {t} AS x GROUP BY x.grp",
    "SELECT small AS g0, count(*) AS a0 FROM {t} GROUP BY grp, small",  # aliases named like partial columns
    'SELECT "GRP", Count(*), MAX("Label") FROM {t} GROUP BY Grp',  # identifiers resolve case-insensitively
)
# The simple WHERE runs on the workers, after the restrictions: only the kept rows are aggregated.
FILTERED = (
    "SELECT grp, count(*) AS n, sum(amount) AS s FROM {t} WHERE amount >= 500 GROUP BY grp",
    "SELECT count(*), min(label), max(id) FROM {t} WHERE grp IN ('a', 'c') AND small BETWEEN 1 AND 2",
    "SELECT count(*), sum(amount) FROM {t} WHERE grp IS NULL AND label <> 'label-0007'",
    "SELECT grp, count(*), max(id) FROM {t} WHERE amount < 100 OR (small = 2 AND grp IN ('b', 'c')) GROUP BY grp",
    "SELECT count(*) AS n, sum(id) AS s FROM {t} WHERE id = 7 AND small = 2",  # no row kept (7 % 3 = 1): 0, NULL
    # NOT keeps SQL's NULLs: a NULL grp is in neither count
    "SELECT count(*) FROM {t} WHERE NOT (amount < 100 OR grp = 'a')",
    "SELECT grp, count(*) AS n FROM {t} WHERE grp NOT IN ('a', 'b') OR amount NOT BETWEEN 100 AND 900 GROUP BY grp",
)
INELIGIBLE = (
    "SELECT count(*), sum(amount) FROM {t} WHERE id % 3 = 0",
    "SELECT grp, count(amount) FROM {t} WHERE amount IS NULL OR FALSE GROUP BY grp",  # a constant is no condition
    "SELECT count(*) FROM {t} WHERE NOT (amount % 2 = 0)",  # NOT of a function: DuckDB runs it
    "SELECT count(DISTINCT grp) FROM {t}",
    "SELECT avg(amount) FROM {t}",
    "SELECT sum(amount + 1) FROM {t}",
    "SELECT count(*) FROM {t} a JOIN {t} b ON a.id = b.id",
    "SELECT grp, count(*) FROM {t} GROUP BY grp LIMIT 2",
    "SELECT count(*) FILTER (WHERE small = 1) FROM {t}",
    "SELECT max(amount) FROM {t} GROUP BY ()",
    "SELECT grp AS small, count(*) FROM {t} GROUP BY grp, small",  # GROUP BY names a column and a select alias
)


def _rows(start: int, count: int) -> pa.Table:
    ids = list(range(start, start + count))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "grp": pa.array([None if i % 7 == 0 else ("a", "b", "c", "d")[i % 4] for i in ids], pa.string()),
            "amount": pa.array([None if i % 5 == 0 else (i * 37) % 1000 for i in ids], pa.int64()),
            "small": pa.array([i % 3 for i in ids], pa.int32()),
            "label": pa.array([f"label-{i:04d}" for i in ids], pa.string()),
        }
    )


@pytest.fixture(scope="module")
def namespace(catalog_server: CatalogServer) -> str:
    """``<ns>.agg`` (6 files with NULLs) and ``<ns>.empty`` (no file)."""
    writer = catalog_server.principal_with_grants(f"agg_writer_{uuid.uuid4().hex[:6]}", WRITER_GRANTS)
    catalog = pyiceberg_catalog(catalog_server, writer)
    namespace = f"agg_{uuid.uuid4().hex[:6]}"
    catalog.create_namespace(namespace)
    table = catalog.create_table((namespace, "agg"), schema=_rows(0, 1).schema)
    for n in range(FILES):
        table.append(_rows(n * ROWS_PER_FILE, ROWS_PER_FILE))
    catalog.create_table((namespace, "empty"), schema=_rows(0, 1).schema)
    return namespace


@pytest.fixture(scope="module")
def reader(catalog_server: CatalogServer, namespace: str) -> CatalogPrincipal:
    return catalog_server.principal_with_grants(f"agg_reader_{uuid.uuid4().hex[:6]}", [("TABLE_READ_DATA", None, None)])


@pytest.fixture(scope="module")
def workers(worker_factory: WorkerPools) -> WorkerPool:  # noqa: F811
    return worker_factory.pool(2)


@pytest.fixture
def reader_config(catalog_server: CatalogServer, reader: CatalogPrincipal, tmp_path: Path) -> Path:
    return write_sqe_config(tmp_path / "reader.toml", catalog_server.url, reader, catalog_server.moto)


def _sorted(table: pa.Table) -> list[str]:
    return sorted(str(row) for row in table.to_pylist())


def _assert_same(got: pa.Table, expected: pa.Table, sql: str) -> None:
    assert got.schema == expected.schema, sql
    assert _sorted(got) == _sorted(expected), sql


def _rows_sent(session: Session) -> int:
    return sum(stats.rows_sent for stats in worker_stats(session).values())


@dataclass
class _BothRuns:
    """One statement run locally and on the workers: both results, the distributed path, tickets and rows sent."""

    expected: pa.Table
    got: pa.Table
    path: str
    tickets: list[pb.ScanTicket]
    rows_sent: int
    partial_streams: list[bool]  # per stream of the statement: whether it reads partial rows


def _both_runs(reader_config: Path, workers: WorkerPool, sql: str) -> _BothRuns:
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    with sqe.api.connect(reader_config) as local, distributed_session(config) as distributed:
        log = TicketLog().attach(distributed)
        expected = local.sql(sql).arrow()
        before = _rows_sent(distributed)
        got = distributed.sql(sql).arrow()
        sent = _rows_sent(distributed) - before
        path = distributed.last_execution_path
        partial = [isinstance(s, DistributedScanStream) and s.partial is not None for s in distributed.last_streams]
    return _BothRuns(expected, got, path, [ticket for _, ticket in log.tickets], sent, partial)


@pytest.mark.parametrize("query", ELIGIBLE + FILTERED)
def test_eligible_aggregates_equal_the_local_answer(
    reader_config: Path, namespace: str, workers: WorkerPool, query: str
) -> None:
    sql = query.format(t=f"{namespace}.agg")
    runs = _both_runs(reader_config, workers, sql)
    assert runs.path == "partial-aggregate"
    assert runs.partial_streams == [True]  # the statement's one stream is the one that ran
    _assert_same(runs.got, runs.expected, sql)
    assert runs.tickets and all(ticket.HasField("partial_aggregate") for ticket in runs.tickets)
    assert all(ticket.HasField("user_filter") == ("WHERE" in sql) for ticket in runs.tickets)
    assert 0 < runs.rows_sent < ROWS  # partial rows only, never every row
    if "id = 7" in sql:
        assert runs.got.to_pylist() == [{"n": 0, "s": None}]


def test_an_empty_table_gives_zero_counts_and_null_sums(
    reader_config: Path, namespace: str, workers: WorkerPool
) -> None:
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    queries = (
        f"SELECT count(*) AS n, count(amount) AS c, sum(amount) AS s, min(label) AS m FROM {namespace}.empty",
        f"SELECT grp, count(*) FROM {namespace}.empty GROUP BY grp",
    )
    with sqe.api.connect(reader_config) as local, distributed_session(config) as distributed:
        for sql in queries:
            expected, got = local.sql(sql).arrow(), distributed.sql(sql).arrow()
            assert distributed.last_execution_path == "partial-aggregate"
            _assert_same(got, expected, sql)
        assert distributed.sql(queries[0]).fetchall() == [(0, 0, None, None)]


@pytest.mark.parametrize("query", INELIGIBLE)
def test_ineligible_shapes_keep_the_old_path(
    reader_config: Path, namespace: str, workers: WorkerPool, query: str
) -> None:
    sql = query.format(t=f"{namespace}.agg")
    runs = _both_runs(reader_config, workers, sql)
    expected, got = runs.expected, runs.got
    assert runs.path == "duckdb"
    assert runs.tickets and not any(ticket.HasField("partial_aggregate") for ticket in runs.tickets)
    assert not any(ticket.HasField("user_filter") for ticket in runs.tickets)  # DuckDB runs the WHERE
    if "LIMIT" in sql:  # which two groups is DuckDB's choice: compare the shape and the rows' validity
        assert got.schema == expected.schema and got.num_rows == expected.num_rows == 2
        return
    _assert_same(got, expected, sql)


def test_the_config_switch_and_explain(reader_config: Path, namespace: str, workers: WorkerPool) -> None:
    sql = f"SELECT grp, count(*) FROM {namespace}.agg GROUP BY grp"
    on = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    off = load_config(reader_config, env={}, overrides=coordinator_overrides(workers, partial_aggregation=False))
    assert on.coordinator.partial_aggregation and not off.coordinator.partial_aggregation
    with distributed_session(on) as session:
        explained = explain_sections(session.sql(f"EXPLAIN {sql}").arrow())
        path = next(v["execution_path"] for k, v in explained.items() if "agg" in k)
        assert path.startswith("partial-aggregate (each worker aggregates")
        expected = session.sql(sql).arrow()
    with distributed_session(off) as session:
        log = TicketLog().attach(session)
        got = session.sql(sql).arrow()
        assert session.last_execution_path == "duckdb"
    assert not any(ticket.HasField("partial_aggregate") for _, ticket in log.tickets)
    _assert_same(got, expected, sql)


def test_a_restricted_users_partial_result_equals_the_local_restricted_result(
    catalog_server: CatalogServer,
    namespace: str,
    workers: WorkerPool,
    tmp_path: Path,
    catalog_reader: CatalogPrincipal,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row filter (grp <> 'a', on raw values) and a mask on an aggregated column (label): the workers aggregate
    the masked values, so min/max/count equal the local restricted answer and no raw label shows anywhere."""
    restricted = catalog_server.principal_with_grants(
        f"agg_masked_{uuid.uuid4().hex[:6]}", [("TABLE_READ_DATA", None, None)]
    )
    rules = tmp_path / "restrictions.json"
    rules.write_text(
        '{"required-column-projections": [{"field-id": 5, "action": "mask-alphanum"}],'
        ' "required-row-filter": {"type": "not-eq", "left": {"type": "reference", "id": 2}, "right": "a"}}'
    )
    catalog_server.admin_cli(
        "set-restrictions", "--warehouse", catalog_server.warehouse, "--namespace", namespace,
        "--table", "agg", "--principal", restricted.name, "--file", str(rules),
    )  # fmt: skip
    keys = {"reader_client_id": catalog_reader.client_id, "reader_client_secret": catalog_reader.client_secret}
    path = write_sqe_config(tmp_path / "masked.toml", catalog_server.url, restricted, catalog_server.moto, catalog=keys)
    config = load_config(path, env={}, overrides=coordinator_overrides(workers))
    caplog.set_level(logging.DEBUG)
    queries = (
        f"SELECT grp, count(*) AS n, min(label) AS lo, max(label) AS hi, count(label) AS c FROM {namespace}.agg "
        "GROUP BY grp",
        f"SELECT count(*), sum(amount), min(label) FROM {namespace}.agg",
        f"SELECT count(*) FROM {namespace}.agg",  # restricted: never from manifest counts, aggregated on workers
        # The WHERE sees masked labels (a raw label matches nothing) and never grp 'a' (the row filter's).
        f"SELECT grp, count(*) AS n FROM {namespace}.agg WHERE label <> 'label-0001' GROUP BY grp",
        f"SELECT count(*) AS n FROM {namespace}.agg WHERE label = 'label-0001' OR grp = 'a'",
        f"SELECT count(*) AS n FROM {namespace}.agg WHERE label = 'label-0001'",
        f"SELECT count(*) AS n FROM {namespace}.agg WHERE grp = 'a'",
    )
    with sqe.api.connect(path) as local, distributed_session(config) as distributed:
        log = TicketLog().attach(distributed)
        for sql in queries:
            expected, got = local.sql(sql).arrow(), distributed.sql(sql).arrow()
            assert distributed.last_execution_path == "partial-aggregate", sql
            _assert_same(got, expected, sql)
        grouped = distributed.sql(queries[0]).arrow().to_pylist()
        assert distributed.sql(queries[-1]).fetchall() == distributed.sql(queries[-2]).fetchall() == [(0,)]
        assert sum(n for _, n in distributed.sql(queries[3]).fetchall()) == distributed.sql(queries[2]).fetchall()[0][0]
    assert {row["grp"] for row in grouped} == {"b", "c", "d", None}  # the row filter ran on the workers
    assert all(row["lo"].startswith("xxxxx-") for row in grouped)  # masked before aggregation
    assert all(ticket.restriction_plan_json for _, ticket in log.tickets)
    assert any(ticket.HasField("user_filter") and ticket.HasField("partial_aggregate") for _, ticket in log.tickets)
    text = caplog.text + "\n" + workers.logs()
    assert not re.search(r"label-\d{4}", text)


def test_bad_partial_tickets_are_refused_by_the_worker_with_a_typed_error(
    reader_config: Path, namespace: str, workers: WorkerPool
) -> None:
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    with distributed_session(config) as session:
        log = TicketLog().attach(session)
        session.sql(f"SELECT grp, count(*) FROM {namespace}.agg GROUP BY grp").fetchall()
        executor = session.distributed_executor
        assert executor is not None
        worker, sent = log.tickets[0]
        bad_aggregates = (
            pb.Aggregate(function=pb.AGGREGATE_FUNCTION_SUM, column="no_such_column"),
            pb.Aggregate(function=pb.AGGREGATE_FUNCTION_UNSPECIFIED, column="amount"),
            pb.Aggregate(function=pb.AGGREGATE_FUNCTION_SUM, column="label"),  # a real column DuckDB cannot sum
        )
        for n, aggregate in enumerate(bad_aggregates):
            ticket = pb.ScanTicket()
            ticket.CopyFrom(sent)
            ticket.fragment_id = f"{sent.fragment_id}.bad{n}"
            ticket.partial_aggregate.CopyFrom(pb.PartialAggregate(group_by=["grp"], aggregates=[aggregate]))
            call = executor.client_for(worker).execute(ticket)
            with pytest.raises(grpc.RpcError) as raised:
                list(call)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert dict(raised.value.trailing_metadata() or ())[ERROR_KIND_KEY] == KIND_INVALID_TICKET
            assert "partial_aggregate" in str(raised.value.details())
        wrong_type = pb.UserFilter(  # an integer constant for the string column: refused, never cast
            conditions=[
                pb.FilterClause(
                    condition=pb.FilterCondition(
                        column="grp", operator=pb.FILTER_OPERATOR_EQ, values=[pb.FilterValue(integer=1)]
                    )
                )
            ]
        )
        ticket = pb.ScanTicket()
        ticket.CopyFrom(sent)
        ticket.fragment_id = f"{sent.fragment_id}.bad-filter"
        ticket.user_filter.CopyFrom(wrong_type)
        with pytest.raises(grpc.RpcError) as raised:
            list(executor.client_for(worker).execute(ticket))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert dict(raised.value.trailing_metadata() or ())[ERROR_KIND_KEY] == KIND_INVALID_TICKET
        assert "does not fit the type large_string of 'grp'" in str(raised.value.details())


def test_a_worker_killed_mid_fragment_is_retried_without_duplicated_groups(
    reader_config: Path,
    namespace: str,
    worker_factory: WorkerPools,  # noqa: F811
) -> None:
    pool = worker_factory.pool(2, "--max-files-in-flight", "1")
    victim = pool.workers[0]
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(pool))
    sql = f"SELECT grp, count(*) AS n, sum(amount) AS s FROM {namespace}.agg GROUP BY grp"
    with sqe.api.connect(reader_config) as local:
        expected = local.sql(sql).arrow()
    with distributed_session(config, slots_per_worker=1, pace_ms_per_file=400) as session:
        executor = session.distributed_executor
        assert executor is not None
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(table=session.sql(sql).arrow()), daemon=True)
        thread.start()
        victim_client = executor.client_for(victim.address)
        deadline = time.monotonic() + 30
        while victim_client.stats(timeout=5).fragments_running < 1 and time.monotonic() < deadline:
            time.sleep(0.02)  # the victim is inside a fragment: nothing of it was forwarded yet (held until complete)
        os.kill(victim.proc.pid, signal.SIGKILL)
        thread.join(60)
        assert executor.stats.fragments_retried >= 1
        assert session.last_execution_path == "partial-aggregate"
    assert victim.proc.wait(5) == -signal.SIGKILL
    _assert_same(result["table"], expected, sql)
    assert sum(row["n"] for row in result["table"].to_pylist()) == ROWS  # every row counted exactly once


def test_a_partial_stream_of_another_schema_fails_the_query(
    reader_config: Path, namespace: str, workers: WorkerPool
) -> None:
    """The coordinator knows the partial schema before any worker answers; a stream that differs is a WorkerError
    (here the coordinator expects a 32-bit count, the workers rightly send DuckDB's BIGINT)."""
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    with distributed_session(config) as session:
        session.sql(f"SELECT grp, count(*) FROM {namespace}.agg GROUP BY grp").fetchall()
        scan = session.last_streams[0]
        executor = session.distributed_executor
        assert isinstance(scan, DistributedScanStream) and executor is not None
        spec = PartialAggregate(("grp",), (("count_star", ""),))
        wrong = PartialAggregatePlan(spec, pa.schema([("g0", pa.string()), ("a0", pa.int32())]))
        batches = executor.record_batches(ScanJob(scan.plan, QueryContext(), "q-wrong-schema", 1, partial=wrong))
        with pytest.raises(WorkerError, match=r"partial-aggregate schema .* is not the expected"):
            list(batches)


def _fragments_running(session: Session) -> int:
    return sum(int(stats.fragments_running) for stats in worker_stats(session).values())


def _wait_idle(session: Session, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while _fragments_running(session):
        assert time.monotonic() < deadline, "the workers still run fragments"
        time.sleep(0.02)


def _slot_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sqe-fragment-")]


def test_an_interrupted_partial_aggregate_stops_its_fragments_on_the_workers(
    reader_config: Path, namespace: str, workers: WorkerPool
) -> None:
    """Interrupting the statement while the workers' DuckDB helpers wait for paced files ends the query as
    cancelled, the workers' fragments (and with them the helpers, which the fragment joins) well inside one pace,
    and the coordinator's slot threads."""
    pace_ms = 3000
    config = load_config(reader_config, env={}, overrides=coordinator_overrides(workers))
    sql = f"SELECT grp, count(*) FROM {namespace}.agg GROUP BY grp"
    with distributed_session(config, slots_per_worker=1, pace_ms_per_file=pace_ms) as session:
        outcome: dict[str, BaseException] = {}

        def run() -> None:
            try:
                session.sql(sql).arrow()
            except BaseException as exc:  # the test inspects it
                outcome["error"] = exc

        _wait_idle(session)  # an earlier test's cancelled calls may still be ending on these shared workers
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while _fragments_running(session) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert session.last_execution_path == "partial-aggregate" and _fragments_running(session) >= 1
        session.interrupt()
        thread.join(pace_ms / 2000)
        assert not thread.is_alive()
        assert isinstance(outcome.get("error"), QueryCancelledError)
        _wait_idle(session, pace_ms / 2000)
        # The run joins each slot thread only briefly; a thread still ending must be gone well inside one pace.
        wait_until(lambda: not _slot_threads(), "the coordinator's slot threads outlived the query", pace_ms / 2000)
