"""A user's SQL session: a locked-down DuckDB connection that sees Iceberg tables only as SQE scan streams.

How a table name in SQL reaches DuckDB: the statement is parsed (``json_serialize_sql``, no binding) and every
two- or three-part base-table name becomes a ``TableIdent`` (``namespace.table`` means the default warehouse).
Each table is loaded through the user's ``TableProvider`` and planned; its ``ScanStream`` is registered under a
unique name and a view named exactly like the table (DuckDB catalog = warehouse, schema = namespace) selects
from it. DuckDB then resolves ``wh.ns.t``, ``ns.t`` (the default warehouse's catalog is the connection's default)
and ``ns.t.col`` natively. Views and streams live until the next statement. In-memory ATTACH, CREATE SCHEMA and
CREATE VIEW all work under the lockdown; users cannot run them (only queries, EXPLAIN, INSERT, CREATE TABLE AS,
PREPARE/EXECUTE/DEALLOCATE are accepted).

Projection: the columns each table can need are found from the parse tree (``sql_analysis``); if DuckDB still
fails to bind a narrowed query, it is re-planned once with every column. Filters are never pushed by DuckDB into
raw data: the streams are plain C streams; simple predicates on unmasked columns go to pyiceberg for pruning
only, and DuckDB re-applies every WHERE itself.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
from pyiceberg.io.pyarrow import schema_to_pyarrow

from sqe._text import first_line
from sqe.catalog.base import LoadedTable, TableIdent, TableProvider
from sqe.catalog.errors import PYICEBERG_CATALOG_ERRORS, translate_error
from sqe.duckdb_connection import connect_locked_down, quote_ident, quote_qualified
from sqe.errors import (
    CatalogError,
    CredentialExpiredError,
    NoSuchTableError,
    QueryError,
    SQEError,
)
from sqe.execution.local import LocalExecutor, QueryCancelledError
from sqe.execution.metadata_answers import count_from_manifests  # issue 11 item 3
from sqe.execution.stream import QueryContext, ScanStream
from sqe.planning.planner import ScanPlan, TaskCache, join_conjuncts, plan_scan, restrictions_of
from sqe.planning.sql_analysis import (
    TableRef,
    column_usage,
    columns_to_read,
    find_table_refs,
    parse_select,
    pushdown_predicates,
)
from sqe.planning.statements import Statement, classify, parse_qualified_name

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from sqe.config import SQEConfig
    from sqe.distributed.coordinator import DistributedExecutor, DistributedOptions, DistributedScanStream

log = logging.getLogger(__name__)

Params = Sequence[Any] | Mapping[str, Any] | None
_RESERVED_CATALOGS = {"system", "temp"}


# ------------------------------------------------------------------------------------------------ results


class Result:
    """The outcome of one statement. A query runs when read (``arrow()`` or ``reader()``), at most once."""

    def __init__(
        self,
        session: Session,
        *,
        relation: duckdb.DuckDBPyRelation | None = None,
        table: pa.Table | None = None,
        context: QueryContext | None = None,
    ) -> None:
        self._session = session
        self._relation = relation
        self._table = table
        self._context = context
        self._generation = session._generation
        self._consumed = False

    def arrow(self) -> pa.Table:
        if self._table is None:
            relation = self._take_relation()
            try:
                self._table = relation.to_arrow_table()
            except duckdb.Error as exc:
                raise self._session._translate(exc, self._context) from None
        return self._table

    def reader(self, batch_size: int = 122_880) -> pa.RecordBatchReader:
        if self._table is not None:
            return self._table.to_reader()
        relation = self._take_relation()
        try:
            source = relation.to_arrow_reader(batch_size)
        except duckdb.Error as exc:
            raise self._session._translate(exc, self._context) from None
        return pa.RecordBatchReader.from_batches(source.schema, self._translated(source))

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [tuple(row.values()) for row in self.arrow().to_pylist()]

    def _translated(self, source: pa.RecordBatchReader) -> Iterator[pa.RecordBatch]:
        try:
            yield from source
        except duckdb.Error as exc:
            raise self._session._translate(exc, self._context) from None

    def _take_relation(self) -> duckdb.DuckDBPyRelation:
        if self._relation is None or self._consumed:
            raise QueryError("this result has already been read")
        if self._generation != self._session._generation:
            raise QueryError("this result is no longer valid: the session has run another statement since")
        self._consumed = True
        return self._relation


@dataclass
class _Planned:
    """A statement's stored plan: its tables (with their FileIO and credentials) and their scans."""

    statement: Statement
    scans: dict[TableIdent, ScanPlan] = field(default_factory=dict)
    narrowed: bool = False  # some table reads fewer than all its columns
    target: LoadedTable | None = None  # INSERT target

    def is_usable(self, now: float) -> bool:
        usable = all(plan.is_usable(now) for plan in self.scans.values())
        return usable and (self.target is None or self.target.is_usable(now))


class PreparedStatement:
    """A planned statement. Executing re-plans from the SQL text once any of its credentials is past usable."""

    def __init__(self, session: Session, planned: _Planned) -> None:
        self._session = session
        self._planned = planned
        self.replans = 0

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
        if not self._planned.is_usable(self._session._clock()):
            self._planned = self._session._plan(self._planned.statement)
            self.replans += 1
        return self._session._run_planned(self._planned, params)


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
    ) -> None:
        """Scans run in-process unless ``[coordinator] workers`` is set; ``distributed`` tunes worker scans."""
        self.config = config
        self._provider = provider
        self._clock = clock
        self._executor = LocalExecutor(max_files_in_flight=max_files_in_flight, max_queued_batches=max_queued_batches)
        self._task_cache = TaskCache()  # repeated queries of an unchanged table skip reading its manifests
        self._distributed: DistributedExecutor | None = None
        if config is not None and config.coordinator.workers:
            from sqe.distributed.coordinator import DistributedExecutor  # grpc only when workers are configured

            self._distributed = DistributedExecutor(config, provider, distributed)
        self._default_warehouse = provider.default_warehouse()
        self._check_catalog_name(self._default_warehouse)
        self._parser = connect_locked_down()  # parsing and constant folding only; never sees a table
        self._con = connect_locked_down(self._use_default_warehouse)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._schemas: set[tuple[str, str]] = set()
        self._views: list[str] = []
        self._registered: list[str] = []
        self._prepared: dict[str, PreparedStatement] = {}
        self._active: QueryContext | None = None
        self._generation = 0
        self._closed = False
        # the streams of the latest statement (tests, diagnostics)
        self.last_streams: list[ScanStream | DistributedScanStream] = []

    # -- public API -------------------------------------------------------------------------------------

    def sql(self, text: str, params: Params = None) -> Result:
        """Run one statement. Queries run lazily when the Result is read."""
        with self._lock:
            self._check_open()
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
                return Result(self, table=self.explain(statement.body or ""))
            return self._run_planned(self._plan(statement), params)

    def execute(self, text: str, params: Params = None) -> Result:
        """Same as ``sql`` (INSERT and CREATE TABLE AS run at once; their Result holds the row count)."""
        return self.sql(text, params)

    def prepare(self, text: str) -> PreparedStatement:
        with self._lock:
            self._check_open()
            statement = classify(self._parser, text)
            if statement.kind not in ("select", "insert"):
                raise QueryError("only queries and INSERT can be prepared")
            return PreparedStatement(self, self._plan(statement))

    def explain(self, text: str) -> pa.Table:
        """Per table: files and bytes planned, credential source and expiry, cache outcome. Never a secret."""
        with self._lock:
            statement = classify(self._parser, text)
            if statement.kind != "select":
                raise QueryError("EXPLAIN supports queries only")
            planned = self._plan(statement)
            rows = [plan.describe() for plan in planned.scans.values()]
            if not rows:
                return pa.table({"table": pa.array([], pa.string())})
            return pa.Table.from_pylist(rows)

    def interrupt(self) -> None:
        """Cancel the running query and its scans (safe to call from another thread)."""
        context = self._active
        if context is not None:
            context.cancel.set()
        if not self._closed:
            self._con.interrupt()

    @property
    def distributed_executor(self) -> DistributedExecutor | None:
        """The worker-scan executor when ``[coordinator] workers`` is set (tests, diagnostics), else None."""
        return self._distributed

    def progress(self) -> dict[str, int] | None:
        context = self._active
        return context.metrics.snapshot() if context is not None else None

    def list_tables(self, namespace: str | None = None) -> pa.Table:
        warehouse, namespaces = self._namespace_arg(namespace)
        rows: list[dict[str, str]] = []
        what = f"listing tables of {namespace or warehouse}"
        try:
            idents = self._provider.list_tables(warehouse, namespaces[0] if namespaces else None)
        except SQEError:
            raise
        except PYICEBERG_CATALOG_ERRORS as exc:
            raise translate_error(exc, what) from None
        except Exception as exc:  # a provider must raise SQEError; anything else still fails closed, typed
            raise CatalogError(f"{what} failed: {first_line(exc)}") from None
        for ident in sorted(idents, key=str):
            rows.append({"warehouse": ident.warehouse, "namespace": ".".join(ident.namespace), "table": ident.name})
        schema = pa.schema([("warehouse", pa.string()), ("namespace", pa.string()), ("table", pa.string())])
        return pa.Table.from_pylist(rows, schema=schema)

    def describe_table(self, name: str) -> pa.Table:
        ident = self.resolve_name(parse_qualified_name(name))
        loaded = self._load(ident)
        schema = loaded.table.schema()
        masks = restrictions_of(loaded).masks
        return pa.table(
            {
                "column": [f.name for f in schema.columns],
                "type": [str(f.field_type) for f in schema.columns],
                "required": [f.required for f in schema.columns],
                "masked": [masks.get(f.field_id, "") for f in schema.columns],
            }
        )

    def resolve_name(self, parts: Sequence[str]) -> TableIdent:
        if len(parts) == 2:
            return TableIdent(self._default_warehouse, (parts[0],), parts[1])
        if len(parts) == 3:
            return TableIdent(parts[0], (parts[1],), parts[2])
        raise QueryError(f"table name {'.'.join(parts)!r} must be namespace.table or warehouse.namespace.table")

    def close(self) -> None:
        if self._closed:
            return
        self.interrupt()
        self._closed = True
        self._parser.close()
        self._con.close()
        if self._distributed is not None:
            self._distributed.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- planning ---------------------------------------------------------------------------------------

    def _plan(self, statement: Statement) -> _Planned:
        if statement.kind == "select":
            scans, narrowed = self._plan_query(statement.text)
            return _Planned(statement, scans, narrowed)
        if statement.kind == "insert":
            assert statement.target is not None
            target = self._load(self.resolve_name(statement.target))
            scans, narrowed = self._plan_query(statement.body) if statement.body else ({}, False)
            return _Planned(statement, scans, narrowed, target=target)
        if statement.kind == "ctas":
            scans, narrowed = self._plan_query(statement.body or "")
            return _Planned(statement, scans, narrowed)
        raise QueryError(f"cannot plan a {statement.kind} statement")

    def _plan_query(
        self, sql: str, *, loaded: Mapping[TableIdent, LoadedTable] | None = None, all_columns: bool = False
    ) -> tuple[dict[TableIdent, ScanPlan], bool]:
        tree = parse_select(self._parser, sql)
        refs = find_table_refs(tree)
        refs_by_ident = self._group_refs(refs)
        tables = dict(loaded) if loaded is not None else {i: self._load(i) for i in refs_by_ident}
        schemas = {ident: t.table.schema() for ident, t in tables.items()}
        usage = column_usage(tree)
        pushed = pushdown_predicates(tree, self._ident_of, schemas)
        counts = Counter(self._ident_of(r) for r in refs)
        scans: dict[TableIdent, ScanPlan] = {}
        narrowed = False
        for ident, table_refs in refs_by_ident.items():
            columns = None if all_columns else columns_to_read(usage, table_refs, schemas[ident])
            narrowed = narrowed or (columns is not None and len(columns) < len(schemas[ident].columns))
            pushdown = join_conjuncts(pushed.get(ident, [])) if counts[ident] == 1 else join_conjuncts([])
            scans[ident] = plan_scan(tables[ident], columns=columns, pushdown=pushdown, cache=self._task_cache)
        return scans, narrowed

    def _group_refs(self, refs: list[TableRef]) -> dict[TableIdent, list[TableRef]]:
        grouped: dict[TableIdent, list[TableRef]] = {}
        duck_names: dict[tuple[str, str, str], TableIdent] = {}
        for ref in refs:
            if ref.time_travel:
                raise QueryError("time travel (AT ...) on Iceberg tables is not supported yet")
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
        loaded = self._provider.load_table(ident)
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
                counted = count_from_manifests(planned.statement.text, planned.scans) if params is None else None
                if counted is not None:
                    self._start()
                    return Result(self, table=counted)
                # -- end of issue 11 item 3
                relation, context = self._query(planned, planned.statement.text, params, self._start())
                return Result(self, relation=relation, context=context)
            if kind == "insert":
                return Result(self, table=self._insert(planned, params))
            if kind == "ctas":
                return Result(self, table=self._create_table_as(planned, params))
            raise QueryError(f"cannot run a {kind} statement")

    def _start(self) -> QueryContext:
        """A new statement: the previous one's views and streams go, and with them its results."""
        self._generation += 1
        for view in self._views:
            self._con.execute(f"DROP VIEW IF EXISTS {view}")
        for name in self._registered:
            self._con.unregister(name)
        self._views, self._registered, self.last_streams = [], [], []
        context = QueryContext()
        self._active = context
        return context

    def _bind(self, scans: Mapping[TableIdent, ScanPlan], context: QueryContext) -> None:
        for ident, plan in scans.items():
            name = f"__sqe_scan_{next(self._ids)}"
            stream = self._stream(plan, context)
            self._con.register(name, stream)
            self._registered.append(name)
            self.last_streams.append(stream)
            view = self._ensure_schema(ident) + "." + quote_ident(ident.name)
            self._con.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM temp.main.{quote_ident(name)}")
            self._views.append(view)

    def _stream(self, plan: ScanPlan, context: QueryContext) -> ScanStream | DistributedScanStream:
        if self._distributed is None:
            return ScanStream(plan, self._executor, context)
        from sqe.distributed.coordinator import DistributedScanStream

        return DistributedScanStream(plan, self._distributed, context)

    def _query(
        self, planned: _Planned, sql: str, params: Params, context: QueryContext
    ) -> tuple[duckdb.DuckDBPyRelation, QueryContext]:
        self._bind(planned.scans, context)
        try:
            return self._relation(sql, params), context
        except duckdb.BinderException as exc:
            if not planned.narrowed:
                raise self._translate(exc, context) from None
            log.debug("re-planning with every column after a binder error: %s", exc)
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None
        # A narrowed projection missed something DuckDB needs: read every column instead (correctness first).
        loaded = {ident: plan.loaded for ident, plan in planned.scans.items()}
        scans, _ = self._plan_query(sql, loaded=loaded, all_columns=True)
        context = self._start()
        self._bind(scans, context)
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
        try:
            return relation.to_arrow_table()
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None

    def _insert(self, planned: _Planned, params: Params) -> pa.Table:
        statement, target = planned.statement, planned.target
        assert target is not None and statement.target_span is not None
        context = self._start()
        self._bind(planned.scans, context)
        arrow_schema = schema_to_pyarrow(target.table.schema(), include_field_ids=False)
        staging = f"__sqe_insert_{next(self._ids)}"
        shape = f"{staging}_shape"
        start, end = statement.target_span
        rewritten = statement.text[:start] + f"temp.main.{quote_ident(staging)}" + statement.text[end:]
        try:
            self._con.register(shape, arrow_schema.empty_table())
            self._con.execute(f"CREATE TEMP TABLE {quote_ident(staging)} AS SELECT * FROM {quote_ident(shape)}")
            self._con.unregister(shape)
            self._con.execute(rewritten, params) if params is not None else self._con.execute(rewritten)
            rows = self._con.sql(f"SELECT * FROM temp.main.{quote_ident(staging)}").to_arrow_table()
        except duckdb.Error as exc:
            raise self._translate(exc, context) from None
        finally:
            self._con.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(staging)}")
        self._append(target, rows)
        return pa.table({"count": pa.array([rows.num_rows], pa.int64())})

    def _create_table_as(self, planned: _Planned, params: Params) -> pa.Table:
        statement = planned.statement
        assert statement.target is not None and statement.body is not None
        ident = self.resolve_name(statement.target)
        if statement.if_not_exists and self._exists(ident):
            return pa.table({"count": pa.array([0], pa.int64())})
        rows = self._materialise(planned, statement.body, params)
        loaded = self._provider.create_table(ident, _writable_schema(rows.schema))
        self._append(loaded, rows)
        return pa.table({"count": pa.array([rows.num_rows], pa.int64())})

    def _append(self, loaded: LoadedTable, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        data = _conform_for_write(rows, loaded.table.schema(), loaded.ident)
        try:
            loaded.table.append(data)  # written through SQE's scoped FileIO; committed via the table's catalog
        except SQEError:
            raise
        except PYICEBERG_CATALOG_ERRORS as exc:  # the catalog's answer to the commit (409, 422, 5xx, 401/403)
            raise translate_error(exc, f"commit to {loaded.ident}") from None
        except Exception as exc:
            raise QueryError(f"writing to {loaded.ident} failed: {first_line(exc)}") from None
        self._provider.invalidate(loaded.ident)  # the cached entry describes the table before this commit

    def _exists(self, ident: TableIdent) -> bool:
        try:
            self._provider.load_table(ident)
        except NoSuchTableError:
            return False
        return True

    # -- PREPARE / EXECUTE in SQL -----------------------------------------------------------------------

    def _sql_prepare(self, statement: Statement) -> Result:
        assert statement.name is not None and statement.body is not None
        self._prepared[statement.name] = self.prepare(statement.body)
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
            row = self._parser.execute(f"SELECT {args}").fetchone()
        except duckdb.Error as exc:
            raise QueryError(f"bad EXECUTE arguments: {_duck_message(exc)}") from None
        return list(row) if row is not None else []

    # -- helpers ----------------------------------------------------------------------------------------

    def _translate(self, exc: BaseException, context: QueryContext | None) -> SQEError:
        if context is not None and context.error is not None:
            return context.error
        if isinstance(exc, duckdb.InterruptException) or (context is not None and context.cancel.is_set()):
            return QueryCancelledError()
        return QueryError(_duck_message(exc))

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


def _conform_for_write(rows: pa.Table, schema: Schema, ident: TableIdent) -> pa.Table:
    """DuckDB's rows in the Iceberg table's Arrow shape; NULL in a required column is refused."""
    target = schema_to_pyarrow(schema, include_field_ids=False)
    if rows.num_columns != len(target):
        raise QueryError(f"{ident} has {len(target)} columns, the statement produced {rows.num_columns}")
    columns = []
    for column, f in zip(rows.columns, target, strict=True):
        if not f.nullable and column.null_count:
            raise QueryError(f"NULL value in required column {f.name!r} of {ident}")
        try:
            columns.append(column if column.type == f.type else column.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise QueryError(f"cannot write column {f.name!r} of {ident}: {first_line(exc)}") from None
    return pa.Table.from_arrays(columns, schema=target)


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
