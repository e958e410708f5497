"""The Arrow Flight SQL service of ``sqe serve`` (pyarrow.flight).

Every call passes :class:`AuthMiddlewareFactory` first: a catalog bearer token, or HTTP Basic with the user's
catalog client id/secret (exchanged at the catalog; the token goes back in the ``authorization`` response header,
as Flight's Basic-auth handshake expects; the secret is never stored). Calls without valid credentials end with
UNAUTHENTICATED before any handler runs. The client session is the ``sqe_session`` cookie (issued on every call
that lacks one) or, for clients without cookies, the connection (peer address).

Surface: ``CommandStatementQuery`` and ``CommandPreparedStatementQuery`` by GetFlightInfo + DoGet (the result
streams batch by batch; gRPC flow control blocks the producer, so memory stays bounded whatever the result size),
``CommandStatementUpdate`` / ``CommandPreparedStatementUpdate`` by DoPut (a prepared update's parameter rows in
its own stream, all of them one commit), parameter binding by DoPut of ``CommandPreparedStatementQuery``, the
``CreatePreparedStatement`` / ``ClosePreparedStatement`` / ``CancelFlightInfo`` / ``CancelQuery`` actions, and
the metadata commands (catalogs = warehouses, DB schemas = namespaces, tables with schemas, table types, SQL
info). A DoGet stream the client drops cancels its query.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import duckdb
import pyarrow as pa
import pyarrow.flight as flight
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from sqe._text import counted
from sqe.config import SQEConfig
from sqe.duckdb_connection import statement_type
from sqe.errors import AuthenticationError, QueryError, SQEError, StatementNotPreparableError
from sqe.server import metadata
from sqe.server._proto import flight_cancel_pb2 as cancel_pb
from sqe.server._proto import flight_sql_pb2 as sql_pb
from sqe.server.config import ServerConfig, check_serving_config
from sqe.server.errors import to_flight
from sqe.server.identity import IdentityBroker, User
from sqe.server.parameter_sizes import batch_bytes
from sqe.server.sessions import (
    ClientSession,
    Engine,
    Limits,
    OpenQuery,
    ParameterBudget,
    Prepared,
    QueryTimeoutError,
    SessionRegistry,
    UnknownHandleError,
    Watchdog,
    engine_limits,
    served_warehouses,
)
from sqe.session import Params, PreparedStatement, Result

log = logging.getLogger(__name__)

SESSION_COOKIE = "sqe_session"
SESSION_HEADER = "x-sqe-session"
_SQL_PACKAGE = "arrow.flight.protocol.sql."  # a Flight SQL Any names this package after its last "/"
_T = TypeVar("_T")


# ------------------------------------------------------------------------------------------ middleware


class AuthMiddleware(flight.ServerMiddleware):  # type: ignore[misc]
    """The authenticated user of one call, its client session id and what to send back."""

    def __init__(self, user: User, session_id: str | None) -> None:
        self.user = user
        self.session_id = session_id
        self.new_cookie = None if session_id is not None else secrets.token_urlsafe(24)
        self.entered: tuple[SessionRegistry, ClientSession] | None = None  # the session this call holds

    def call_completed(self, exception: BaseException | None) -> None:
        if self.entered is not None:
            registry, session = self.entered
            self.entered = None
            registry.leave(session)

    def sending_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.user.issued_token:
            headers["authorization"] = f"Bearer {self.user.token}"
        if self.new_cookie is not None:
            headers["set-cookie"] = f"{SESSION_COOKIE}={self.new_cookie}; Path=/; HttpOnly"
        return headers


class AuthMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, broker: IdentityBroker) -> None:
        self._broker = broker

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> AuthMiddleware:
        try:
            user = self._authenticate(headers)
        except SQEError as exc:
            log.info("refused %s: %s", _method(info), type(exc).__name__)
            raise to_flight(exc) from None
        return AuthMiddleware(user, _session_id(headers))

    def _authenticate(self, headers: dict[str, list[str]]) -> User:
        values = _header(headers, "authorization")
        if not values:
            raise AuthenticationError(
                "no credentials in the call: send a catalog bearer token or Basic client_id:client_secret"
            )
        scheme, _, credential = values[0].partition(" ")
        if scheme.lower() == "bearer":
            return self._broker.authenticate_bearer(credential.strip())
        if scheme.lower() == "basic":
            client_id, secret = _basic(credential.strip())
            return self._broker.authenticate_basic(client_id, secret)
        raise AuthenticationError(f"unsupported authorization scheme {scheme[:20]!r}; use Bearer or Basic")


def _method(info: Any) -> str:
    return str(getattr(info, "method", "call"))


def _header(headers: dict[str, list[str]], name: str) -> list[str]:
    for key, values in headers.items():
        if key.lower() == name:
            return [v.decode() if isinstance(v, bytes) else str(v) for v in values]
    return []


def _basic(credential: str) -> tuple[str, str]:
    try:
        decoded = base64.b64decode(credential, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationError("malformed Basic credentials") from None
    client_id, sep, secret = decoded.partition(":")
    if not sep or not client_id:
        raise AuthenticationError("Basic credentials must be client_id:client_secret")
    return client_id, secret


def _session_id(headers: dict[str, list[str]]) -> str | None:
    explicit = _header(headers, SESSION_HEADER)
    if explicit and explicit[0]:
        return explicit[0][:128]
    for cookie_line in _header(headers, "cookie"):
        for part in cookie_line.split(";"):
            name, _, value = part.strip().partition("=")
            if name == SESSION_COOKIE and value:
                return value[:128]
    return None


# ---------------------------------------------------------------------------------------------- helpers


def _pack(message: Message) -> bytes:
    wrapper = any_pb2.Any()
    wrapper.Pack(message)
    return bytes(wrapper.SerializeToString())


def _unpack_any(data: bytes) -> any_pb2.Any:
    try:
        return any_pb2.Any.FromString(data)
    except DecodeError:
        raise QueryError("the request is not a Flight SQL command") from None


def _message(wrapper: any_pb2.Any, cls: type[_T]) -> _T:
    message = cls()
    try:
        unpacked = wrapper.Unpack(message)  # type: ignore[arg-type]
    except DecodeError:  # the right type URL around a truncated or corrupt payload
        raise QueryError(f"the {cls.__name__} in the request is malformed") from None
    if not unpacked:
        raise QueryError(f"expected {cls.__name__}")
    return message


def _command_name(wrapper: any_pb2.Any) -> str:
    """The Flight SQL message named by the type URL ("" for any other type; the host part is free, as in Any)."""
    full_name = str(wrapper.type_url).rpartition("/")[2]
    return full_name.removeprefix(_SQL_PACKAGE) if full_name.startswith(_SQL_PACKAGE) else ""


def _parameter_rows(table: pa.Table | None) -> list[list[Any]]:
    """The parameter rows of ``table``, each its values in column order. Column by column, not through
    ``Table.to_pylist``: its rows are dicts by column name, so columns sharing a name would bind one value."""
    if table is None or table.num_columns == 0:
        return [[]]
    columns = [_parameter_values(field, table.column(i)) for i, field in enumerate(table.schema)]
    return [list(row) for row in zip(*columns, strict=True)]


def _parameter_values(field: pa.Field, column: pa.ChunkedArray) -> list[Any]:
    """The column's values as the Python objects DuckDB binds. Arrow holds values Python's types cannot (a time
    or timestamp with nanoseconds, a date past year 9999, a time zone the server does not know): the client sent
    them, so the call fails as a bad request naming the column, not as an internal error."""
    try:
        return list(column.to_pylist())
    except (ValueError, OverflowError, pa.ArrowException):
        raise QueryError(
            f"parameter column {field.name[:60]!r} of type {str(field.type)[:80]} holds a value that cannot be bound "
            "(nanoseconds, a date outside years 1-9999, or an unknown time zone)"
        ) from None


def _parameter_sets(sql: str, table: pa.Table | None) -> list[Params]:
    """The parameter sets ``table`` binds to ``sql``: value lists for ``?`` / ``$n`` numbered 1..n; else (``$name``
    parameters, or numbers with a gap: DuckDB binds either only by name) dicts, by the column names when they are
    the parameters' names, else in the order ``parameter_schema`` describes them (how a client binding
    positionally sends them)."""
    rows = _parameter_rows(table)
    names = _parameter_names(sql) or []
    if _binds_as_list(names):
        return list(rows)
    columns = table.column_names if table is not None else []
    keys = columns if sorted(columns, key=_binding_order) == names else names
    if rows and len(rows[0]) != len(names):
        expected = ", ".join(f"${name}" for name in names)
        takes, bound = counted(len(names), "parameter"), counted(len(rows[0]), "value")
        raise QueryError(f"the statement takes {takes} ({expected}), {bound} bound")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _parameter_names(sql: str) -> list[str] | None:
    """The parameters ``sql`` takes, in binding order (``?`` and ``$n`` by number, then ``$name`` by name), or
    None when it does not parse as one statement (DuckDB's parser)."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error:
        return None
    if len(statements) != 1:
        return None
    return sorted(statements[0].named_parameters, key=_binding_order)


def _binding_order(name: str) -> tuple[int, int, str]:
    """Numbered parameters by number, then named ones by name. ASCII digits only: DuckDB names ``$²`` or ``$٣``
    as it names ``$x``, and int() refuses some of what str.isdigit accepts."""
    numbered = name.isascii() and name.isdigit()
    return (0, int(name), "") if numbered else (1, 0, name)


def _binds_as_list(names: list[str]) -> bool:
    """Whether ``names`` are ``?`` / ``$n`` parameters numbered 1..n, bound as a list. DuckDB binds a list's k-th
    value to ``$k`` and refuses a value for a number the statement does not use, so a statement with a gap
    (``SELECT $2``: one value, for ``$2``) binds by number, as ``$name`` ones bind by name."""
    return names == [str(number) for number in range(1, len(names) + 1)]


def _parameter_schema(sql: str) -> pa.Schema | None:
    """A prepared statement's ``parameter_schema``: a nullable field per parameter, null-typed (unknown). DuckDB's
    public Python API exposes no parameter types (``duckdb_prepared_statements()`` lists them as UNKNOWN), and
    DuckDB's own ADBC driver reports them null too."""
    names = _parameter_names(sql)
    return None if names is None else pa.schema([pa.field(name, pa.null()) for name in names])


def _result_schema(engine: Engine, sql: str) -> pa.Schema | None:
    """The schema ``sql`` answers with, planned but not scanned (``LIMIT 0``); None for non-queries.

    Parameters are bound as NULL: the schema of a parameterised query is known before its values are.
    """
    names = _parameter_names(sql)
    if names is None or statement_type(duckdb.extract_statements(sql)[0]) != duckdb.StatementType.SELECT:
        return None
    wrapped = f"SELECT * FROM ({sql.strip().rstrip(';')}) AS __sqe_schema LIMIT 0"
    nulls: Params = [None] * len(names) if _binds_as_list(names) else dict.fromkeys(names)
    try:
        return engine.session.sql(wrapped, nulls or None).arrow().schema
    except QueryError:
        return None  # e.g. a statement the wrapper cannot hold; the client learns the schema at GetFlightInfo


def _cancel_query_request(body: bytes) -> sql_pb.ActionCancelQueryRequest:
    request = sql_pb.ActionCancelQueryRequest()
    if not any_pb2.Any.FromString(body).Unpack(request):
        raise DecodeError("not an ActionCancelQueryRequest")
    return request


def _cancelled_handle(action: str, info_of: Callable[[], bytes]) -> bytes:
    """The statement handle in the FlightInfo a cancel action names (``info_of`` reads it from the request)."""
    try:
        info = flight.FlightInfo.deserialize(info_of())
        ticket = info.endpoints[0].ticket.ticket
        return bytes(_message(_unpack_any(ticket), sql_pb.TicketStatementQuery).statement_handle)
    except (DecodeError, IndexError, pa.ArrowException, QueryError):
        raise QueryError(f"{action} needs the FlightInfo of a query of this server") from None


def _count_of(result: Result) -> int:
    table = result.arrow()
    if "count" in table.column_names and table.num_rows:
        return int(table.column("count")[0].as_py())
    return -1


def _handler(method: Callable[..., _T]) -> Callable[..., _T]:
    """Every handler error leaves as a typed Flight error (never a traceback, never a secret)."""

    @functools.wraps(method)
    def wrapper(self: SQEFlightServer, context: Any, *args: Any) -> _T:
        try:
            return method(self, context, *args)
        except Exception as exc:
            raise to_flight(exc, self.secrets_of(context)) from None

    return wrapper


@dataclass(eq=False)  # a stream is one call's body: identity, not value, equality
class _ResultStream:
    """The body of one DoGet: its query's batches, then the query finished however the call ends.

    pyarrow drops this iterator when the call ends. When the client left before the first batch was asked for
    (e.g. before the schema message was written), no batch is ever asked for: dropping it still cancels and
    finishes the query, so its engine and slot come back. While a batch is being produced the call is alive, so
    only then may the watchdog ask the call whether its client cancelled.
    """

    session: ClientSession
    query: OpenQuery
    context: Any
    secrets: list[str] = field(repr=False)
    timeout_error: Callable[[], QueryTimeoutError]
    # True until __post_init__ ran: __del__ of a half-built stream has nothing to finish.
    _over: bool = field(default=True, init=False, repr=False)

    def __post_init__(self) -> None:
        self._over = False

    def __iter__(self) -> _ResultStream:
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._over:
            raise StopIteration
        try:
            with self.query.serving(self.context):
                batch = self._next_batch()
        except Exception as exc:
            self.query.failed = True
            self.close(completed=False)
            if self.query.cancelled == "timeout" and not isinstance(exc, QueryTimeoutError):
                exc = self.timeout_error()
            raise to_flight(exc, self.secrets) from None
        if batch is None:
            self.close(completed=True)
            raise StopIteration
        return batch

    def _next_batch(self) -> pa.RecordBatch | None:
        query = self.query
        batch = next(query.batches, None) if query.cancelled is None else None
        if query.cancelled == "timeout":
            raise self.timeout_error()
        if query.cancelled is not None:
            raise QueryError(f"query cancelled ({query.cancelled})")
        return batch

    def close(self, *, completed: bool) -> None:
        """Finish the query once; a stream that did not complete cancels it first (its scans stop)."""
        if self._over:
            return
        self._over = True
        if not completed:
            self.query.cancel("client")
        self.query.finish()
        self.session.open.pop(self.query.handle, None)

    def __del__(self) -> None:
        self.close(completed=False)  # the call ended without reading to the end (or without reading at all)


# ----------------------------------------------------------------------------------------------- server


class _HandshakeOnly(flight.ServerAuthHandler):  # type: ignore[misc]
    """Lets Flight's Basic-auth handshake complete; the middleware authenticates it (and every other call)."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""


class SQEFlightServer(flight.FlightServerBase):  # type: ignore[misc]
    """Flight SQL over SQE user sessions. ``serve()`` blocks; ``shutdown()`` stops it."""

    def __init__(
        self,
        server_config: ServerConfig,
        engine_config: SQEConfig,
        broker: IdentityBroker,
        *,
        tls_certificates: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        check_serving_config(engine_config)
        scheme = "grpc+tls" if tls_certificates else "grpc+tcp"
        location = f"{scheme}://{server_config.listen}"
        super().__init__(
            location,
            auth_handler=_HandshakeOnly(),
            middleware={"sqe": AuthMiddlewareFactory(broker)},
            tls_certificates=tls_certificates or [],
        )
        self.server_config = server_config
        self.engine_config = engine_config
        self.broker = broker
        self.limits = Limits(server_config.max_concurrent_queries, server_config.max_concurrent_queries_per_user)
        # Preparing, describing and browsing count apart from queries, under the same bounds: a client reading a
        # result (its slot held until the stream ends) can still prepare its next statement or list tables.
        self.planning_limits = Limits(
            server_config.max_concurrent_queries,
            server_config.max_concurrent_queries_per_user,
            ("planning call", "planning calls"),
        )
        self.registry = SessionRegistry(
            engine_config, broker, self.limits, server_config.batch_rows, engine_limits(server_config)
        )
        self.parameter_budget = ParameterBudget(self.registry, server_config.max_parameter_bytes)
        self.watchdog = Watchdog(self.registry, server_config.idle_session_seconds)
        self.watchdog.start()

    # -- plumbing ---------------------------------------------------------------------------------------

    def _caller(self, context: Any) -> tuple[User, ClientSession]:
        middleware: AuthMiddleware | None = context.get_middleware("sqe")
        if middleware is None:
            raise AuthenticationError("unauthenticated call")
        if middleware.entered is not None:
            return middleware.user, middleware.entered[1]
        session = self.registry.enter(middleware.user, middleware.session_id, context.peer(), middleware.new_cookie)
        middleware.entered = (self.registry, session)  # held until the call completes (a DoGet: its stream too)
        return middleware.user, session

    def secrets_of(self, context: Any) -> list[str]:
        middleware = context.get_middleware("sqe") if context is not None else None
        return [middleware.user.token] if middleware is not None else []

    def _with_engine(self, user: User, session: ClientSession, work: Callable[[Engine], _T], context: Any) -> _T:
        """``work`` (preparing, describing, browsing metadata) under limits like a query's: a planning slot (the
        same bounds, counted apart from queries), ``query_timeout_seconds``, and a cancel when the client leaves.
        Planning alone can run long (DuckDB folds constant expressions, metadata calls list the catalog), so none
        of it may bypass the limits."""
        query, engine = self._planning_query(user, session, self.planning_limits)
        done = self._plan_within_limits(query, session, context, lambda: work(engine))
        timed_out = query.cancelled == "timeout"  # the deadline passed while a step that ignores interrupts ran
        query.finish()
        session.open.pop(query.handle, None)
        if timed_out:
            raise self._timeout()
        return done

    def _open_query(
        self, user: User, session: ClientSession, run: Callable[[Engine], Result], context: Any
    ) -> OpenQuery:
        """Run a statement under the limits on an engine of its own; the OpenQuery holds its stream."""
        query, engine = self._planning_query(user, session, self.limits)
        batch_rows = self.server_config.batch_rows
        reader = self._plan_within_limits(query, session, context, lambda: run(engine).reader(batch_rows))
        query.schema, query.batches, query.close_stream = reader.schema, iter(reader), reader.close
        del reader  # the query holds the only reference: finishing it frees the DuckDB stream at once
        query.planned()
        return query

    def _planning_query(self, user: User, session: ClientSession, limits: Limits) -> tuple[OpenQuery, Engine]:
        """A slot of ``limits`` (or ``server busy``), an engine of its own, and the query the watchdog times out."""
        limits.acquire(user.key)
        try:
            engine = session.acquire_engine(self.broker.catalog_token(user))
        except BaseException:
            limits.release(user.key)
            raise

        def release() -> None:
            # an interrupted or failed DuckDB connection is not reused: a fresh one costs little
            session.release_engine(engine, discard=query.cancelled is not None or query.failed)
            limits.release(user.key)

        query = OpenQuery.for_planning(
            handle=session.new_handle(),
            schema=pa.schema([]),
            batches=iter(()),
            deadline=time.monotonic() + self.server_config.query_timeout_seconds,
            cancel_engine=engine.session.interrupt,
            release=release,
            fetch_seconds=self.server_config.unfetched_result_seconds,
        )
        session.open[query.handle] = query  # the watchdog sees it (timeout) while it plans
        return query, engine

    def _plan_within_limits(self, query: OpenQuery, session: ClientSession, context: Any, work: Callable[[], _T]) -> _T:
        """``work`` on ``query``'s engine; a failure finishes the query (slot and engine back) and a timeout
        says so."""
        try:
            with query.serving(context):  # a client that gives up while we plan cancels the statement
                return work()
        except BaseException as exc:
            query.failed = True
            query.finish()
            session.open.pop(query.handle, None)
            if query.cancelled == "timeout":
                raise self._timeout() from exc
            raise

    def _table_query(self, session: ClientSession, table: pa.Table) -> OpenQuery:
        """A small, already computed result (metadata) waiting for its DoGet; holds no engine and no slot."""
        query = OpenQuery(
            handle=session.new_handle(),
            schema=table.schema,
            batches=iter(table.to_batches()),
            deadline=time.monotonic() + self.server_config.query_timeout_seconds,
            cancel_engine=lambda: None,
            release=lambda: None,
            fetch_seconds=self.server_config.unfetched_result_seconds,
        )
        session.hold_result(query)
        return query

    def _timeout(self) -> QueryTimeoutError:
        return QueryTimeoutError(
            f"the query ran longer than query_timeout_seconds ({self.server_config.query_timeout_seconds:g} s)"
        )

    @staticmethod
    def _info(descriptor: flight.FlightDescriptor, query: OpenQuery) -> flight.FlightInfo:
        ticket = flight.Ticket(_pack(sql_pb.TicketStatementQuery(statement_handle=query.handle)))
        return flight.FlightInfo(query.schema, descriptor, [flight.FlightEndpoint(ticket, [])], -1, -1)

    # -- GetFlightInfo ----------------------------------------------------------------------------------

    @_handler
    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        user, session = self._caller(context)
        wrapper = _unpack_any(descriptor.command or b"")
        name = _command_name(wrapper)
        if name == "CommandStatementQuery":
            sql = _message(wrapper, sql_pb.CommandStatementQuery).query
            query = self._open_query(user, session, lambda e: e.session.sql(sql), context)
        elif name == "CommandPreparedStatementQuery":
            handle = _message(wrapper, sql_pb.CommandPreparedStatementQuery).prepared_statement_handle
            prepared = self._prepared(session, handle)
            rows = _parameter_sets(prepared.sql, prepared.parameters)
            if len(rows) != 1:
                raise QueryError(f"a prepared query runs with one parameter set, {len(rows)} were bound")
            query = self._open_query(user, session, lambda e: self._execute(e, prepared, rows[0]), context)
        else:
            query = self._table_query(session, self._metadata(user, session, name, wrapper, context))
        return self._info(descriptor, query)

    @_handler
    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        user, session = self._caller(context)
        wrapper = _unpack_any(descriptor.command or b"")
        name = _command_name(wrapper)
        if name in ("CommandStatementQuery", "CommandPreparedStatementQuery"):
            if name == "CommandStatementQuery":
                sql = _message(wrapper, sql_pb.CommandStatementQuery).query
            else:
                handle = _message(wrapper, sql_pb.CommandPreparedStatementQuery).prepared_statement_handle
                sql = self._prepared(session, handle).sql
            schema = self._with_engine(user, session, lambda e: _result_schema(e, sql), context)
            if schema is None:
                raise QueryError("this statement returns no result set")
            return flight.SchemaResult(schema)
        if name == "CommandGetTables":
            include_schema = _message(wrapper, sql_pb.CommandGetTables).include_schema
            return flight.SchemaResult(metadata.tables_schema(include_schema))
        schemas = {
            "CommandGetCatalogs": metadata.CATALOGS_SCHEMA,
            "CommandGetDbSchemas": metadata.DB_SCHEMAS_SCHEMA,
            "CommandGetTableTypes": metadata.TABLE_TYPES_SCHEMA,
            "CommandGetSqlInfo": metadata.SQL_INFO_SCHEMA,
        }
        if name not in schemas:
            raise QueryError(f"GetSchema is not supported for {name or 'this command'}; use GetFlightInfo")
        return flight.SchemaResult(schemas[name])

    def _metadata(self, user: User, session: ClientSession, name: str, wrapper: any_pb2.Any, context: Any) -> pa.Table:
        # Only what the user's session can query: a sibling on another catalog is dropped from their config.
        warehouses = served_warehouses(self.engine_config)
        if name == "CommandGetCatalogs":
            return metadata.catalogs(warehouses)
        if name == "CommandGetTableTypes":
            return metadata.table_types()
        if name == "CommandGetSqlInfo":
            return metadata.sql_info(list(_message(wrapper, sql_pb.CommandGetSqlInfo).info))
        if name == "CommandGetDbSchemas":
            request = _message(wrapper, sql_pb.CommandGetDbSchemas)
            catalog = request.catalog if request.HasField("catalog") else None
            pattern = request.db_schema_filter_pattern if request.HasField("db_schema_filter_pattern") else None
            return self._with_engine(
                user, session, lambda e: metadata.db_schemas(e, warehouses, catalog, pattern), context
            )
        if name == "CommandGetTables":
            t = _message(wrapper, sql_pb.CommandGetTables)
            args = (
                t.catalog if t.HasField("catalog") else None,
                t.db_schema_filter_pattern if t.HasField("db_schema_filter_pattern") else None,
                t.table_name_filter_pattern if t.HasField("table_name_filter_pattern") else None,
                list(t.table_types),
                t.include_schema,
            )
            return self._with_engine(user, session, lambda e: metadata.tables(e, warehouses, *args), context)
        raise QueryError(f"{name or 'this command'} is not supported by sqe serve")

    # -- DoGet ------------------------------------------------------------------------------------------

    @_handler
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.GeneratorStream:
        _, session = self._caller(context)
        handle = _message(_unpack_any(ticket.ticket), sql_pb.TicketStatementQuery).statement_handle
        query = session.open.get(handle)
        if query is None or not query.claim():
            raise UnknownHandleError("unknown or already used ticket (results are read once, by their session)")
        stream = _ResultStream(session, query, context, self.secrets_of(context), self._timeout)
        return flight.GeneratorStream(query.schema, stream)

    # -- DoPut ------------------------------------------------------------------------------------------

    @_handler
    def do_put(
        self,
        context: Any,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        user, session = self._caller(context)
        wrapper = _unpack_any(descriptor.command or b"")
        name = _command_name(wrapper)
        if name == "CommandStatementUpdate":
            sql = _message(wrapper, sql_pb.CommandStatementUpdate).query
            count = self._update(user, session, lambda e: _count_of(e.session.sql(sql)), context)
            writer.write(pa.py_buffer(sql_pb.DoPutUpdateResult(record_count=count).SerializeToString()))
        elif name == "CommandPreparedStatementQuery":
            handle = _message(wrapper, sql_pb.CommandPreparedStatementQuery).prepared_statement_handle
            prepared = self._prepared(session, handle)
            rows, reserved = self._parameters(reader, session, handle, replacing=True)
            self.parameter_budget.bind(session, handle, prepared, rows, reserved)
            result = sql_pb.DoPutPreparedStatementResult(prepared_statement_handle=handle)
            writer.write(pa.py_buffer(result.SerializeToString()))
        elif name == "CommandPreparedStatementUpdate":
            handle = _message(wrapper, sql_pb.CommandPreparedStatementUpdate).prepared_statement_handle
            prepared = self._prepared(session, handle)
            sent, reserved = self._parameters(reader, session, handle, replacing=False)
            try:
                # The update's own stream carries its parameter rows (ADBC executemany); only a stream without rows
                # runs with those a CommandPreparedStatementQuery DoPut bound before, as Arrow's reference servers do.
                rows = _parameter_sets(prepared.sql, sent if sent.num_rows else prepared.parameters)
                count = self._update(
                    user, session, lambda e: _count_of(self._execute_batch(e, prepared, rows)), context
                )
            finally:
                self.parameter_budget.release(session, reserved)  # held in memory until the update has run
            writer.write(pa.py_buffer(sql_pb.DoPutUpdateResult(record_count=count).SerializeToString()))
        else:
            raise QueryError(f"DoPut of {name or 'this command'} is not supported by sqe serve")

    def _parameters(
        self, reader: flight.MetadataRecordBatchReader, session: ClientSession, handle: bytes, *, replacing: bool
    ) -> tuple[pa.Table, int]:
        """The parameter rows of a DoPut and the bytes reserved for them (``ParameterBudget``), read before any
        query slot; past the user's ``max_parameter_bytes`` the call is refused and its reservation released."""
        batches, reserved = [], 0
        try:
            for chunk in reader:
                if chunk.data is None:
                    continue
                size = batch_bytes(chunk.data)  # decoded: a few bytes of some encodings hold millions of values
                self.parameter_budget.reserve(session, handle, size, replacing=replacing)
                reserved += size
                batches.append(chunk.data)
            return pa.Table.from_batches(batches, schema=reader.schema), reserved
        except BaseException:
            self.parameter_budget.release(session, reserved)
            raise

    def _update(self, user: User, session: ClientSession, work: Callable[[Engine], int], context: Any) -> int:
        """An update statement under the same limits and timeout as a query; runs to completion here."""
        counted: dict[str, int] = {}

        def run(engine: Engine) -> Result:
            counted["rows"] = work(engine)
            return Result(engine.session, table=pa.table({}))

        query = self._open_query(user, session, run, context)
        query.finish()
        session.open.pop(query.handle, None)
        return counted.get("rows", -1)

    # -- prepared statements ----------------------------------------------------------------------------

    def _prepared(self, session: ClientSession, handle: bytes) -> Prepared:
        prepared = session.prepared.get(handle)
        if prepared is None:
            raise UnknownHandleError("unknown prepared statement handle (closed, or of another session)")
        return prepared

    @staticmethod
    def _plan(engine: Engine, prepared: Prepared) -> PreparedStatement | None:
        """The statement's plan on this engine; None for one the session cannot prepare (e.g. CREATE TABLE AS)."""
        plan = prepared.plans.get(engine.serial)
        if plan is None:
            try:
                plan = prepared.plans[engine.serial] = engine.session.prepare(prepared.sql)
            except QueryError:
                return None
        return plan

    @classmethod
    def _execute(cls, engine: Engine, prepared: Prepared, params: Params) -> Result:
        plan = cls._plan(engine, prepared)
        if plan is None:
            return engine.session.sql(prepared.sql, params or None)
        return plan.execute(params or None)

    @classmethod
    def _execute_batch(cls, engine: Engine, prepared: Prepared, rows: list[Params]) -> Result:
        """Every parameter row in one commit, all or nothing: a failing row must not leave earlier rows written
        while the client, told of the failure, retries them."""
        if len(rows) == 1:
            return cls._execute(engine, prepared, rows[0])
        plan = cls._plan(engine, prepared)
        if plan is None:
            raise QueryError(f"only a prepared INSERT runs with a batch of parameter rows ({len(rows)} were sent)")
        return plan.execute_many(rows)

    # -- actions ----------------------------------------------------------------------------------------

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [
            ("CreatePreparedStatement", "prepare a SQL statement"),
            ("ClosePreparedStatement", "close a prepared statement"),
            ("CancelFlightInfo", "cancel a running query"),
            ("CancelQuery", "cancel a running query (Flight SQL's older action)"),
        ]

    # Flight calls outside Flight SQL: pyarrow's defaults refuse them as UNIMPLEMENTED with an empty message.
    def list_flights(self, context: Any, criteria: bytes) -> list[flight.FlightInfo]:
        raise NotImplementedError("ListFlights is not served by sqe serve: send Flight SQL commands to GetFlightInfo")

    def do_exchange(self, context: Any, descriptor: flight.FlightDescriptor, reader: Any, writer: Any) -> None:
        raise NotImplementedError("DoExchange is not served by sqe serve: send Flight SQL commands")

    @_handler
    def do_action(self, context: Any, action: flight.Action) -> list[flight.Result]:
        user, session = self._caller(context)
        body = action.body.to_pybytes() if action.body is not None else b""
        if action.type == "CreatePreparedStatement":
            sql = _message(_unpack_any(body), sql_pb.ActionCreatePreparedStatementRequest).query
            return [flight.Result(pa.py_buffer(self._create_prepared(user, session, sql, context)))]
        if action.type == "ClosePreparedStatement":
            handle = _message(_unpack_any(body), sql_pb.ActionClosePreparedStatementRequest).prepared_statement_handle
            session.close_prepared(handle)
            return []
        if action.type == "CancelFlightInfo":
            return [flight.Result(pa.py_buffer(self._cancel_flight_info(session, body)))]
        if action.type == "CancelQuery":
            return [flight.Result(pa.py_buffer(self._cancel_query(session, body)))]
        raise QueryError(f"unknown action {action.type[:60]!r}")

    def _create_prepared(self, user: User, session: ClientSession, sql: str, context: Any) -> bytes:
        prepared = Prepared(sql)

        def plan(engine: Engine) -> None:
            # Any other error is the statement's own (its text may say anything): the client is told now.
            with contextlib.suppress(StatementNotPreparableError):  # run as a plain statement at execution
                prepared.plans[engine.serial] = engine.session.prepare(sql)

        def plan_and_describe(engine: Engine) -> pa.Schema | None:
            plan(engine)
            return _result_schema(engine, sql)

        schema = self._with_engine(user, session, plan_and_describe, context)
        handle = session.new_handle()
        session.add_prepared(handle, prepared)
        result = sql_pb.ActionCreatePreparedStatementResult(prepared_statement_handle=handle)
        if schema is not None:
            result.dataset_schema = schema.serialize().to_pybytes()
        parameters = _parameter_schema(sql)
        if parameters is not None:
            result.parameter_schema = parameters.serialize().to_pybytes()
        return _pack(result)

    def _cancel_flight_info(self, session: ClientSession, body: bytes) -> bytes:
        handle = _cancelled_handle("CancelFlightInfo", lambda: cancel_pb.CancelFlightInfoRequest.FromString(body).info)
        cancelled = self._cancel(session, handle)
        status = cancel_pb.CANCEL_STATUS_CANCELLED if cancelled else cancel_pb.CANCEL_STATUS_NOT_CANCELLABLE
        return bytes(cancel_pb.CancelFlightInfoResult(status=status).SerializeToString())

    def _cancel_query(self, session: ClientSession, body: bytes) -> bytes:
        """Flight SQL's deprecated CancelQuery: an Any-packed request and result around the same cancel."""
        handle = _cancelled_handle("CancelQuery", lambda: _cancel_query_request(body).info)
        codes = sql_pb.ActionCancelQueryResult
        cancelled = self._cancel(session, handle)
        result = codes.CANCEL_RESULT_CANCELLED if cancelled else codes.CANCEL_RESULT_NOT_CANCELLABLE
        return _pack(sql_pb.ActionCancelQueryResult(result=result))

    @staticmethod
    def _cancel(session: ClientSession, handle: bytes) -> bool:
        """Cancel this session's query ``handle``; False when it holds no such query still running."""
        query = session.open.get(handle)
        if query is None or not query.cancel("cancel"):
            return False
        if query.finish_if_waiting():  # not streaming yet: nothing will read it any more
            session.open.pop(handle, None)
        return True

    # -- lifecycle --------------------------------------------------------------------------------------

    def close(self) -> None:
        self.watchdog.stop()
        self.registry.close()
        self.broker.close()
