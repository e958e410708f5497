"""The session's reads outside the Iceberg catalog, in one place: file table functions and external tables.

``ExternalSources.rewrite`` replaces every ``read_parquet(...)``-style call and every external table's name in
a statement with a single-part name of an Arrow stream SQE registered on the session's DuckDB connection (the
same mechanism as Iceberg scans; DuckDB's own file access stays off). ``run_statement`` runs SQE's own
statements: ``CREATE/DROP EXTERNAL TABLE``, ``SHOW EXTERNAL TABLES`` and ``OPTIMIZE`` (see
``sqe.execution.compaction``). Registered streams are kept for the latest ``_KEEP`` rewritten sources, so a
prepared statement keeps working; older ones are unregistered.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from sqe.catalog.external import ExternalTable, ExternalTableStore, KeySource, MountKeys
from sqe.credentials import StoragePolicy
from sqe.duckdb_connection import quote_ident
from sqe.errors import ExternalAccessError, NoSuchTableError, QueryError
from sqe.execution.object_store import keyed_set, static_set
from sqe.execution.tvf import FileStream, GovernedLocations, TvfPolicy, resolve_call, source_for_mount
from sqe.locations import is_object_store
from sqe.planning.external_sql import (
    FILE_FUNCTIONS,
    REWRITTEN_PREFIX,
    CreateExternal,
    DropExternal,
    ExternalStatement,
    NamedRef,
    Optimize,
    ShowExternal,
    arrow_type,
    find_file_calls,
    find_named_refs,
    parse_external_statement,
    splice,
)
from sqe.planning.sql_analysis import TableRef, parse_select, pushdown_predicates

# pyiceberg (schemas and predicates for partition pruning) only when an external table is queried: a session
# builds ExternalSources at start-up, and a statement without Iceberg or external tables never imports pyiceberg.
if TYPE_CHECKING:
    import duckdb
    import pyarrow.dataset as ds
    from pyiceberg import expressions as ice
    from pyiceberg.schema import Schema

    from sqe.catalog.base import TableIdent, TableProvider
    from sqe.config import SQEConfig
    from sqe.credentials import CredentialSet
    from sqe.execution.compaction import RemoteRewriter
    from sqe.planning.statements import Statement

log = logging.getLogger(__name__)


class ArrowSource(Protocol):
    """What a rewritten source registers on DuckDB: a local ``FileStream`` or a stream read on workers."""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...

    def describe(self) -> dict[str, Any]: ...


# (ident, location, the local stream, the mount's credential set) -> a stream read on workers, or None (locally)
RemoteScanner = Callable[["TableIdent", str, FileStream, "CredentialSet"], "ArrowSource | None"]

_KEEP = 64
_REWRITABLE = ("select", "insert", "ctas")
_WRITES = ("insert", "delete", "update", "merge")
_OWN_KEY_OPTIONS = ("access_key_id", "secret_access_key", "session_token")
_ENV_KEY_OPTIONS = ("access_key_id_env", "secret_access_key_env")
# Key sources the engine holds rather than the user: the [storage] pair and the process's environment.
_ENGINE_KEYS = frozenset({"static", "env"})
_FORMAT_OPTIONS = ("delim", "header", "quote", "escape", "nullstr")


class ExternalSources:
    def __init__(
        self,
        config: SQEConfig | None,
        provider: TableProvider,
        parser: duckdb.DuckDBPyConnection,
        con: duckdb.DuckDBPyConnection,
        resolve_name: Callable[[Sequence[str]], TableIdent],
        remote_rewriter: RemoteRewriter | None = None,
        remote_scanner: RemoteScanner | None = None,
        cancel_check: Callable[[], None] | None = None,
    ) -> None:
        """Checks the file table function prefixes against every governed table location now (start-up).
        ``remote_rewriter``: OPTIMIZE rewrites on the session's workers (None: locally); ``remote_scanner``:
        external Parquet tables are read on the session's workers (None, or None returned: locally);
        ``cancel_check`` raises once the running statement is cancelled (checked between listed files)."""
        self._config = config
        self._cancel_check: Callable[[], None] = cancel_check or (lambda: None)
        self._remote_scanner = remote_scanner
        self._remote_rewriter = remote_rewriter
        self._provider = provider
        warehouses = config.catalog.warehouse_names if config is not None else (provider.default_warehouse(),)
        self.governed = GovernedLocations(provider, tuple(warehouses))
        self._parser = parser
        self._con = con
        self._resolve_name = resolve_name
        self.policy = TvfPolicy.from_config(config)
        self.store = (
            ExternalTableStore(config.external_tables.path or "", config.external_tables.key_env)
            if config is not None and config.external_tables.path
            else None
        )
        self._ids = itertools.count(1)
        self._registered: OrderedDict[str, ArrowSource] = OrderedDict()
        self.last_streams: list[ArrowSource] = []
        self._check_policy_prefixes()

    def _check_policy_prefixes(self) -> None:
        """Every configured TVF prefix, object-store or local, against the governed locations (re-listed now);
        nothing to list when no prefix is configured (file table functions read nowhere then)."""
        if not self.policy.object_store and not self.policy.local:
            return
        self.governed.refresh()
        self.governed.check_prefixes(self.policy.object_store)
        self.governed.check_local_prefixes(self.policy.local)

    # -- statements SQE runs itself ----------------------------------------------------------------------

    def parse(self, text: str) -> ExternalStatement | None:
        return parse_external_statement(self._parser, text)

    def run_statement(self, statement: ExternalStatement) -> pa.Table:
        if isinstance(statement, CreateExternal):
            return self._create(statement)
        if isinstance(statement, DropExternal):
            return self._drop(statement)
        if isinstance(statement, ShowExternal):
            return self._show()
        if isinstance(statement, Optimize):
            from sqe.execution.compaction import optimize  # pyiceberg write paths only when asked for

            return optimize(
                statement, self._config, self._provider, self._resolve_name, self._parser, self._remote_rewriter
            )
        raise QueryError("unsupported statement")

    def _store(self) -> ExternalTableStore:
        if self.store is None:
            raise QueryError("external tables need an SQE config ([external_tables] path)")
        return self.store

    def _create(self, statement: CreateExternal) -> pa.Table:
        ident = self._resolve_name(statement.parts)
        name = str(ident)
        if not is_object_store(statement.location):
            raise QueryError("an external table's LOCATION must be an s3:// prefix")
        if self._is_iceberg_table(ident):
            raise QueryError(f"{name} is an Iceberg table; an external table cannot take its name")
        options = dict(statement.options)
        keys, key_env = self._mount_keys(options)
        unknown = set(options) - set(_FORMAT_OPTIONS)
        if unknown:
            raise QueryError(f"unknown external table option {sorted(unknown)[0]!r}")
        for _, type_text in ((c.name, c.type_text) for c in (*statement.columns, *statement.partitions)):
            arrow_type(type_text)
        source: KeySource = "sealed" if keys is not None else "env" if key_env is not None else "static"
        table = ExternalTable(
            name=name,
            file_format=statement.file_format,
            location=statement.location,
            columns=tuple((c.name, c.type_text) for c in statement.columns),
            partitions=tuple((c.name, c.type_text) for c in statement.partitions),
            key_source=source,
            key_env=key_env,
            options=options,
        )
        self._check_engine_mount(source, statement.location)
        created = self._store().create(table, keys, if_not_exists=statement.if_not_exists)
        log.info("external table %s %s (keys: %s)", name, "created" if created else "exists", source)
        return pa.table({"created": pa.array([created])})

    def _check_engine_mount(self, source: KeySource, location: str) -> None:
        """A mount reading with keys the engine holds (the [storage] pair, its environment) rather than the user's
        own: only where the config allows it (``sqe serve`` does not for its users), and never over a governed
        table's files. At creation and before every read, ahead of any key lookup (whether a variable is set is
        not this user's to learn)."""
        if source not in _ENGINE_KEYS:
            return
        section = self._config.external_tables if self._config is not None else None
        if section is not None and source == "env" and not section.environment_keys:
            raise ExternalAccessError(
                "this SQE does not let external tables read keys from its environment ([external_tables] "
                "environment_keys = false; sqe serve: the server's environment is not its users'); give the "
                "mount's own keys"
            )
        if section is not None and source == "static" and not section.storage_keys:
            raise ExternalAccessError(
                "this SQE does not let external tables read with its [storage] key ([external_tables] "
                "storage_keys = false; sqe serve: the server's key is not its users'); give the mount's own keys"
            )
        self.governed.refresh()
        self.governed.check_prefixes([location])

    @staticmethod
    def _mount_keys(options: dict[str, str]) -> tuple[MountKeys | None, tuple[str, str] | None]:
        own = {k: options.pop(k) for k in _OWN_KEY_OPTIONS if k in options}
        env = {k: options.pop(k) for k in _ENV_KEY_OPTIONS if k in options}
        if own and env:
            raise QueryError("give a mount's keys either directly or as environment variable names, not both")
        if own:
            if not own.get("access_key_id") or not own.get("secret_access_key"):
                raise QueryError("an external table's own keys need both access_key_id and secret_access_key")
            return MountKeys(own["access_key_id"], own["secret_access_key"], own.get("session_token")), None
        if env:
            if len(env) != 2:
                raise QueryError("give both access_key_id_env and secret_access_key_env")
            return None, (env["access_key_id_env"], env["secret_access_key_env"])
        return None, None

    def _drop(self, statement: DropExternal) -> pa.Table:
        name = str(self._resolve_name(statement.parts))
        dropped = self._store().drop(name)
        if not dropped and not statement.if_exists:
            raise NoSuchTableError(f"no external table {name}")
        return pa.table({"dropped": pa.array([dropped])})

    def _show(self) -> pa.Table:
        tables = self.store.all() if self.store is not None else []
        rows = [
            {
                "table": t.name,
                "format": t.file_format,
                "location": t.location,
                "columns": ", ".join(f"{n} {ty}" for n, ty in t.columns),
                "partitioned_by": ", ".join(f"{n} {ty}" for n, ty in t.partitions),
                "credentials": {"static": "[storage] pair", "env": "environment", "sealed": "own (encrypted)"}[
                    t.key_source
                ],
            }
            for t in tables
        ]
        names = ("table", "format", "location", "columns", "partitioned_by", "credentials")
        return pa.Table.from_pylist(rows, schema=pa.schema([(n, pa.string()) for n in names]))

    def _is_iceberg_table(self, ident: TableIdent) -> bool:
        try:
            self._provider.load_table(ident)
        except NoSuchTableError:
            return False
        except QueryError:
            return False
        except Exception:  # the catalog refused (403, ...): do not shadow a table we cannot see
            return True
        return True

    # -- rewriting queries -------------------------------------------------------------------------------

    def rewrite(self, statement: Statement) -> Statement:
        """The statement with file calls and external tables replaced by registered streams."""
        self.last_streams = []
        self.refuse_write(statement)
        if statement.kind not in _REWRITABLE:
            return statement
        body = statement.text if statement.kind == "select" else statement.body
        if not body or not self._may_need(body):
            return statement
        new_body = self._rewrite_query(body)
        if new_body == body:
            return statement
        if statement.kind == "select":
            return dataclasses.replace(statement, text=new_body)
        head = statement.text[: len(statement.text) - len(body)]
        return dataclasses.replace(statement, text=head + new_body, body=new_body)

    def refuse_write(self, statement: Statement) -> None:
        """INSERT, DELETE, UPDATE and MERGE into an external table: refused (SQE has no write path through a
        mount, whatever rights its keys have)."""
        if statement.kind not in _WRITES or not statement.target or not self._has_external_tables():
            return
        name = str(self._resolve_name(statement.target))
        if self._store().get(name) is not None:
            raise ExternalAccessError(f"{name} is an external table: SQE reads mounts only and never writes to them")

    def explain_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """EXPLAIN's Iceberg rows plus one per file source of the latest rewrite, every row with every key."""
        combined = [*rows, *(stream.describe() for stream in self.last_streams)]
        keys = list(dict.fromkeys(k for row in combined for k in row))
        return [{k: row.get(k) for k in keys} for row in combined]

    def _may_need(self, sql: str) -> bool:
        lowered = sql.lower()
        return any(f in lowered for f in FILE_FUNCTIONS) or self._has_external_tables()

    def _has_external_tables(self) -> bool:
        return self.store is not None and self.store.path.exists() and bool(self.store.all())

    def _rewrite_query(self, sql: str) -> str:
        tree = parse_select(self._parser, sql)
        replacements: list[tuple[int, int, str]] = []
        calls = find_file_calls(self._parser, tree, sql)
        if calls:
            self._check_policy_prefixes()  # per query: a table created since start-up is protected too
        for call in calls:
            source = resolve_call(
                call.function,
                FILE_FUNCTIONS[call.function],
                call.paths,
                call.options,
                self.policy,
                self.governed,
                self._config,
                self._cancel_check,
            )
            name = self._register(FileStream(source))
            replacements.append((call.start, call.end, name if call.has_alias else f"{name} AS {call.function}"))
        replacements.extend(self._external_refs(tree, sql))
        return splice(sql, replacements)

    def _external_refs(self, tree: dict[str, Any], sql: str) -> Iterator[tuple[int, int, str]]:
        if not self._has_external_tables():
            return
        store = self._store()
        refs = [r for r in find_named_refs(tree, sql) if store.get(str(self._resolve_name(r.parts))) is not None]
        if not refs:
            return
        tables = {str(self._resolve_name(r.parts)): store.get(str(self._resolve_name(r.parts))) for r in refs}
        filters = self._partition_filters(tree, refs, {k: v for k, v in tables.items() if v is not None})
        counts = Counter(str(self._resolve_name(r.parts)) for r in refs)
        for ref in refs:
            key = str(self._resolve_name(ref.parts))
            table = tables[key]
            assert table is not None
            filter_ = filters.get(key) if counts[key] == 1 else None
            name = self._register(self._mount_stream(self._resolve_name(ref.parts), table, filter_))
            yield ref.start, ref.end, f"{name} AS {quote_ident(ref.alias or ref.parts[-1])}" if not ref.alias else name

    def _mount_stream(self, ident: TableIdent, table: ExternalTable, filter_: ds.Expression | None) -> ArrowSource:
        """The local stream over the mount's pruned files, or its worker twin when workers are configured."""
        self._check_engine_mount(table.key_source, table.location)
        credentials = self._credentials_for(table, self._store().keys_of(table))
        local = FileStream(self._mount_source(table, filter_, credentials))
        if self._remote_scanner is None:
            return local
        remote = self._remote_scanner(ident, table.location, local, credentials)
        return local if remote is None else remote

    def _mount_source(self, table: ExternalTable, filter_: ds.Expression | None, credentials: CredentialSet) -> Any:
        data = pa.schema([(n, arrow_type(t)) for n, t in table.columns])
        partitions = pa.schema([(n, arrow_type(t)) for n, t in table.partitions]) if table.partitions else None
        options: dict[str, Any] = {}
        if table.file_format == "csv":
            options = {"header": str(table.options.get("header", "true")).lower() != "false"}
            options.update({k: table.options[k] for k in ("delim", "quote", "escape", "nullstr") if k in table.options})
            options["columns"] = {n: t for n, t in table.columns}
        return source_for_mount(
            table.name, table.file_format, table.location, credentials, data, partitions, filter_, options
        )

    def _credentials_for(self, table: ExternalTable, keys: MountKeys | None) -> CredentialSet:
        if self._config is None:
            raise ExternalAccessError("external tables need an SQE config")
        if keys is None:
            return static_set(self._config, "external tables without their own keys")
        policy = StoragePolicy.from_config(self._config)
        return keyed_set(policy, keys.access_key_id, keys.secret_access_key, keys.session_token)

    def _partition_filters(
        self, tree: dict[str, Any], refs: list[NamedRef], tables: Mapping[str, ExternalTable]
    ) -> dict[str, ds.Expression]:
        """WHERE conjuncts on partition columns (the planner's safe pushdown rules) as pyarrow filters."""
        schemas = _SchemaLookup({k: _partition_schema(t) for k, t in tables.items()})

        def resolve(ref: TableRef) -> str:
            return str(self._resolve_name(ref.parts))

        found = pushdown_predicates(tree, resolve, schemas)
        filters: dict[str, ds.Expression] = {}
        for key, predicates in found.items():
            if key not in tables:
                continue
            exprs = [e for e in (_to_arrow(p, tables[key]) for p in predicates) if e is not None]
            if exprs:
                combined = exprs[0]
                for e in exprs[1:]:
                    combined = combined & e
                filters[key] = combined
        return filters

    def _register(self, stream: ArrowSource) -> str:
        name = f"{REWRITTEN_PREFIX}{next(self._ids)}"
        self._con.register(name, stream)
        self._registered[name] = stream
        self.last_streams.append(stream)
        while len(self._registered) > _KEEP:
            old, _ = self._registered.popitem(last=False)
            self._con.unregister(old)
        return quote_ident(name)


class _SchemaLookup(Mapping[str, "Schema"]):
    """Schemas of external tables; any other table (Iceberg) has no columns here, so nothing is pushed to it."""

    def __init__(self, schemas: dict[str, Schema]) -> None:
        self._schemas = schemas

    def __getitem__(self, key: str) -> Schema:
        from pyiceberg.schema import Schema

        return self._schemas.get(key, Schema())

    def __iter__(self) -> Iterator[str]:
        return iter(self._schemas)

    def __len__(self) -> int:
        return len(self._schemas)


# partition column type (DDL text) -> pyiceberg type class name in pyiceberg.types
_ICEBERG_TYPES = {"INTEGER": "IntegerType", "INT": "IntegerType", "BIGINT": "LongType", "VARCHAR": "StringType"}
_ICEBERG_TYPES.update({"STRING": "StringType", "TEXT": "StringType", "BOOLEAN": "BooleanType", "DATE": "DateType"})


def _partition_schema(table: ExternalTable) -> Schema:
    from pyiceberg import types
    from pyiceberg.schema import Schema

    fields = [
        types.NestedField(i + 1, name, getattr(types, _ICEBERG_TYPES[type_text.upper()])(), required=False)
        for i, (name, type_text) in enumerate(table.partitions)
        if type_text.upper() in _ICEBERG_TYPES
    ]
    return Schema(*fields)


def _to_arrow(predicate: ice.BooleanExpression, table: ExternalTable) -> ds.Expression | None:
    import pyarrow.dataset as ds
    from pyiceberg import expressions as ice

    types = {n.lower(): arrow_type(t) for n, t in table.partitions}
    term = getattr(predicate, "term", None)
    name = getattr(term, "name", None)
    if not isinstance(name, str) or name.lower() not in types:
        return None
    column_name = next(n for n, _ in table.partitions if n.lower() == name.lower())
    column = ds.field(column_name)
    arrow = types[name.lower()]
    if isinstance(predicate, ice.IsNull):
        return column.is_null()
    if isinstance(predicate, ice.NotNull):
        return column.is_valid()
    if isinstance(predicate, ice.In):
        values = [_value(v, arrow) for v in predicate.literals]
        return column.isin(pa.array(values, arrow))
    value = _value(getattr(predicate, "literal", None), arrow)
    operators: dict[type[ice.BooleanExpression], Callable[[Any, Any], ds.Expression]] = {
        ice.EqualTo: lambda a, b: a == b,
        ice.NotEqualTo: lambda a, b: a != b,
        ice.LessThan: lambda a, b: a < b,
        ice.LessThanOrEqual: lambda a, b: a <= b,
        ice.GreaterThan: lambda a, b: a > b,
        ice.GreaterThanOrEqual: lambda a, b: a >= b,
    }
    op = operators.get(type(predicate))
    return op(column, pa.scalar(value, arrow)) if op is not None else None


def _value(literal: Any, arrow: pa.DataType) -> Any:
    raw = getattr(literal, "value", literal)
    if pa.types.is_date32(arrow) and isinstance(raw, int):
        import datetime

        return datetime.date(1970, 1, 1) + datetime.timedelta(days=raw)
    return raw
