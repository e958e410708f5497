"""Pass-through queries on scan workers: a plain read of one table streams the workers' restricted batches to the
caller without DuckDB's copy on the coordinator, with the same result as the statement forced through DuckDB.

The tables and users are ``test_passthrough``'s (alice restricted: EU rows only, ``email`` mask-alphanum, ``ssn``
replace-with-null; carol unrestricted); the workers are two real ``sqe-worker`` processes on loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa
import pytest

from sqe.catalog.rest import RestTableProvider
from sqe.config import CoordinatorConfig
from sqe.distributed.coordinator import DistributedOptions, DistributedScanStream
from sqe.errors import QueryError
from sqe.execution.passthrough import PATH_DUCKDB, PATH_PASS_THROUGH
from sqe.session import Session
from tests.e2e.test_distributed import TicketLog, WorkerPool, WorkerPools, worker_factory, worker_stats
from tests.e2e.test_passthrough import (
    DOUBLE_WHERES,
    DUCKDB_QUERIES,
    PASS_THROUGH_QUERIES,
    both_paths,
    same_rows,
    world,
)
from tests.e2e.test_restrictions_e2e import World

pytestmark = pytest.mark.e2e
__all__ = ["worker_factory", "world"]  # module fixtures re-used from test_passthrough and test_distributed


@pytest.fixture(scope="module")
def pool(worker_factory: WorkerPools) -> WorkerPool:
    return worker_factory.pool(2)


@contextmanager
def on_workers(world: World, who: str, pool: WorkerPool, **options: int) -> Iterator[Session]:
    """``who``'s session of ``world`` with its scans on ``pool`` (one file per fragment unless ``options`` say
    otherwise: both workers serve)."""
    with world.session(who) as probe:
        config = probe.config
    assert config is not None
    config = config.model_copy(update={"coordinator": CoordinatorConfig(workers=pool.addresses, token=pool.token)})
    settings = DistributedOptions(**{"max_files_per_fragment": 1, **options})
    with Session(RestTableProvider(config), config, distributed=settings) as session:
        assert session.distributed_executor is not None
        yield session


@pytest.mark.parametrize("who", ["carol", "alice"])
def test_plain_reads_stream_from_the_workers(world: World, pool: WorkerPool, who: str) -> None:
    with on_workers(world, who, pool) as session:
        for query in PASS_THROUGH_QUERIES:
            fast, slow, path = both_paths(session, query.format(t=f"{world.namespace}.people"))
            assert path == PATH_PASS_THROUGH, query
            assert fast.schema == slow.schema, query
            assert same_rows(fast, slow), query
        for query in (q for q in DUCKDB_QUERIES if "count(" not in q):  # an aggregate runs on the workers
            fast, slow, path = both_paths(session, query.format(t=f"{world.namespace}.people"))
            assert path == PATH_DUCKDB, query
            assert fast.schema == slow.schema and same_rows(fast, slow), query


def test_a_where_on_doubles_keeps_duckdbs_rows_on_the_workers(world: World, pool: WorkerPool) -> None:
    """The ticket carries double constants (``FilterValue.real``) and the workers compare NaN and -0.0 as DuckDB."""
    with on_workers(world, "carol", pool) as session:
        for where in DOUBLE_WHERES:
            sql = f"SELECT i, f FROM {world.namespace}.typed WHERE {where}"
            fast, slow, path = both_paths(session, sql)
            assert path == PATH_PASS_THROUGH, sql
            assert fast.schema == slow.schema and same_rows(fast, slow), sql


def test_a_where_on_a_masked_column_sees_the_workers_masked_values(world: World, pool: WorkerPool) -> None:
    t = f"{world.namespace}.people"
    cases = {
        f"SELECT id FROM {t} WHERE email = 'xxx@xxxxxxx.xxx'": [1],
        f"SELECT id FROM {t} WHERE email = 'ada@example.com'": [],
        f"SELECT id FROM {t} WHERE ssn = '111-22-3333'": [],
        f"SELECT id FROM {t} WHERE region = 'US'": [],
        f"SELECT id FROM {t} WHERE email LIKE 'ada%'": [],
        f"SELECT id FROM {t} WHERE email LIKE '%@xxxxxxx.xxx'": [1],
    }
    with on_workers(world, "alice", pool) as session:
        for sql, ids in cases.items():
            fast, slow, path = both_paths(session, sql)
            assert path == PATH_PASS_THROUGH, sql
            assert sorted(fast.column("id").to_pylist()) == ids == sorted(slow.column("id").to_pylist()), sql


def _rows_sent(session: Session) -> int:
    return sum(int(stats.rows_sent) for stats in worker_stats(session).values())


@pytest.mark.parametrize("who", ["carol", "alice"])
def test_the_where_runs_on_the_workers_and_only_kept_rows_travel(world: World, pool: WorkerPool, who: str) -> None:
    """The tickets carry the simple WHERE, the workers send only the rows it keeps (after the row filter and
    masks), and the result equals DuckDB's."""
    t = f"{world.namespace}.people"
    with on_workers(world, who, pool) as session:
        everything = session.sql(f"SELECT * FROM {t}").arrow().num_rows
        for query in PASS_THROUGH_QUERIES[1:]:  # each has a WHERE
            sql = query.format(t=t)
            log = TicketLog().attach(session)
            before = _rows_sent(session)
            fast = session.sql(sql).arrow()
            sent = _rows_sent(session) - before
            assert session.last_execution_path == PATH_PASS_THROUGH, sql
            assert log.tickets and all(ticket.HasField("user_filter") for _, ticket in log.tickets), sql
            assert sent == fast.num_rows < everything, sql  # nothing the WHERE drops crosses the wire
            session.pass_through = False
            slow = session.sql(sql).arrow()
            session.pass_through = True
            assert fast.schema == slow.schema and same_rows(fast, slow), sql


@pytest.mark.parametrize("who", ["carol", "alice"])
def test_pass_through_tickets_ask_for_plain_offsets_duckdbs_do_not(world: World, pool: WorkerPool, who: str) -> None:
    """A pass-through run takes the workers' strings at 32-bit offsets (``plain_offsets``: what its result types
    are, so no side converts them); a scan DuckDB reads keeps the scan schema's 64-bit offsets. Same rows and
    types either way, masked columns included."""
    sql = f"SELECT * FROM {world.namespace}.people"
    with on_workers(world, who, pool) as session:
        log = TicketLog().attach(session)
        fast = session.sql(sql).arrow()
        assert session.last_execution_path == PATH_PASS_THROUGH
        assert log.tickets and all(ticket.plain_offsets for _, ticket in log.tickets)
        log.tickets.clear()
        session.pass_through = False
        slow = session.sql(sql).arrow()
        session.pass_through = True
        assert session.last_execution_path == PATH_DUCKDB
        assert log.tickets and not any(ticket.plain_offsets for _, ticket in log.tickets)
    assert any(pa.types.is_string(f.type) for f in fast.schema)
    assert fast.schema == slow.schema and same_rows(fast, slow)


def test_limit_and_offset_on_workers(world: World, pool: WorkerPool) -> None:
    t = f"{world.namespace}.people"
    with on_workers(world, "carol", pool, slots_per_worker=1) as session:
        everything = session.sql(f"SELECT * FROM {t}").arrow()
        for limit, offset in [(0, 0), (1, 0), (2, 1), (2, 5), (100, 0)]:
            fast, slow, path = both_paths(session, f"SELECT * FROM {t} LIMIT {limit} OFFSET {offset}")
            assert path == PATH_PASS_THROUGH
            assert fast.num_rows == slow.num_rows == max(0, min(limit, everything.num_rows - offset))
            assert fast.schema == slow.schema == everything.schema
            assert set(map(str, fast.to_pylist())) <= set(map(str, everything.to_pylist()))
        # the session runs its next statement at once (the fragments' cancellation: the LIMIT test below)
        assert session.sql(f"SELECT count(*) FROM {t} WHERE true").fetchall() == [(everything.num_rows,)]


PACE_MS = 3000  # each worker sleeps this long before each file: a fragment still running is easy to see


def test_a_limit_cancels_the_workers_fragments_and_ends_the_slot_threads(world: World, pool: WorkerPool) -> None:
    """LIMIT 1 is met by the first batch, while a two-file fragment sleeps before its second file: that fragment
    is cancelled on its worker (not paced to its end) and no slot thread outlives the statement."""
    t = f"{world.namespace}.people"
    paced = {"slots_per_worker": 1, "max_files_per_fragment": 2, "pace_ms_per_file": PACE_MS}
    with on_workers(world, "carol", pool, **paced) as session:
        before = _totals(session)
        result = session.sql(f"SELECT * FROM {t} LIMIT 1")
        assert session.last_execution_path == PATH_PASS_THROUGH
        assert result.arrow().num_rows == 1
        # Well inside one pace: a fragment left running would still be sleeping before its next file.
        _within(PACE_MS / 2000, lambda: not _slot_threads(), "slot threads outlived the LIMIT")
        _within(PACE_MS / 2000, lambda: _totals(session)["fragments_running"] == 0, "fragments still running")
        after = _totals(session)
    started = after["fragments_started"] - before["fragments_started"]
    finished = sum(after[k] - before[k] for k in ("fragments_completed", "fragments_cancelled", "fragments_failed"))
    assert started == finished >= 1
    assert after["fragments_cancelled"] > before["fragments_cancelled"]


def _totals(session: Session) -> dict[str, int]:
    names = ("fragments_started", "fragments_completed", "fragments_cancelled", "fragments_failed", "fragments_running")
    stats = worker_stats(session).values()
    return {name: sum(int(getattr(s, name)) for s in stats) for name in names}


def _slot_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sqe-fragment-")]


def _within(seconds: float, condition: Callable[[], bool], message: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)


def test_the_next_statement_ends_a_half_read_reader_on_workers(world: World, pool: WorkerPool) -> None:
    """Like a DuckDB result, a pass-through reader still open is ended by the session's next statement: its
    fragments are cancelled on the workers at once, and reading it on is a QueryError, never a silent end."""
    t = f"{world.namespace}.people"
    paced = {"slots_per_worker": 1, "max_files_per_fragment": 2, "pace_ms_per_file": PACE_MS}
    with on_workers(world, "carol", pool, **paced) as session:
        before = _totals(session)
        reader = session.sql(f"SELECT * FROM {t}").reader(batch_size=1)
        assert session.last_execution_path == PATH_PASS_THROUGH
        assert reader.read_next_batch().num_rows == 1
        assert session.sql("SELECT 41 + 1").fetchall() == [(42,)]
        _within(PACE_MS / 2000, lambda: not _slot_threads(), "slot threads outlived the statement")
        _within(PACE_MS / 2000, lambda: _totals(session)["fragments_running"] == 0, "fragments still running")
        with pytest.raises(QueryError, match="no longer valid"):
            reader.read_all()
        assert _totals(session)["fragments_cancelled"] > before["fragments_cancelled"]


def test_a_failing_pass_through_transform_is_a_query_error(world: World, pool: WorkerPool) -> None:
    """The pass-through projection runs on the coordinator for a distributed scan: a failure there is one
    typed line naming the table, recorded for the query, as it is for an in-process scan's reader threads."""
    t = f"{world.namespace}.people"

    def failing(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise pa.ArrowInvalid("cannot shape this batch\nsecond line")

    with on_workers(world, "carol", pool) as session:
        session.sql(f"SELECT * FROM {t}")
        [stream] = session.last_streams
        assert isinstance(stream, DistributedScanStream)
        with pytest.raises(QueryError, match=r"people failed: cannot shape this batch$"):
            list(stream.batches(failing))
