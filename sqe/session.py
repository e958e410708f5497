"""A user's SQL session: a locked-down DuckDB connection that sees Iceberg tables only as SQE scan streams.

How a table name in SQL reaches DuckDB: the statement is parsed (``json_serialize_sql``, no binding) and every
two- or three-part base-table name becomes a ``TableIdent`` (``namespace.table`` means the default warehouse).
Each table is loaded through the user's ``TableProvider`` and planned; its ``ScanStream`` is registered under a
unique name and a view named exactly like the table (DuckDB catalog = warehouse, schema = namespace) selects
from it. DuckDB then resolves ``wh.ns.t``, ``ns.t`` (the default warehouse's catalog is the connection's default)
and ``ns.t.col`` natively. Views and streams live until the next statement. In-memory ATTACH, CREATE SCHEMA and
CREATE VIEW all work under the lockdown; users cannot run them on DuckDB: catalog statements (CREATE / DROP
SCHEMA, CREATE / DROP / ALTER TABLE, SHOW, DESCRIBE) go to the catalog (``sqe.planning.ddl``), DELETE / UPDATE /
MERGE run copy-on-write (``sqe.execution.dml``), and time travel and ``t$snapshots``-style metadata tables are
planned per reference (``sqe.planning.time_travel``).

EXPLAIN answers in a vertical layout (section, property, value): DuckDB's plan, then one section per table.
For a table whose rows a row filter hides, nothing derived from file statistics is shown (files, bytes, records
planned after pruning would tell which values hidden rows hold), only what the user could know anyway.

Projection: the columns each table can need are found from the parse tree (``sql_analysis``); if DuckDB still
fails to bind a narrowed query, it is re-planned once with every column. Filters are never pushed by DuckDB into
raw data: the streams are plain C streams; simple predicates on unmasked columns go to pyiceberg for pruning
only, and DuckDB re-applies every WHERE itself.

Pass-through (``sqe.execution.passthrough``): a plain read of one local scan (columns, simple WHERE, LIMIT) is
streamed from the scan to the caller instead of through DuckDB's import and export; its WHERE still runs after
the row filter and masks, on masked values. ``Session.pass_through = False`` sends every query to DuckDB;
EXPLAIN's ``execution_path`` says which path a query takes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import itertools
import logging
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import duckdb
import pyarrow as pa

from sqe._text import first_line, redact_credentials
from sqe._unpicklable import Unpicklable
from sqe.catalog.base import LoadedTable, TableIdent, TableProvider, ViewDefinition
from sqe.duckdb_connection import (
    DatabaseLimits,
    connect_locked_down,
    fold_row,
    out_of_memory,
    quote_ident,
    quote_qualified,
)
from sqe.errors import (
    CatalogError,
    CredentialExpiredError,
    NoSuchNamespaceError,
    NoSuchTableError,
    NoSuchViewError,
    PermissionDeniedError,
    QueryError,
    QueryResourceError,
    RestrictedTableError,
    SQEError,
    StatementNotPreparableError,
)
from sqe.execution.conform import conform_for_write
from sqe.execution.external import ExternalSources
from sqe.planning import views
from sqe.planning.sql_analysis import (
    TOO_DEEP,
    TableRef,
    column_usage,
    columns_to_read,
    find_table_refs,
    parse_select,
    pushdown_predicates,
)
from sqe.planning.statements import DML_KINDS, Statement, TimeTravel, classify, parse_qualified_name
from sqe.planning.time_travel import metadata_table, resolve_snapshot, split_metadata_name

# Start-up cost (issue 11 item 4): pyiceberg's scan planning and reader, the local executor and the catalog's
# error translation are imported where a statement first needs them, so a statement that names no Iceberg
# table (``SELECT 1``, a file table function) never imports pyiceberg.
if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from sqe.config import SQEConfig
    from sqe.distributed.coordinator import DistributedExecutor, DistributedOptions, DistributedScanStream
    from sqe.distributed.coordinator.aggregate import PreparedAggregate
    from sqe.execution.compaction import RemoteRewriter
    from sqe.execution.external import RemoteScanner
    from sqe.execution.local import LocalExecutor
    from sqe.execution.passthrough import PassThroughPlanner, PassThroughRun
    from sqe.execution.stream import QueryContext, ScanStream
    from sqe.planning.planner import ScanPlan, TaskCache
    from sqe.planning.remote import RemotePlanner

log = logging.getLogger(__name__)

# How long close() waits for an interrupted statement of another thread to stop before closing without it.
CLOSE_WAIT_SECONDS = 10.0

Params = Sequence[Any] | Mapping[str, Any] | None
_RESERVED_CATALOGS = {"system", "temp"}
_CATALOG_KINDS = frozenset(
    {
        "create_schema",
        "drop_schema",
        "drop_table",
        "alter_table",
        "create_table",
        "show_schemas",
        "show_tables",
        "show_create_table",
        "describe",
        "create_view",
        "drop_view",
        "show_views",
    }
)
WITHHELD = "withheld (row filter)"
# What Session.progress() shows of a statement reading a row-filtered table: every other counter (files, bytes,
# files open, batches) follows the files read, which were pruned with statistics of the hidden rows too.
SHOWN_WHEN_ROWS_HIDDEN = ("rows_produced",)
_NOT_PREPARABLE = "only queries and INSERT can be prepared"
_EXPLAIN_SCHEMA = pa.schema([("section", pa.string()), ("property", pa.string()), ("value", pa.string())])


# ------------------------------------------------------------------------------------------------ results


_NO_LONGER_VALID = "this result is no longer valid: the session has run another statement since"


class Result:
    """The outcome of one statement. A query runs when read (``arrow()`` or ``reader()``), at most once."""

    def __init__(
        self,
        session: Session,
        *,
        relation: duckdb.DuckDBPyRelation | None = None,
        table: pa.Table | None = None,
        context: QueryContext | None = None,
        pass_through: PassThroughRun | None = None,
    ) -> None:
        self._session = session
        self._relation = relation
        self._pass_through = pass_through  # issue 11 item 1: streamed from the scan, DuckDB never runs it
        self._table = table
        self._context = context
        self._generation = session._generation
        self._consumed = False

    def arrow(self) -> pa.Table:
        if self._table is None and self._pass_through is not None:
            self._check_readable()
            self._table = self._pass_through.table()
        if self._table is None:
            with self._session._lock:  # checked and run as one: no other statement may fill the slots between
                relation = self._take_relation()
                try:
                    self._table = relation.to_arrow_table()
                except duckdb.Error as exc:
                    raise self._session._translate(exc, self._context) from None
        return self._table

    def reader(self, batch_size: int = 122_880) -> pa.RecordBatchReader:
        if self._table is not None:
            return self._table.to_reader()
        if self._pass_through is not None:
            with self._session._lock:  # checked and started as one (see arrow)
                self._check_readable()
                batches = self._pass_through.batches(batch_size)
                # Like DuckDB's reader below, the next statement ends the run (its scan, or its workers' fragments).
                self._session._open_reader = weakref.ref(batches)
            return pa.RecordBatchReader.from_batches(self._pass_through.schema, self._while_current(batches))
        with self._session._lock:  # checked and started as one (see arrow)
            relation = self._take_relation()
            try:
                source = relation.to_arrow_reader(batch_size)
            except duckdb.Error as exc:
                raise self._session._translate(exc, self._context) from None
            # The next statement closes it (DuckDB runs one result at a time); weakly, so whoever drops the
            # reader still frees DuckDB's stream (and its scans) at once.
            self._session._open_reader = weakref.ref(source)
        return pa.RecordBatchReader.from_batches(source.schema, self._translated(source))

    def fetchall(self) -> list[tuple[Any, ...]]:
        # By position, not through per-row dicts: two result columns may share a name (``SELECT a, a``).
        table = self.arrow()
        if not table.num_columns:
            return [()] * table.num_rows
        return list(zip(*(column.to_pylist() for column in table.columns), strict=True))

    def _while_current(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """A pass-through run's batches; a run the next statement ended is a QueryError, never a short result."""
        yield from batches
        if self._generation != self._session._generation:
            raise QueryError(_NO_LONGER_VALID)

    def _translated(self, source: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch = source.read_next_batch()
            except StopIteration:
                return
            except (duckdb.Error, pa.ArrowException, OSError) as exc:
                # After the first batch DuckDB reports its failures through Arrow's stream (an OSError or an
                # ArrowInvalid); a reader the next statement closed fails with ArrowInvalid.
                if self._generation != self._session._generation:
                    raise QueryError(_NO_LONGER_VALID) from None
                raise self._session._translate(exc, self._context) from None
            yield batch

    def _take_relation(self) -> duckdb.DuckDBPyRelation:
        if self._relation is None:
            raise QueryError("this result has already been read")
        self._check_readable()
        return self._relation

    def _check_readable(self) -> None:
        """Once only, and only while the session has not run another statement (its streams are gone)."""
        if self._consumed:
            raise QueryError("this result has already been read")
        if self._generation != self._session._generation:
            raise QueryError(_NO_LONGER_VALID)
        self._consumed = True


@dataclass
class _Planned:
    """A statement's stored plan: its tables (with their FileIO and credentials) and their scans."""

    statement: Statement
    scans: dict[TableIdent, ScanPlan] = field(default_factory=dict)
    narrowed: bool = False  # some table reads fewer than all its columns
    target: LoadedTable | None = None  # INSERT target
    travels: dict[str, ScanPlan] = field(default_factory=dict)  # time-travel placeholder -> its scan
    metadata: dict[TableIdent, pa.Table] = field(default_factory=dict)  # ns."t$snapshots" -> its rows
    views: dict[TableIdent, str] = field(default_factory=dict)  # catalog views it reads -> SQL, inner ones first

    @property
    def reads_no_table(self) -> bool:
        """Nothing from the catalog: no scan, time travel, metadata table or catalog view."""
        return not (self.scans or self.travels or self.metadata or self.views)

    def start_tasks(self) -> None:
        """Start planning every scan's file tasks that is not under way (a bare count(*) defers its own)."""
        for plan in [*self.scans.values(), *self.travels.values()]:
            plan.task_source.start()

    def plan_tasks(self) -> None:
        """Every scan's file tasks, waited for: a planning failure is raised here, by the statement's own call."""
        for plan in [*self.scans.values(), *self.travels.values()]:
            plan.task_source.get()


class PreparedStatement:
    """A statement checked and planned once at prepare time, and planned again from its SQL text at every
    execution: each execution asks the catalog for every table, view and metadata table it reads, as a plain
    statement does (``If-None-Match``, or nothing within ``metadata_revalidate_seconds``). A plan kept across
    executions would keep the restrictions, grants and credentials of the moment it was made: a grant revoked or
    a mask added since would not apply, and the process caches would serve it. The planned-task cache (keyed by
    metadata location) keeps planning an unchanged table cheap."""

    def __init__(self, session: Session, statement: Statement, planned: _Planned) -> None:
        self._session = session
        self._statement = statement  # as classified: each plan rewrites its file calls into fresh streams
        self._planned = planned

    @property
    def sql(self) -> str:
        return self._planned.statement.text

    @property
    def tables(self) -> dict[TableIdent, LoadedTable]:
        loaded = {ident: plan.loaded for ident, plan in self._planned.scans.items()}
        if self._planned.target is not None:
            loaded[self._planned.target.ident] = self._planned.target
        return loaded

    def execute(self, params: Params = None) -> Result:
        self._planned, result = self._session._execute_prepared(self._statement, params)
        return result

    def execute_many(self, param_sets: Sequence[Params]) -> Result:
        """An INSERT run once per parameter set as one execution: planned once, every set's rows appended in one
        commit (one snapshot), or none of them when any set fails. Its Result holds the row count."""
        self._planned, result = self._session._execute_prepared_many(self._statement, param_sets)
        return result


# ------------------------------------------------------------------------------------------------ session


class Session:
    def __init__(
        self,
        provider: TableProvider,
        config: SQEConfig | None = None,
        *,
        max_files_in_flight: int = 4,
        max_queued_batches: int = 8,
        clock: Callable[[], float] = time.time,
        distributed: DistributedOptions | None = None,
        on_close: Callable[[], None] | None = None,
        view_warehouses: Collection[str] = (),
        database_limits: DatabaseLimits | None = None,
    ) -> None:
        """Scans run in-process unless ``[coordinator] workers`` is set; ``distributed`` tunes worker scans.
        ``on_close`` runs when the session closes (``sqe.api.connect``: close the catalog client it made).
        ``view_warehouses``: warehouse names a view's ``default-catalog`` means as such besides ``config``'s (``sqe
        serve``: the server's, of which a user's config keeps only those on the primary catalog).
        ``database_limits``: the memory, threads and spill space of the session's DuckDB database (``sqe serve``:
        each user engine's); None leaves DuckDB's defaults."""
        self.config = config
        self._database_limits = database_limits
        self._view_warehouses = tuple(view_warehouses)
        self._provider = provider
        self._on_close = on_close
        self._clock = clock
        self._executor_limits = (max_files_in_flight, max_queued_batches)
        self._remote: RemotePlanner | None = None  # server-side scan planning ([catalog] server_side_planning)
        if config is not None and config.catalog.server_side_planning:
            from sqe.planning.remote import RemotePlanner

            self._remote = RemotePlanner(provider, deadline_seconds=4 * config.catalog.request_timeout_seconds)
        self._distributed: DistributedExecutor | None = None
        if config is not None and config.coordinator.workers:
            from sqe.distributed.coordinator import DistributedExecutor  # grpc only when workers are configured

            self._distributed = DistributedExecutor(config, provider, distributed)
        self._default_warehouse = provider.default_warehouse()
        self._check_catalog_name(self._default_warehouse)
        self._con = connect_locked_down(self._before_lock)
        # Parsing and constant folding only. A cursor of the same database rather than a second database (which
        # costs DuckDB ~30 ms and its own threads): its temporary schema is its own, so none of the scans this
        # session registers, and so no row, is visible to it.
        self._parser = self._con.cursor()
        # issue 14: file table functions, external tables, OPTIMIZE (sqe/execution/external.py)
        self._external = ExternalSources(
            config,
            provider,
            self._parser,
            self._con,
            self.resolve_name,
            self._remote_rewriter(),
            self._remote_scanner(),
            self._check_cancelled,
        )
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._schemas: set[tuple[str, str]] = set()
        self._views: list[str] = []  # this statement's views, dropped when it ends
        # Views of table slots, kept across statements: view -> (slot name, the schema it was created for).
        self._table_views: dict[str, tuple[str, pa.Schema]] = {}
        self._registered: list[str] = []
        self._slots: dict[TableIdent, tuple[str, _ScanSlot]] = {}  # each table's registered slot, kept per session
        self._prepared: dict[str, PreparedStatement] = {}
        self._active: QueryContext | None = None
        # DuckDB's reader of a streamed result, or a streamed pass-through run's batches: the next statement ends it.
        self._open_reader: weakref.ref[pa.RecordBatchReader | Generator[pa.RecordBatch]] | None = None
        self._generation = 0
        self._closed = False
        # Ctrl-C while a statement is still planning (catalog loads, a first statement's lazy imports): nothing
        # runs in DuckDB yet to interrupt, so the request is kept and honoured when execution would start.
        self._in_statement = False
        self._cancel_requested = threading.Event()
        # the streams of the latest statement (tests, diagnostics)
        self.last_streams: list[ScanStream | DistributedScanStream] = []
        # issue 11 item 1: plain reads stream from the scan without DuckDB's copy (False: always DuckDB)
        self.pass_through = True
        # execute_many of INSERT ... VALUES ($1, ...): one DuckDB INSERT over all parameter sets (False: one per set)
        self.columnar_batches = True
        # how the latest query ran: "pass-through", "duckdb", "metadata" or "partial-aggregate"; an INSERT:
        # "columnar-batch" (execute_many's sets as one INSERT) or "duckdb"
        self.last_execution_path = ""
        self._pass_through_planner: PassThroughPlanner | None = None  # made (and imported) on first use

    @functools.cached_property
    def _executor(self) -> LocalExecutor:
        """The bounded local reader, built by the first scan; it prefetches as ``[cache] prefetch`` says."""
        from sqe.execution.local import LocalExecutor

        max_files_in_flight, max_queued_batches = self._executor_limits
        prefetch = self.config is not None and self.config.cache.prefetch
        return LocalExecutor(
            max_files_in_flight=max_files_in_flight, max_queued_batches=max_queued_batches, prefetch=prefetch
        )

    @functools.cached_property
    def _task_cache(self) -> TaskCache:
        """Repeated queries of an unchanged table skip reading its manifests; other plans read them through the
        per-process manifest cache. Built by the first plan, which is also when the ``[cache]`` bounds and
        ``[memory]`` apply."""
        from sqe.execution.allocator import keep_freed_memory
        from sqe.execution.cache import configure_process_caches
        from sqe.execution.cached_files import MetadataCachingFileIO
        from sqe.planning.planner import TaskCache

        if self.config is not None:
            cache = self.config.cache
            configure_process_caches(
                data_bytes=cache.data_bytes, manifest_bytes=cache.manifest_bytes, decoded_bytes=cache.decoded_bytes
            )
            keep_freed_memory(self.config.memory.keep_freed_bytes)
        return TaskCache(metadata_io=MetadataCachingFileIO)

    # -- public API -------------------------------------------------------------------------------------

    def sql(self, text: str, params: Params = None) -> Result:
        """Run one statement. Queries run lazily when the Result is read."""
        _require_text(text)
        with self._statement():
            return self._sql(text, params)

    def _execute_prepared(self, statement: Statement, params: Params) -> tuple[_Planned, Result]:
        """A prepared statement's execution, entered as ``sql`` enters a statement: planned again (so every
        catalog check runs anew), then run."""
        with self._statement():
            planned = self._plan(statement)
            return planned, self._run_planned(planned, params)

    def _execute_prepared_many(self, statement: Statement, param_sets: Sequence[Params]) -> tuple[_Planned, Result]:
        """``execute_many``: as ``_execute_prepared``, the whole batch one statement and one append."""
        if statement.kind != "insert":
            raise QueryError("only an INSERT runs with a batch of parameter sets")
        with self._statement():
            planned = self._plan(statement)
            return planned, Result(self, table=self._insert(planned, param_sets))

    @contextlib.contextmanager
    def _statement(self) -> Iterator[None]:
        """One statement at a time, on an open session; an interrupt from now on cancels it. Entered again inside
        a statement (SQL ``EXECUTE`` runs its prepared statement), it is that same statement: a cancel already
        asked for stays asked for, and the statement ends when the outer one does."""
        with self._lock:
            self._check_open()
            if self._in_statement:  # the lock is this thread's, so the statement running is this thread's too
                yield
                return
            self._cancel_requested.clear()
            self._in_statement = True
            try:
                yield
            except RecursionError:  # any analysis of a parse tree close to the decoder's depth: one typed line
                raise QueryError(TOO_DEEP) from None
            except QueryError as exc:
                from sqe.execution.local import QueryCancelledError

                # An interrupt that stopped DuckDB mid-way (folding an argument, say) surfaces as whatever error
                # the interrupted step raised: the statement was cancelled, and says so.
                if self._cancel_requested.is_set() and not isinstance(exc, QueryCancelledError):
                    raise QueryCancelledError() from None
                raise
            finally:
                self._in_statement = False

    def _sql(self, text: str, params: Params) -> Result:
        with self._lock:
            external = self._external.parse(text)  # issue 14: CREATE/DROP/SHOW EXTERNAL TABLE(S), OPTIMIZE
            if external is not None:
                return Result(self, table=self._external.run_statement(external))
            statement = classify(self._parser, text)
            if statement.kind == "prepare":
                return self._sql_prepare(statement)
            if statement.kind == "execute":
                return self._sql_execute(statement)
            if statement.kind == "deallocate":
                if self._prepared.pop(statement.name or "", None) is None:
                    raise QueryError(f"no prepared statement named {statement.name!r}")
                return Result(self, table=pa.table({}))
            if statement.kind == "explain":
                explained = self.explain(statement.body or "", analyze=statement.analyze, travels=statement.travels)
                return Result(self, table=explained)
            if statement.kind in _CATALOG_KINDS:
                return Result(self, table=self._catalog_statement(statement))
            if statement.kind in DML_KINDS:
                self._external.refuse_write(statement)  # issue 14: no write path through an external table
                return Result(self, table=self._dml(statement, params))
            return self._run_planned(self._plan(statement), params)

    def execute(self, text: str, params: Params = None) -> Result:
        """Same as ``sql`` (INSERT and CREATE TABLE AS run at once; their Result holds the row count)."""
        return self.sql(text, params)

    def prepare(self, text: str) -> PreparedStatement:
        _require_text(text)
        with self._lock:
            self._check_open()
            statement = self._preparable(text)
            return PreparedStatement(self, statement, self._plan(statement, defer_tasks=True))

    def _preparable(self, text: str) -> Statement:
        """``text`` as a statement that can be prepared (a query or an INSERT), else a QueryError saying so.

        SQE's own statements (CREATE / DROP EXTERNAL TABLE, SHOW EXTERNAL TABLES, OPTIMIZE) are recognised first,
        as ``sql`` recognises them: DuckDB's parser knows none of them and would call one a syntax error. A client
        that prepares every statement (ADBC, JDBC) then runs it as ``sql`` runs it."""
        if self._external.parse(text) is not None:  # a malformed one raises its own error here, as ``sql`` does
            raise StatementNotPreparableError(_NOT_PREPARABLE)
        statement = classify(self._parser, text)
        if statement.kind not in ("select", "insert"):
            raise StatementNotPreparableError(_NOT_PREPARABLE)
        return statement

    def explain(self, text: str, *, analyze: bool = False, travels: Sequence[TimeTravel] = ()) -> pa.Table:
        """DuckDB's plan, then per table what SQE planned (``explain_tables``), as (section, property, value).

        ``analyze`` runs the query: DuckDB's per-operator time and rows, and per table scan its rows, bytes and
        time. Never a secret; nothing derived from statistics of rows a row filter hides."""
        _require_text(text)
        with self._lock:
            planned = self._plan_explained(text, travels)
            context = self._start()
            measured = self._bind(planned, context, measure=analyze)
            prefix = "EXPLAIN ANALYZE " if analyze else "EXPLAIN "
            started = time.perf_counter()
            try:
                plan_rows = self._con.execute(prefix + planned.statement.text).fetchall()
            except duckdb.Error as exc:
                raise self._translate(exc, context) from None
            elapsed = time.perf_counter() - started
            if context.error is not None:
                raise context.error
            rows: list[tuple[str, str, str]] = []
            for _, plan_text in plan_rows:
                rows.extend(("duckdb plan", "", line) for line in str(plan_text).splitlines() if line.strip())
            if analyze:
                rows.append(("query", "total_time_ms", f"{elapsed * 1000:.1f}"))
            path = self._explained_path(planned, analyze=analyze)  # issue 11 item 1: how the rows reach the caller
            for label, plan in self._explained_scans(planned):
                described = _explain_values(plan, measured.get(label) if analyze else None)
                rows.extend((label, key, value) for key, value in described.items())
                rows.append((label, "execution_path", path))
            for source in self._external.explain_rows([]):  # issue 14: file table functions, external tables
                label = str(source.get("table"))
                rows.extend((label, key, "" if value is None else str(value)) for key, value in source.items())
            return pa.Table.from_pylist(
                [{"section": a, "property": b, "value": c} for a, b, c in rows], schema=_EXPLAIN_SCHEMA
            )

    def _explained_path(self, planned: _Planned, *, analyze: bool) -> str:
        """Which path the query runs on (issue 11 items 1 and 3). EXPLAIN ANALYZE itself always profiles DuckDB."""
        if planned.scans and self._counted(planned) is not None:
            described = "metadata (count(*) from manifest row counts, no data file read)"
            return f"duckdb (EXPLAIN ANALYZE profiles DuckDB; run as a query: {described})" if analyze else described
        try:
            aggregated = self._partial_aggregate(planned, lambda: self._relation(planned.statement.text, None))
        except duckdb.Error:
            aggregated = None
        if aggregated is not None:
            described = f"partial-aggregate ({aggregated.describe()})"
            return f"duckdb (EXPLAIN ANALYZE profiles DuckDB; run as a query: {described})" if analyze else described
        try:
            run = self._pass_through_run(planned, lambda: self._relation(planned.statement.text, None).columns)
        except duckdb.Error:
            run = None
        if run is None:
            return "duckdb"
        described = f"pass-through ({run.shape.describe()})"
        return f"duckdb (EXPLAIN ANALYZE profiles DuckDB; run as a query: {described})" if analyze else described

    def explain_tables(self, text: str) -> pa.Table:
        """One row per table: what ``EXPLAIN``'s table sections show, typed (None where withheld)."""
        _require_text(text)
        with self._lock:
            planned = self._plan_explained(text, ())
            rows = [plan.describe() for _, plan in self._explained_scans(planned)]
            rows = self._external.explain_rows(rows)  # issue 14: file table functions and external tables
            if not rows:
                return pa.table({"table": pa.array([], pa.string())})
            return pa.Table.from_pylist(rows)

    def interrupt(self) -> None:
        """Cancel the running query and its scans (safe to call from another thread)."""
        if self._in_statement:
            self._cancel_requested.set()
        context = self._active
        if context is not None:
            context.cancel.set()
        if not self._closed:
            self._con.interrupt()
            self._parser.interrupt()  # folding constants (file table function arguments, EXECUTE arguments) runs here

    @property
    def distributed_executor(self) -> DistributedExecutor | None:
        """The worker-scan executor when ``[coordinator] workers`` is set (tests, diagnostics), else None."""
        return self._distributed

    def progress(self) -> dict[str, int] | None:
        """The running (or last) statement's scan counters. Of a statement reading a row-filtered table, only the
        rows produced: the files read were pruned with statistics of the hidden rows too (EXPLAIN withholds them
        alike), and every other counter follows them."""
        context = self._active
        if context is None:
            return None
        counters = context.metrics.snapshot()
        if context.counts_withheld:
            return {key: counters[key] for key in SHOWN_WHEN_ROWS_HIDDEN if key in counters}
        return counters

    def list_tables(self, namespace: str | None = None) -> pa.Table:
        """SHOW TABLES [FROM ns] and ``\\dt``: the tables the catalog lets this user see."""
        warehouse, namespaces = self._namespace_arg(namespace)
        what = f"listing tables of {namespace or warehouse}"
        namespace_parts = namespaces[0] if namespaces else None
        idents = self._provider_call(what, lambda: self._provider.list_tables(warehouse, namespace_parts))
        try:
            listed_views = self._provider_call(what, lambda: self._provider.list_views(warehouse, namespace_parts))
        except PermissionDeniedError:
            listed_views = []  # no VIEW_LIST grant: this user sees the tables, and no views (SHOW VIEWS says why)
        return views.relation_listing(idents, listed_views)

    def list_views(self, namespace: str | None = None) -> pa.Table:
        """SHOW VIEWS [FROM ns]: the views the catalog lets this user see."""
        warehouse, namespaces = self._namespace_arg(namespace)
        namespace_parts = namespaces[0] if namespaces else None
        found = self._provider_call(
            f"listing views of {namespace or warehouse}",
            lambda: self._provider.list_views(warehouse, namespace_parts),
        )
        return views.view_listing(found)

    def list_schemas(self, warehouse: str | None = None) -> pa.Table:
        """SHOW SCHEMAS [FROM warehouse]: the namespaces the catalog lets this user see."""
        from sqe.planning import ddl

        warehouse = warehouse or self._default_warehouse
        namespaces = self._provider_call(
            f"listing schemas of {warehouse}", lambda: self._provider.list_namespaces(warehouse)
        )
        return ddl.show_schemas(warehouse, namespaces)

    def describe_table(self, name: str) -> pa.Table:
        """DESCRIBE t and ``\\d t``: columns, SQL and Iceberg types, nullability and this user's masks."""
        from sqe.planning import ddl
        from sqe.planning.planner import restrictions_of

        loaded = self._load(self.resolve_name(parse_qualified_name(name)))
        return ddl.describe_rows(loaded, restrictions_of(loaded))

    def resolve_name(self, parts: Sequence[str]) -> TableIdent:
        if len(parts) == 2:
            return TableIdent(self._default_warehouse, (parts[0],), parts[1])
        if len(parts) == 3:
            return TableIdent(parts[0], (parts[1],), parts[2])
        raise QueryError(f"table name {'.'.join(parts)!r} must be namespace.table or warehouse.namespace.table")

    def close(self) -> None:
        """End the session. A statement another thread is running is interrupted first, and DuckDB's connection
        closes once that statement has stopped (DuckDB refuses to close a connection busy with a call)."""
        if self._closed:
            return
        self.interrupt()
        stopped = self._lock.acquire(timeout=CLOSE_WAIT_SECONDS)
        try:
            self._closed = True
            self._close_open_reader()
            self._close_duckdb()
        finally:
            if stopped:
                self._lock.release()
        if self._distributed is not None:
            self._distributed.close()
        if self._on_close is not None:
            self._on_close()

    def _close_duckdb(self) -> None:
        try:
            self._parser.close()
            self._con.close()
        except duckdb.Error as exc:  # a call outlived CLOSE_WAIT_SECONDS: the connection goes with the session object
            log.warning("session closed while a statement still runs: %s", first_line(exc))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- planning ---------------------------------------------------------------------------------------

    def _plan(self, statement: Statement, *, defer_tasks: bool = False) -> _Planned:
        """``defer_tasks``: read no manifest until a scan's tasks are used (a plan made to check a statement at
        prepare time, which its executions plan again)."""
        statement = self._external.rewrite(statement)  # issue 14: file calls / external tables -> streams
        planned = self._plan_statement(statement, defer_tasks)
        planned.travels = self._plan_travels(statement.travels, defer_tasks)
        return planned

    def _plan_statement(self, statement: Statement, defer_tasks: bool = False) -> _Planned:
        if statement.kind == "select":
            scans, narrowed, metadata, read_views = self._plan_query(statement.text, defer_tasks=defer_tasks)
            return _Planned(statement, scans, narrowed, metadata=metadata, views=read_views)
        if statement.kind == "insert":
            assert statement.target is not None
            target = self._load(self.resolve_name(statement.target))
            scans, narrowed, metadata, read_views = (
                self._plan_query(statement.body, defer_tasks=defer_tasks) if statement.body else ({}, False, {}, {})
            )
            return _Planned(statement, scans, narrowed, target=target, metadata=metadata, views=read_views)
        if statement.kind == "ctas":
            scans, narrowed, metadata, read_views = self._plan_query(statement.body or "", defer_tasks=defer_tasks)
            return _Planned(statement, scans, narrowed, metadata=metadata, views=read_views)
        raise QueryError(f"cannot plan a {statement.kind} statement")

    def _plan_travels(self, travels: Sequence[TimeTravel], defer_tasks: bool = False) -> dict[str, ScanPlan]:
        """One full-width scan per time-travel reference, at its snapshot, under the table's current restrictions."""
        scans: dict[str, ScanPlan] = {}
        for travel in travels:
            from sqe.planning.planner import plan_scan

            ident = self.resolve_name(travel.parts)
            loaded = self._load(ident)
            snapshot_id = resolve_snapshot(loaded, travel, self._parser)
            scans[travel.placeholder] = plan_scan(
                loaded,
                columns=None,
                snapshot_id=snapshot_id,
                cache=self._task_cache,
                remote=self._remote,
                defer_tasks=defer_tasks,
            )
        return scans

    def _plan_explained(self, text: str, travels: Sequence[TimeTravel]) -> _Planned:
        statement = classify(self._parser, text)
        if travels:
            statement = dataclasses.replace(statement, travels=tuple(travels))
        if statement.kind != "select":
            raise QueryError("EXPLAIN supports queries only")
        return self._plan(statement)

    @staticmethod
    def _explained_scans(planned: _Planned) -> list[tuple[str, ScanPlan]]:
        labelled = [(str(ident), plan) for ident, plan in planned.scans.items()]
        for travel in planned.statement.travels:
            plan = planned.travels[travel.placeholder]
            labelled.append((f"{plan.ident} @ snapshot {plan.snapshot_id}", plan))
        return labelled

    def _plan_query(
        self,
        sql: str,
        *,
        loaded: Mapping[TableIdent, LoadedTable] | None = None,
        all_columns: bool = False,
        depth: int = 0,
        defer_tasks: bool = False,
    ) -> tuple[dict[TableIdent, ScanPlan], bool, dict[TableIdent, pa.Table], dict[TableIdent, str]]:
        """Scans, whether any is narrowed, metadata tables, and the catalog views read (expanded, as this user)."""
        tree = parse_select(self._parser, sql)
        all_refs = find_table_refs(tree)
        metadata = self._metadata_tables([r for r in all_refs if "$" in r.parts[-1]])
        refs = [r for r in all_refs if "$" not in r.parts[-1]]
        refs_by_ident = self._group_refs(refs)
        tables: dict[TableIdent, LoadedTable] = dict(loaded) if loaded is not None else {}
        found_views: dict[TableIdent, ViewDefinition] = {}
        for ident in refs_by_ident:
            if ident not in tables:
                found = self._load_table_or_view(ident)
                if isinstance(found, ViewDefinition):
                    found_views[ident] = found
                else:
                    tables[ident] = found
        for ident in found_views:
            del refs_by_ident[ident]
        schemas = {ident: t.table.schema() for ident, t in tables.items()}
        usage = column_usage(tree)
        # A view's columns are not its tables' columns: with a view in the query nothing is pushed (pruning only).
        pushed = {} if found_views else pushdown_predicates(tree, self._ident_of, schemas)
        counts = Counter(self._ident_of(r) for r in refs)
        scans: dict[TableIdent, ScanPlan] = {}
        narrowed = False
        for ident, table_refs in refs_by_ident.items():
            from sqe.execution.metadata_answers import may_count_from_metadata
            from sqe.planning.planner import join_conjuncts, plan_scan  # only for a query that names a table

            columns = None if all_columns else columns_to_read(usage, table_refs, schemas[ident])
            narrowed = narrowed or (columns is not None and len(columns) < len(schemas[ident].columns))
            pushdown = join_conjuncts(pushed.get(ident, [])) if counts[ident] == 1 else join_conjuncts([])
            scans[ident] = plan_scan(
                tables[ident],
                columns=columns,
                pushdown=pushdown,
                cache=self._task_cache,
                remote=self._remote,
                # issue 11 item 3: a bare count(*) may need no manifest
                defer_tasks=defer_tasks or (depth == 0 and may_count_from_metadata(sql)),
                background=True,  # read while DuckDB binds the statement; its first use waits (_run_planned)
            )
        read_views: dict[TableIdent, str] = {}
        for ident, view in found_views.items():
            if depth >= views.MAX_VIEW_DEPTH:
                raise QueryError(f"view {ident}: views nest deeper than {views.MAX_VIEW_DEPTH} (a cycle?)")
            view_sql = views.qualified_sql(
                view, views.runnable_sql(view, self._parser), self._parser, self._known_warehouses()
            )
            inner = self._plan_query(view_sql, all_columns=all_columns, depth=depth + 1, defer_tasks=defer_tasks)
            self._merge_scans(scans, inner[0])
            narrowed = narrowed or inner[1]
            metadata.update(inner[2])
            read_views.update(inner[3])  # what this view reads is created first
            read_views[ident] = view_sql
        return scans, narrowed, metadata, read_views

    def _load_table_or_view(self, ident: TableIdent) -> LoadedTable | ViewDefinition:
        """The table, or else the catalog view of that name; neither is the table's NoSuchTableError."""
        try:
            return self._load(ident)
        except NoSuchTableError as missing:
            try:
                return self._provider.load_view(ident)
            except (NoSuchTableError, PermissionDeniedError):
                # No view either (NoSuchViewError is a NoSuchTableError), or none this user may see: either way
                # the answer is the table lookup's, which never reveals whether a view of that name exists.
                raise missing from None

    def _merge_scans(self, scans: dict[TableIdent, ScanPlan], inner: Mapping[TableIdent, ScanPlan]) -> None:
        """A table read by a query and by a view it uses: one scan, of every column when the two differ."""
        from sqe.planning.planner import plan_scan

        for ident, plan in inner.items():
            outer = scans.get(ident)
            if outer is None:
                scans[ident] = plan
            elif outer.columns != plan.columns or outer.user_filter != plan.user_filter:
                scans[ident] = plan_scan(self._load(ident), columns=None, cache=self._task_cache, remote=self._remote)

    def _metadata_tables(self, refs: list[TableRef]) -> dict[TableIdent, pa.Table]:
        """``ns."t$snapshots"`` and friends: built from the table's metadata, refused on restricted tables."""
        tables: dict[TableIdent, pa.Table] = {}
        for ref in refs:
            ident = self._ident_of(ref)
            if ident in tables:
                continue
            base, which = split_metadata_name(ident.name)
            if which is None:
                continue
            from sqe.planning.planner import restrictions_of

            loaded = self._load(dataclasses.replace(ident, name=base))
            tables[ident] = metadata_table(loaded, which, restrictions_of(loaded), self._task_cache.metadata_io)
        return tables

    def _group_refs(self, refs: list[TableRef]) -> dict[TableIdent, list[TableRef]]:
        grouped: dict[TableIdent, list[TableRef]] = {}
        duck_names: dict[tuple[str, str, str], TableIdent] = {}
        for ref in refs:
            if ref.time_travel:
                raise QueryError("this time-travel form is not supported; use FOR VERSION AS OF / AT (VERSION => ...)")
            ident = self._ident_of(ref)
            self._check_catalog_name(ident.warehouse)
            key = (ident.warehouse.lower(), ident.namespace[0].lower(), ident.name.lower())
            if duck_names.setdefault(key, ident) != ident:
                raise QueryError(f"{ident} and {duck_names[key]} differ only in case; DuckDB cannot tell them apart")
            grouped.setdefault(ident, []).append(ref)
        return grouped

    def _ident_of(self, ref: TableRef) -> TableIdent:
        return self.resolve_name(ref.parts)

    def _load(self, ident: TableIdent) -> LoadedTable:
        try:
            loaded = self._provider.load_table(ident)
        except (NoSuchTableError, PermissionDeniedError):
            self._forget_view(ident)  # DuckDB's own catalog (duckdb_columns()) must not keep naming it
            raise
        if loaded.is_usable(self._clock()):
            return loaded
        loaded = self._provider.load_table(ident, bypass_cache=True)
        if not loaded.is_usable(self._clock()):
            raise CredentialExpiredError(f"the catalog handed out credentials for {ident} that are already expired")
        return loaded

    # -- execution --------------------------------------------------------------------------------------

    def _run_planned(self, planned: _Planned, params: Params) -> Result:
        with self._lock:
            self._check_open()
            kind = planned.statement.kind
            if kind == "select":
                # -- issue 11 item 3 (sqe/execution/metadata_answers.py): a bare count(*) from manifest counts
                counted = self._counted(planned) if params is None and planned.scans else None
                if counted is not None:
                    self._start()
                    self.last_execution_path = "metadata"
                    return Result(self, table=counted)
                planned.start_tasks()  # a bare count metadata could not answer reads its manifests now
                # -- end of issue 11 item 3
                if planned.reads_no_table:
                    return Result(self, relation=self._plain_relation(planned.statement.text, params))
                # The manifests are read on background threads while DuckDB binds the statement and its shape
                # is recognised; the statement waits for them before it returns, so it fails as it always did.
                relation, context = self._query(planned, planned.statement.text, params, self._start())
                # -- issue 11 item 6 (sqe/distributed/coordinator/aggregate.py): workers aggregate, DuckDB merges
                aggregated = self._partial_aggregate(planned, lambda: relation) if params is None else None
                if aggregated is not None:
                    self.last_execution_path = "partial-aggregate"
                    partial = self._partial_relation(aggregated, context)
                    planned.plan_tasks()
                    return Result(self, relation=partial, context=context)
                # -- issue 11 item 1 (sqe/execution/passthrough.py): no copy through DuckDB for plain reads
                run = self._pass_through_run(planned, lambda: relation.columns) if params is None else None
                planned.plan_tasks()
                self.last_execution_path = "duckdb" if run is None else "pass-through"
                return Result(self, relation=relation, context=context, pass_through=run)
            if kind == "insert":
                return Result(self, table=self._insert(planned, [params]))
            if kind == "ctas":
                return Result(self, table=self._create_table_as(planned, params))
            raise QueryError(f"cannot run a {kind} statement")

    @staticmethod
    def _counted(planned: _Planned) -> pa.Table | None:
        from sqe.execution.metadata_answers import count_from_manifests  # issue 11 item 3

        if planned.views or planned.travels or planned.metadata:
            return None  # the name counted is a view (its scans are its tables, not its rows) or no table scan
        return count_from_manifests(planned.statement.text, planned.scans)

    def _partial_aggregate(
        self, planned: _Planned, relation: Callable[[], duckdb.DuckDBPyRelation]
    ) -> PreparedAggregate | None:
        """The statement prepared for partial aggregation on the workers, or None (it runs as before)."""
        if self._distributed is None or self.config is None or not self.config.coordinator.partial_aggregation:
            return None
        if planned.metadata or planned.views or planned.statement.travels or len(self.last_streams) != 1:
            return None
        from sqe.distributed.coordinator import DistributedScanStream
        from sqe.distributed.coordinator.aggregate import ScanShape, prepare

        stream = self.last_streams[0]
        if not isinstance(stream, DistributedScanStream):
            return None
        try:
            tree = parse_select(self._parser, planned.statement.text)
        except QueryError:
            return None

        def binding() -> tuple[Sequence[str], Sequence[object]]:
            bound = relation()
            return bound.columns, bound.types

        plan = stream.plan
        return prepare(
            tree, ScanShape(plan.ident, plan.arrow_schema, plan.read.projected_schema), self._ident_of, binding
        )

    def _partial_relation(self, prepared: PreparedAggregate, context: QueryContext) -> duckdb.DuckDBPyRelation:
        """The final query over the workers' partial rows (a distributed stream registered for this statement)."""
        from sqe.distributed.coordinator import DistributedScanStream

        scan = self.last_streams[0]
        assert self._distributed is not None and isinstance(scan, DistributedScanStream)
        stream = DistributedScanStream(scan.plan, self._distributed, context, partial=prepared.partial)
        name = f"__sqe_partial_{next(self._ids)}"
        self._con.register(name, stream)
        self._registered.append(name)
        self.last_streams[0] = stream  # the statement's scan is the one that runs (the bound one is never read)
        try:
            return self._relation(prepared.final_sql(f"temp.main.{quote_ident(name)}"), None)
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None

    def _pass_through_run(self, planned: _Planned, columns: Callable[[], Sequence[str]]) -> PassThroughRun | None:
        """The statement as a pass-through run of its one scan (in-process or on workers), or None (DuckDB runs it)."""
        if not self.pass_through or planned.metadata or planned.views or planned.statement.travels:
            return None
        if len(self.last_streams) != 1:
            return None  # several tables
        if self._pass_through_planner is None:
            from sqe.execution.passthrough import PassThroughPlanner

            self._pass_through_planner = PassThroughPlanner(self._con, self._parser, self._ident_of)
        return self._pass_through_planner.plan(planned.statement.text, self.last_streams[0], columns)

    def _start(self) -> QueryContext:
        """A new statement: the previous one's views and streams go, and with them its results."""
        from sqe.execution.stream import QueryContext

        self._reset()
        context = QueryContext()
        self._active = context
        return context

    def _check_cancelled(self) -> None:
        """Raise when the running statement was interrupted (before it scans, and between files a TVF lists)."""
        if self._in_statement and self._cancel_requested.is_set():
            from sqe.execution.local import QueryCancelledError

            raise QueryCancelledError()

    def _reset(self) -> None:
        self._check_cancelled()
        self._generation += 1
        self._close_open_reader()
        for view in self._views:
            self._con.execute(f"DROP VIEW IF EXISTS {view}")
        for name in self._registered:
            self._con.unregister(name)
        for _, slot in self._slots.values():
            slot.source = None  # the statement's scans go; a read of a slot now fails, it never reaches them
        self._views, self._registered, self.last_streams = [], [], []
        self._active = None

    def _close_open_reader(self) -> None:
        """An earlier statement's result still streaming holds DuckDB's connection (it runs one result at a time):
        the new statement ends it, as it ends that statement's scans; reading it further is a QueryError. A
        pass-through run holds no DuckDB result but its scan (or its fragments on the workers): it ends the same way."""
        opened, self._open_reader = self._open_reader, None
        reader = None if opened is None else opened()
        if reader is not None:
            with contextlib.suppress(ValueError):  # a run another thread is reading at this moment cannot be closed
                reader.close()

    def _plain_relation(self, sql: str, params: Params) -> duckdb.DuckDBPyRelation:
        """A query that reads no Iceberg table: nothing of SQE's to stream or cancel (DuckDB's own interrupt
        still ends it), so no scan context, executor or pyiceberg."""
        self._reset()
        try:
            return self._relation(sql, params)
        except duckdb.Error as exc:
            raise self._translate(exc, None) from None

    def _bind(
        self,
        planned: _Planned,
        context: QueryContext,
        *,
        scans: Mapping[TableIdent, ScanPlan] | None = None,
        measure: bool = False,
    ) -> dict[str, _MeasuredStream]:
        """Register every scan of the statement (``scans`` replaces its table scans); returns the measured ones."""
        measured: dict[str, _MeasuredStream] = {}
        for ident, plan in (planned.scans if scans is None else scans).items():
            name = self._fill_slot(ident, plan, context, measured, measure)
            self._view(ident, name, plan.arrow_schema)
        for ident, rows in planned.metadata.items():
            name = f"__sqe_meta_{next(self._ids)}"
            self._con.register(name, rows)
            self._registered.append(name)
            self._view(ident, name)
        for travel in planned.statement.travels:
            plan = planned.travels[travel.placeholder]
            label = f"{plan.ident} @ snapshot {plan.snapshot_id}"
            self._register(travel.placeholder, plan, context, measured, label, measure)
        for ident, sql in planned.views.items():
            self._catalog_view(ident, sql)
        return measured

    def _catalog_view(self, ident: TableIdent, sql: str) -> None:
        """A catalog view as a DuckDB view over this statement's own (the invoker's) scans."""
        view = self._ensure_schema(ident) + "." + quote_ident(ident.name)
        try:
            self._con.execute(f"CREATE OR REPLACE VIEW {view} AS {sql}")
        except duckdb.Error as exc:
            raise QueryError(f"view {ident} cannot be run: {_duck_message(exc)}") from None
        self._table_views.pop(view, None)  # replaced, if a table's slot view had that name
        self._views.append(view)

    def _register(
        self,
        name: str,
        plan: ScanPlan,
        context: QueryContext,
        measured: dict[str, _MeasuredStream],
        label: str,
        measure: bool,
    ) -> None:
        stream = self._stream(plan, context)
        self.last_streams.append(stream)
        if measure:
            measured[label] = _MeasuredStream(stream)
            self._con.register(name, measured[label])
        else:
            self._con.register(name, stream)
        self._registered.append(name)

    def _fill_slot(
        self,
        ident: TableIdent,
        plan: ScanPlan,
        context: QueryContext,
        measured: dict[str, _MeasuredStream],
        measure: bool,
    ) -> str:
        """Hand this statement's scan of a table to the table's slot; returns the name the slot is registered as.

        Registering an object costs DuckDB a catalog transaction and probing the object (about as much as the
        rest of a small query's DuckDB work), so each table's slot is registered once per session and only its
        source changes; ``_reset`` empties every slot when the statement ends."""
        stream = self._stream(plan, context)
        self.last_streams.append(stream)
        source: ScanStream | DistributedScanStream | _MeasuredStream = stream
        if measure:
            source = measured[str(ident)] = _MeasuredStream(stream)
        kept = self._slots.get(ident)
        if kept is not None:
            kept[1].source = source
            return kept[0]
        name, slot = f"__sqe_scan_{next(self._ids)}", _ScanSlot(str(ident))
        slot.source = source  # DuckDB reads the schema when registering
        self._con.register(name, slot)
        self._slots[ident] = (name, slot)
        return name

    def _view(self, ident: TableIdent, name: str, slot_schema: pa.Schema | None = None) -> None:
        """``ident`` as a DuckDB view of the registered ``name``. A table slot's view (``slot_schema`` given) stays
        from one statement to the next while the slot's schema does: the slot is empty between statements, so a
        later statement reads nothing through it unless it planned the table again (measured: creating and
        dropping the view cost 2.3 ms per statement). Any other view goes when its statement ends."""
        self._ensure_schema(ident)
        view = _view_name(ident)
        if slot_schema is not None and self._view_unchanged(view, name, slot_schema):
            return
        self._con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM temp.main.{quote_ident(name)}")
        if slot_schema is None:
            self._table_views.pop(view, None)
            self._views.append(view)
        else:
            self._table_views[view] = (name, slot_schema)

    def _forget_view(self, ident: TableIdent) -> None:
        """Drop the view a table's slot kept between statements, once the table is gone or refused."""
        if len(ident.namespace) != 1:
            return  # never given a view (nested namespaces cannot be named in SQL)
        view = _view_name(ident)
        if self._table_views.pop(view, None) is not None:
            self._con.execute(f"DROP VIEW IF EXISTS {view}")

    def _view_unchanged(self, view: str, name: str, slot_schema: pa.Schema) -> bool:
        kept = self._table_views.get(view)
        return kept is not None and kept[0] == name and kept[1].equals(slot_schema, check_metadata=True)

    def _remote_rewriter(self) -> RemoteRewriter | None:
        """issue 14: OPTIMIZE rewrites its bins on the workers when there are any."""
        if self._distributed is None:
            return None
        from sqe.distributed.coordinator.rewrite import rewrite_on_workers

        return functools.partial(rewrite_on_workers, self._distributed)

    def _remote_scanner(self) -> RemoteScanner | None:
        """issue 14: external Parquet tables are read on the workers when there are any."""
        if self._distributed is None:
            return None
        from sqe.distributed.coordinator.external import external_scan_stream

        return functools.partial(external_scan_stream, self._distributed)

    def _stream(self, plan: ScanPlan, context: QueryContext) -> ScanStream | DistributedScanStream:
        from sqe.execution.stream import ScanStream

        if plan.hides_rows():
            context.counts_withheld = True

        if self._distributed is None:
            return ScanStream(plan, self._executor, context)
        from sqe.distributed.coordinator import DistributedScanStream

        return DistributedScanStream(plan, self._distributed, context)

    def _query(
        self, planned: _Planned, sql: str, params: Params, context: QueryContext
    ) -> tuple[duckdb.DuckDBPyRelation, QueryContext]:
        self._bind(planned, context)
        try:
            return self._relation(sql, params), context
        except duckdb.BinderException as exc:
            if not planned.narrowed:
                raise self._translate(exc, context) from None
            # DuckDB's text quotes the statement's names, which may be a URL with a password.
            log.debug("re-planning with every column after a binder error: %s", redact_credentials(first_line(exc)))
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None
        # A narrowed projection missed something DuckDB needs: read every column instead (correctness first).
        loaded = {ident: plan.loaded for ident, plan in planned.scans.items()}
        scans, _, _, _ = self._plan_query(sql, loaded=loaded, all_columns=True)
        for plan in scans.values():
            plan.task_source.get()  # a planning failure is this statement's, raised here (as _run_planned does)
        context = self._start()
        self._bind(planned, context, scans=scans)
        try:
            return self._relation(sql, params), context
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None

    def _relation(self, sql: str, params: Params) -> duckdb.DuckDBPyRelation:
        relation = self._con.sql(sql, params=params) if params is not None else self._con.sql(sql)
        if relation is None:
            raise QueryError("the statement returned no result")
        return relation

    def _materialise(self, planned: _Planned, sql: str, params: Params) -> pa.Table:
        relation, context = self._query(planned, sql, params, self._start())
        _refuse_types_arrow_drops(relation)
        try:
            return relation.to_arrow_table()
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None

    def _insert(self, planned: _Planned, param_sets: Sequence[Params]) -> pa.Table:
        """The INSERT run once per parameter set into one staging table, whose rows are then appended at once:
        one commit for the batch, nothing committed when any set fails."""
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        statement, target = planned.statement, planned.target
        assert target is not None and statement.target_span is not None
        arrow_schema = schema_to_pyarrow(target.table.schema(), include_field_ids=False)
        staging = f"__sqe_insert_{next(self._ids)}"
        shape = f"{staging}_shape"
        start, end = statement.target_span
        rewritten = statement.text[:start] + f"temp.main.{quote_ident(staging)}" + statement.text[end:]
        try:
            self._con.register(shape, pa.Table.from_batches([], arrow_schema))
            self._con.execute(f"CREATE TEMP TABLE {quote_ident(staging)} AS SELECT * FROM {quote_ident(shape)}")
            self._con.unregister(shape)
            self.last_execution_path = "duckdb"
            order = self._values_parameters(planned) if len(param_sets) > 1 and self.columnar_batches else None
            if order is None:
                self._stage_each(planned, rewritten, param_sets, 0, len(param_sets))
            else:
                self._stage_columnar(planned, staging, rewritten, param_sets, order)
            rows = self._con.sql(f"SELECT * FROM temp.main.{quote_ident(staging)}").to_arrow_table()
        except duckdb.Error as exc:
            raise self._translate(exc, None) from None  # the staging table's own statements: no scan involved
        finally:
            self._con.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(staging)}")
        self._append(target, rows)
        return pa.table({"count": pa.array([rows.num_rows], pa.int64())})

    def _stage_each(
        self, planned: _Planned, rewritten: str, param_sets: Sequence[Params], first: int, end: int
    ) -> None:
        """Parameter sets ``first`` to ``end`` (exclusive) into the staging table, one execution each. In a batch, a
        set's error names the set."""
        for index in range(first, end):
            try:
                self._stage_insert(planned, rewritten, param_sets[index])
            except QueryError as exc:
                if len(param_sets) == 1 or type(exc) is not QueryError:  # a cancel, a scan's own error: as raised
                    raise
                raise QueryError(f"parameter set {index + 1} of {len(param_sets)}: {exc}") from None

    def _stage_insert(self, planned: _Planned, rewritten: str, params: Params) -> None:
        """One parameter set's rows into the staging table, over scans of its own (a scan stream is read once)."""
        context = self._start()
        self._bind(planned, context)
        try:
            self._con.execute(rewritten, params) if params is not None else self._con.execute(rewritten)
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None

    def _values_parameters(self, planned: _Planned) -> list[int] | None:
        """For ``INSERT INTO t [(columns)] VALUES ($1, ..., $n)`` (every value a parameter, numbered 1..n in any
        order, repeats allowed): the parameter numbers in VALUES order. None for any other INSERT, which runs once
        per parameter set."""
        statement = planned.statement
        body = statement.body
        if body is None or not planned.reads_no_table or statement.travels or statement.target_span is None:
            return None
        header = statement.text[statement.target_span[1] : len(statement.text) - len(body)]
        if body.lstrip()[:6].upper() != "VALUES" or _PLAIN_INSERT_HEADER.fullmatch(header) is None:
            return None  # INSERT ... AS alias, BY NAME / BY POSITION: DuckDB's own path
        try:
            tree = parse_select(self._parser, body)
        except QueryError:
            return None
        source = tree.get("from_table") or {}
        values = source.get("values") or []
        if source.get("type") != "EXPRESSION_LIST" or len(values) != 1 or any(tree.get(k) for k in _SELECT_EXTRAS):
            return None  # several VALUES rows (their types are unified across rows), ORDER BY, LIMIT, ...
        numbers: list[int] = []
        for value in values[0]:
            identifier = str(value.get("identifier", ""))
            # ASCII digits only: DuckDB names ``$²`` as it names ``$x``, and int() refuses it
            if value.get("class") != "PARAMETER" or not (identifier.isascii() and identifier.isdigit()):
                return None  # an expression, a constant, DEFAULT, a named parameter
            numbers.append(int(identifier))
        return numbers if numbers and set(numbers) == set(range(1, max(numbers) + 1)) else None

    def _stage_columnar(
        self, planned: _Planned, staging: str, rewritten: str, param_sets: Sequence[Params], order: list[int]
    ) -> None:
        """Every parameter set's row into the staging table by one INSERT ... SELECT over the sets as Arrow columns
        (bench/execute_many.py: one execution per set costs about a millisecond each). The columns carry the
        types DuckDB binds each Python value as, so the INSERT casts the same values from the same types as one
        execution per set does. Sets from the first one of another shape (length, a Mapping) on run one by one, so
        DuckDB raises its own error for it; a batch whose values cannot all be typed so runs one by one throughout."""
        count = max(order)
        rows: list[Sequence[Any]] = []
        for params in param_sets:
            if not isinstance(params, list | tuple) or len(params) != count:
                break
            rows.append(params)
        fits = len(rows)
        table = _parameter_table(rows, count)
        if table is None:
            self._stage_each(planned, rewritten, param_sets, 0, len(param_sets))
            return
        select = ", ".join(f"p.{quote_ident(str(number))}" for number in order)
        insert = rewritten[: len(rewritten) - len(planned.statement.body or "")] + f"SELECT {select} FROM "
        if fits and not self._insert_rows(insert, table):
            # Some set fails: find the first one (a prefix that fails keeps failing when longer) and let its own
            # execution raise exactly what one execution per set raises.
            good, bad = 0, fits
            while bad - good > 1:
                middle = (good + bad) // 2
                good, bad = (middle, bad) if self._insert_rows(insert, table.slice(0, middle)) else (good, middle)
            self._stage_each(planned, rewritten, param_sets, bad - 1, bad)
            # That set alone succeeded (it never has): the batch runs one set at a time after all, from the start.
            self._con.execute(f"DELETE FROM temp.main.{quote_ident(staging)}")
            self._stage_each(planned, rewritten, param_sets, 0, len(param_sets))
            return
        if fits == len(param_sets):
            self.last_execution_path = "columnar-batch"
        self._stage_each(planned, rewritten, param_sets, fits, len(param_sets))

    def _insert_rows(self, insert: str, table: pa.Table) -> bool:
        """``insert`` over ``table``, registered for this one execution; False when DuckDB refuses it (a cancel
        raises)."""
        context = self._start()
        name = f"__sqe_params_{next(self._ids)}"
        self._con.register(name, table)
        try:
            self._con.execute(f"{insert}temp.main.{quote_ident(name)} AS p")
        except duckdb.Error as exc:
            error = self._translate(exc, context)
            if type(error) is not QueryError:
                raise error from None
            log.debug("%d parameter sets as one INSERT failed: %s", table.num_rows, error)
            return False
        finally:
            self._con.unregister(name)
        return True

    def _create_table_as(self, planned: _Planned, params: Params) -> pa.Table:
        statement = planned.statement
        assert statement.target is not None and statement.body is not None
        ident = self.resolve_name(statement.target)
        if statement.if_not_exists and self._exists(ident):
            return pa.table({"count": pa.array([0], pa.int64())})
        rows = self._materialise(planned, statement.body, params)
        schema = _writable_schema(rows.schema)
        conform_for_write(rows, _iceberg_schema(schema, ident), ident)  # refused before anything is created
        loaded = self._provider.create_table(ident, schema)
        try:
            self._append(loaded, rows)
        except SQEError:
            self._drop_if_still_empty(loaded)  # a failed CTAS leaves no empty table behind
            raise
        return pa.table({"count": pa.array([rows.num_rows], pa.int64())})

    def _drop_if_still_empty(self, created: LoadedTable) -> None:
        """Drop the table this statement created, unless a snapshot arrived since or the name now holds another
        table (dropped and created again meanwhile): never someone else's rows. (The REST drop is by name, so a
        commit landing between this check and the drop can still be lost; that window is one round trip.)"""
        ident = created.ident
        try:
            table = self._provider.load_table(ident, bypass_cache=True).table
            if table.metadata.table_uuid == created.table.metadata.table_uuid and table.current_snapshot() is None:
                self._provider.drop_table(ident)
        except SQEError as exc:
            log.warning("could not drop %s after its CREATE TABLE AS failed: %s", ident, exc)

    def _append(self, loaded: LoadedTable, rows: pa.Table) -> None:
        from sqe.execution.commit import append_rows  # pyiceberg's writer: loaded when a write needs it

        if rows.num_rows == 0:
            return
        data = conform_for_write(rows, loaded.table.schema(), loaded.ident)
        try:
            append_rows(loaded, data)  # through SQE's scoped FileIO; committed via the table's catalog
        finally:
            # The cached entry describes the table before this commit; after a failed one (a conflict: someone
            # else committed) it is stale too, and a revalidation interval must not serve it again.
            self._provider.invalidate(loaded.ident)

    def _exists(self, ident: TableIdent) -> bool:
        return _loads(self._provider.load_table, ident)

    # -- catalog statements -----------------------------------------------------------------------------

    def _catalog_statement(self, statement: Statement) -> pa.Table:
        """DDL and discovery: answered by the catalog as this user; DuckDB never sees them."""
        from sqe.planning import ddl
        from sqe.planning.planner import restrictions_of

        kind, parts = statement.kind, statement.target or ()
        if kind == "show_tables":
            return self.list_tables(".".join(parts) if parts else None)
        if kind == "show_schemas":
            if len(parts) > 1:
                raise QueryError("use SHOW SCHEMAS [FROM warehouse]")
            return self.list_schemas(parts[0] if parts else None)
        if kind == "describe":
            return ddl.describe_rows(loaded := self._load(self.resolve_name(parts)), restrictions_of(loaded))
        if kind == "show_create_table":
            loaded = self._load(self.resolve_name(parts))
            return pa.table({"create_table": [ddl.show_create_table(loaded)]})
        if kind in ("create_schema", "drop_schema"):
            return self._schema_statement(statement)
        if kind == "show_views":
            return self.list_views(".".join(parts) if parts else None)
        if kind in ("create_view", "drop_view"):
            return self._view_statement(statement)
        ident = self.resolve_name(parts)
        if kind == "create_table":
            assert statement.columns_text is not None
            schema = ddl.arrow_schema_of_columns(statement.columns_text)
            if statement.if_not_exists and self._exists(ident):
                return _status("table exists")
            self._provider.create_table(ident, schema)
            return _status(f"created table {ident}")
        if kind == "drop_table":
            try:
                self._provider.drop_table(ident)
            except NoSuchTableError:
                if not statement.if_exists:
                    raise
                return _status("no such table")
            return _status(f"dropped table {ident}")
        assert kind == "alter_table" and statement.alter is not None
        try:
            loaded = self._load(ident)
        except NoSuchTableError:
            if statement.if_exists:
                return _status("no such table")
            raise
        try:
            ddl.alter_table(loaded, statement.alter)
        finally:  # a failed commit (a concurrent change) leaves the cached metadata as stale as a successful one
            self._provider.invalidate(ident)
        return _status(f"altered table {ident}")

    def _view_statement(self, statement: Statement) -> pa.Table:
        """CREATE [OR REPLACE] VIEW and DROP VIEW: stored in the catalog (dialect duckdb), as this user."""
        ident = self.resolve_name(statement.target or ())
        if statement.kind == "drop_view":
            try:
                self._provider_call(f"dropping view {ident}", lambda: self._provider.drop_view(ident))
            except NoSuchViewError:
                if statement.if_exists:
                    return _status("no such view")
                raise
            return _status(f"dropped view {ident}")
        if statement.travels:
            raise QueryError("time travel in a view definition is not supported")
        query = classify(self._parser, statement.body or "")
        if query.kind != "select" or query.travels:
            raise QueryError("a view is defined by one query: CREATE VIEW ns.v AS SELECT ...")
        if statement.if_not_exists and self._view_exists(ident):
            return _status(f"view {ident} exists")
        # Planned as every later reader runs it: its names resolve in the view's warehouse and namespace.
        as_stored = ViewDefinition(ident, (), ident.namespace, 0, ident.warehouse)
        schema = self._query_schema(
            self._plan(classify(self._parser, views.qualified_sql(as_stored, query.text, self._parser)))
        )
        self._provider_call(
            f"creating view {ident}",
            lambda: self._provider.create_view(
                ident, schema, query.text, views.SQE_DIALECT, replace=statement.or_replace
            ),
        )
        return _status(f"created view {ident}")

    def _known_warehouses(self) -> tuple[str, ...] | None:
        """The warehouses a view's ``default-catalog`` may name (None without a config: any). One withheld from
        this session (``view_warehouses``) is named as such, so fails as unknown: it never means the view's own."""
        if self.config is None:
            return None
        return (*self.config.catalog.warehouse_names, *self._view_warehouses)

    def _view_exists(self, ident: TableIdent) -> bool:
        return _loads(self._provider.load_view, ident)

    def _query_schema(self, planned: _Planned) -> pa.Schema:
        """The result schema of a planned query, as Iceberg can store it (no rows are read)."""
        context = self._start()
        self._bind(planned, context)
        try:
            relation = self._relation(planned.statement.text, None)
            return _writable_schema(relation.limit(0).to_arrow_table().schema)
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None

    def _schema_statement(self, statement: Statement) -> pa.Table:
        warehouse, namespaces = self._namespace_arg(".".join(statement.target or ()))
        namespace = namespaces[0]
        what = ".".join((warehouse, *namespace))
        if statement.kind == "create_schema":
            try:
                self._provider_call(
                    f"creating schema {what}", lambda: self._provider.create_namespace(warehouse, namespace)
                )
            except CatalogError as exc:
                if statement.if_not_exists and exc.status == 409:
                    return _status(f"schema {what} exists")
                raise
            return _status(f"created schema {what}")
        try:
            self._provider_call(f"dropping schema {what}", lambda: self._provider.drop_namespace(warehouse, namespace))
        except NoSuchNamespaceError:
            if statement.if_exists:
                return _status(f"no schema {what}")
            raise
        return _status(f"dropped schema {what}")

    def _provider_call(self, what: str, call: Callable[[], _T]) -> _T:
        from sqe.catalog.errors import PYICEBERG_CATALOG_ERRORS, translate_error

        try:
            return call()
        except SQEError:
            raise
        except PYICEBERG_CATALOG_ERRORS as exc:
            raise translate_error(exc, what) from None
        except Exception as exc:  # a provider must raise SQEError; anything else still fails closed, typed
            raise CatalogError(f"{what} failed: {first_line(exc)}") from None

    # -- DELETE / UPDATE / MERGE ------------------------------------------------------------------------

    def _dml(self, statement: Statement, params: Params) -> pa.Table:
        """Copy-on-write: the statement runs on a staged copy of the target; changed files are rewritten."""
        from sqe.execution import dml
        from sqe.planning.planner import plan_scan, restrictions_of

        assert statement.target is not None and statement.target_span is not None
        ident = self.resolve_name(statement.target)
        loaded = self._load(ident)
        if restrictions_of(loaded).is_restricted:
            raise RestrictedTableError(
                f"{ident}: you read this table through read-restrictions; {statement.kind.upper()} is refused"
            )
        target_plan = plan_scan(loaded, columns=None, remote=self._remote)
        sources = {}
        for parts in statement.sources:
            source = self.resolve_name(parts)
            source_loaded = loaded if source == ident else self._load(source)
            sources[source] = plan_scan(source_loaded, columns=None, cache=self._task_cache, remote=self._remote)
        planned = _Planned(statement, sources, travels=self._plan_travels(statement.travels))
        context = self._start()
        self._bind(planned, context)
        staging = f"__sqe_dml_{next(self._ids)}"
        start, end = statement.target_span
        alias = f" AS {quote_ident(statement.target[-1])}" if statement.alias_missing else ""
        rewritten = statement.text[:start] + f"temp.main.{quote_ident(staging)}{alias}" + statement.text[end:]
        staged = None
        try:
            staged = dml.stage_target(self._con, target_plan, self._executor, context, staging)
            if statement.merge_join is not None:
                self._refuse_ambiguous_merge(statement, staging, params)
            result = self._con.execute(rewritten, params) if params is not None else self._con.execute(rewritten)
            counted = result.fetchall()
            rewrite = dml.find_rewrite(self._con, staged, target_plan)
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None
        finally:
            dml.drop_staged(self._con, staged, staging)
        count = int(counted[0][0]) if counted and counted[0] else 0
        if rewrite.replaced or rewrite.rows.num_rows:
            data = conform_for_write(rewrite.rows, loaded.table.schema(), ident)
            try:
                dml.commit_rewrite(loaded, target_plan, rewrite, data, statement.kind)
            finally:  # committed, or refused because the table changed: either way the entry is stale
                self._provider.invalidate(ident)
        return pa.table({"count": pa.array([count], pa.int64())})

    def _refuse_ambiguous_merge(self, statement: Statement, staging: str, params: Params) -> None:
        """A target row that more than one source row matches is an error (SQL's cardinality rule, as in Spark and
        Trino); DuckDB would apply each match in turn, and which one the row keeps would be arbitrary."""
        join = statement.merge_join
        assert join is not None and statement.target is not None
        name = quote_ident(statement.target[-1]) if statement.alias_missing else join.target_name
        alias = f" AS {name}" if statement.alias_missing else f" {join.alias}"
        # The WHEN clauses' parameters are referenced too, in order, so the statement's parameters fit the check.
        uses = "".join(f" AND ({parameter} IS NULL OR true)" for parameter in join.later_parameters)
        check = (
            f"SELECT count(*) FROM (SELECT 1 FROM temp.main.{quote_ident(staging)}{alias} JOIN {join.source} "
            f"{join.condition} GROUP BY {name}.rowid HAVING count(*) > 1) WHERE true{uses}"
        )
        row = (self._con.execute(check, params) if params is not None else self._con.execute(check)).fetchone()
        if row is not None and row[0]:
            raise QueryError(
                f"MERGE into {self.resolve_name(statement.target)}: {row[0]} target row(s) matched more than one "
                "source row; nothing was written"
            )

    # -- PREPARE / EXECUTE in SQL -----------------------------------------------------------------------

    def _sql_prepare(self, statement: Statement) -> Result:
        assert statement.name is not None and statement.body is not None
        inner = self._preparable(statement.body)
        if statement.travels:
            inner = dataclasses.replace(inner, travels=statement.travels)
        self._prepared[statement.name] = PreparedStatement(self, inner, self._plan(inner, defer_tasks=True))
        return Result(self, table=pa.table({}))

    def _sql_execute(self, statement: Statement) -> Result:
        prepared = self._prepared.get(statement.name or "")
        if prepared is None:
            raise QueryError(f"no prepared statement named {statement.name!r}")
        params = self._evaluate_arguments(statement.args) if statement.args else None
        return prepared.execute(params)

    def _evaluate_arguments(self, args: str) -> list[Any]:
        """EXECUTE arguments are constant expressions; fold them on the table-less parser connection."""
        try:
            row = fold_row(self._parser, args, "EXECUTE")
        except duckdb.Error as exc:
            raise QueryError(f"bad EXECUTE arguments: {_duck_message(exc)}") from None
        return list(row) if row is not None else []

    # -- helpers ----------------------------------------------------------------------------------------

    def _translate(self, exc: BaseException, context: QueryContext | None) -> SQEError:
        if context is not None and context.error is not None:
            return context.error
        if isinstance(exc, duckdb.InterruptException) or (context is not None and context.cancel.is_set()):
            from sqe.execution.local import QueryCancelledError

            return QueryCancelledError()
        if out_of_memory(exc):
            return QueryResourceError(f"{_duck_message(exc)} (the query needs more than its engine's limits)")
        return QueryError(_duck_message(exc))

    def _before_lock(self, con: duckdb.DuckDBPyConnection) -> None:
        if self._database_limits is not None:
            self._database_limits.apply(con)
        self._use_default_warehouse(con)

    def _use_default_warehouse(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {quote_ident(self._default_warehouse)}")
        con.execute(f"USE {quote_ident(self._default_warehouse)}")

    def _ensure_schema(self, ident: TableIdent) -> str:
        if len(ident.namespace) != 1:
            raise QueryError(f"{ident}: nested namespaces cannot be named in SQL")
        key = (ident.warehouse, ident.namespace[0])
        qualified = quote_qualified(*key)
        if key not in self._schemas:
            self._con.execute(f"ATTACH IF NOT EXISTS ':memory:' AS {quote_ident(ident.warehouse)}")
            self._con.execute(f"CREATE SCHEMA IF NOT EXISTS {qualified}")
            self._schemas.add(key)
        return qualified

    @staticmethod
    def _check_catalog_name(warehouse: str) -> None:
        if not warehouse or warehouse.lower() in _RESERVED_CATALOGS:
            raise QueryError(f"warehouse name {warehouse!r} cannot be used in SQL (reserved by DuckDB)")

    def _check_open(self) -> None:
        if self._closed:
            raise QueryError("the session is closed")

    def _namespace_arg(self, namespace: str | None) -> tuple[str, list[tuple[str, ...]]]:
        if namespace is None:
            return self._default_warehouse, []
        parts = parse_qualified_name(namespace)
        if len(parts) == 1:
            return self._default_warehouse, [parts]
        if len(parts) == 2:
            return parts[0], [parts[1:]]
        raise QueryError(f"namespace {namespace!r} must be namespace or warehouse.namespace")


# ---------------------------------------------------------------------------------------------- functions


_T = TypeVar("_T")


class _ScanSlot(Unpicklable):
    """What DuckDB has registered for one table of a session: the running statement's scan of it, or nothing.

    Between statements the slot is empty, and DuckDB reading it (a stale view) fails with a QueryError instead of
    reaching an old scan, whose credentials and plan the catalog has not just authorized."""

    _pickle_refusal = "a scan slot holds a scan with credentials and cannot be pickled"

    def __init__(self, label: str) -> None:
        self._label = label
        self.source: ScanStream | DistributedScanStream | _MeasuredStream | None = None

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        source = self.source
        if source is None:
            raise QueryError(f"{self._label} is not part of the running statement")
        return source.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        return f"_ScanSlot({self._label}, {'filled' if self.source is not None else 'empty'})"


class _MeasuredStream:
    """A scan stream that counts what DuckDB pulled from it and the time spent producing it (EXPLAIN ANALYZE)."""

    def __init__(self, stream: ScanStream | DistributedScanStream) -> None:
        self.stream = stream
        self.seconds = 0.0
        self.rows = 0
        self.batches = 0
        self.arrow_bytes = 0  # of the batches after restrictions: only rows the user may see

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        reader = self.stream.reader()
        return pa.RecordBatchReader.from_batches(reader.schema, self._timed(reader)).__arrow_c_stream__(
            requested_schema
        )

    def _timed(self, reader: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        while True:
            started = time.perf_counter()
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                self.seconds += time.perf_counter() - started
                return
            self.seconds += time.perf_counter() - started
            self.rows += batch.num_rows
            self.batches += 1
            self.arrow_bytes += batch.nbytes
            yield batch


def _explain_values(plan: ScanPlan, measured: _MeasuredStream | None) -> dict[str, str]:
    """One table's EXPLAIN section as text; what a row filter would let leak is withheld."""
    values: dict[str, str] = {}
    for key, value in plan.describe().items():
        if key == "table":
            continue
        values[key] = WITHHELD if value is None else str(value)
    if measured is not None:
        values["scan_rows"] = str(measured.rows)  # rows after the restrictions: what the query itself sees
        values["scan_batches"] = str(measured.batches)
        values["scan_arrow_bytes"] = str(measured.arrow_bytes)
        values["scan_time_ms"] = f"{measured.seconds * 1000:.1f}"
    return values


def _require_text(text: str) -> None:
    """SQL must be encodable text: a byte that was not UTF-8 (decoded as a lone surrogate by stdin or argv)
    would otherwise fail deep in DuckDB's tokenizer with a TypeError."""
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise QueryError(f"the statement is not valid UTF-8 text (character {exc.start + 1})") from None


def explain_sections(explained: pa.Table) -> dict[str, dict[str, str]]:
    """EXPLAIN's table sections as {table: {property: value}} (the DuckDB plan lines are left out)."""
    sections: dict[str, dict[str, str]] = {}
    for row in explained.to_pylist():
        if row["section"] != "duckdb plan":
            sections.setdefault(row["section"], {})[row["property"]] = row["value"]
    return sections


def _view_name(ident: TableIdent) -> str:
    """The DuckDB view a table of a one-level namespace is read through: ``warehouse.namespace.name``, quoted."""
    return quote_qualified(ident.warehouse, ident.namespace[0]) + "." + quote_ident(ident.name)


def _status(message: str) -> pa.Table:
    return pa.table({"status": [message]})


# Between an INSERT's table name and its VALUES: nothing, or a column list (no alias, no BY NAME / BY POSITION).
_PLAIN_INSERT_HEADER = re.compile(r"\s*(\([^()]*\)\s*)?")
_SELECT_EXTRAS = ("modifiers", "where_clause", "group_expressions", "group_sets", "having", "qualify", "sample")
# The DuckDB type each Python value binds as, in Arrow (an int as INTEGER or BIGINT: either casts the same). Other
# values (Decimal, whose type follows each value's digits; an aware datetime; a nested value) are not batched.
_PARAMETER_TYPES: dict[type, pa.DataType] = {
    bool: pa.bool_(),
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bytes: pa.binary(),
    datetime.date: pa.date32(),
    datetime.datetime: pa.timestamp("us"),
}


def _parameter_table(rows: Sequence[Sequence[Any]], count: int) -> pa.Table | None:
    """Parameter rows (``count`` values each) as Arrow columns named "1".."count", each column of one
    type of ``_PARAMETER_TYPES`` (or all NULL); None when a column mixes types (1 and 1.5 bind as INTEGER and
    DOUBLE: one column would turn 1 into 1.0) or holds a value not listed there."""
    columns = []
    for index in range(count):
        values = [row[index] for row in rows]
        kinds = {type(value) for value in values if value is not None}
        if len(kinds) > 1:
            return None
        arrow_type = _PARAMETER_TYPES.get(kinds.pop()) if kinds else pa.null()
        if arrow_type is None:
            return None
        if arrow_type == pa.timestamp("us") and any(value is not None and value.tzinfo for value in values):
            return None
        try:
            columns.append(pa.array(values, type=arrow_type))
        except (pa.ArrowException, OverflowError, ValueError):  # an int beyond BIGINT, a str DuckDB cannot take
            return None
    return pa.table(columns, names=[str(number) for number in range(1, count + 1)])


def _refuse_types_arrow_drops(relation: duckdb.DuckDBPyRelation) -> None:
    """DuckDB exports ``TIME WITH TIME ZONE`` as a plain Arrow time, its offset dropped: written, the values would
    silently change meaning."""
    for name, kind in zip(relation.columns, relation.types, strict=True):
        if "TIME WITH TIME ZONE" in str(kind):  # alone or nested (a list or struct of them)
            raise QueryError(
                f"column {name!r} holds TIME WITH TIME ZONE, which Iceberg cannot store (its offset would be lost): "
                "cast it to TIME or TIMESTAMPTZ"
            )


def _iceberg_schema(schema: pa.Schema, ident: TableIdent) -> Schema:
    """The Iceberg schema a catalog will create for ``schema`` (as pyiceberg converts it), or a QueryError naming
    the first column Iceberg cannot store."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.io.pyarrow import UnsupportedPyArrowTypeException

    try:
        return Catalog._convert_schema_if_needed(schema)
    except UnsupportedPyArrowTypeException as exc:
        raise QueryError(
            f"cannot create {ident}: column {exc.field.name!r} has type {exc.field.type}, which Iceberg cannot store"
        ) from None
    except (TypeError, ValueError) as exc:
        raise QueryError(f"cannot create {ident}: {first_line(exc)}") from None


def _writable_schema(schema: pa.Schema) -> pa.Schema:
    """Arrow types Iceberg has no twin for are narrowed to the closest one it has."""
    fields = []
    for f in schema:
        if pa.types.is_string_view(f.type) or pa.types.is_large_string(f.type):
            f = f.with_type(pa.string())
        elif pa.types.is_binary_view(f.type) or pa.types.is_large_binary(f.type):
            f = f.with_type(pa.binary())
        fields.append(f)
    return pa.schema(fields)


def _duck_message(exc: BaseException) -> str:
    line = first_line(exc)
    detail = line.find(". Detail: Python exception")
    return line[:detail] if detail >= 0 else line


def _loads(load: Callable[[TableIdent], object], ident: TableIdent) -> bool:
    """True when ``load`` finds ``ident``; any other failure than "no such table" propagates."""
    try:
        load(ident)
    except NoSuchTableError:
        return False
    return True
