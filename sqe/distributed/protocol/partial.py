"""Partial aggregation of one fragment (``ScanTicket.partial_aggregate``): the spec, its wire form, its SQL.

The coordinator and the worker share this module, so the SQL a worker runs over its fragment's restricted rows
and the SQL the coordinator runs over an empty table to learn the partial schema are built by one function.
The SQL is built only from the function enum and column names quoted with ``quote_ident``, after every name was
checked against the restricted output's columns; it runs on a private connection to a locked-down DuckDB database
(no file or network access, configuration locked) whose only table is the registered stream of restricted batches.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import duckdb
import pyarrow as pa

from sqe._lru import LRUCache
from sqe._text import first_line
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.duckdb_connection import DatabaseLimits, close_at_exit, connect_locked_down, out_of_memory, quote_ident
from sqe.errors import QueryResourceError
from sqe.execution.local import QueryCancelledError
from sqe.planning.user_filter import UserFilter, Value

Function = Literal["count_star", "count", "sum", "min", "max"]

_TO_WIRE: dict[Function, int] = {
    "count_star": pb.AGGREGATE_FUNCTION_COUNT_STAR,
    "count": pb.AGGREGATE_FUNCTION_COUNT,
    "sum": pb.AGGREGATE_FUNCTION_SUM,
    "min": pb.AGGREGATE_FUNCTION_MIN,
    "max": pb.AGGREGATE_FUNCTION_MAX,
}
_FROM_WIRE: dict[int, Function] = {wire: name for name, wire in _TO_WIRE.items()}
_SOURCE = "__sqe_fragment"
# Measured on a worker pinned to one core (bench/distributed.py --efficiency): DuckDB's own threads only
# compete with the reader threads for that core, one thread was as fast or faster.
DUCKDB_THREADS = 1
_PARTIAL_TYPES: LRUCache[tuple[PartialAggregate, pa.Schema], tuple[pa.Schema, tuple[str, ...]]] = LRUCache(256)
_PARTIAL_BATCH_ROWS = 64 * 1024
_DATABASE: duckdb.DuckDBPyConnection | None = None  # see _connect
_DATABASE_LOCK = threading.Lock()


@dataclass(frozen=True)
class PartialAggregate:
    """Group-by column names and ``(function, column)`` aggregates (column ``""`` for ``count_star``)."""

    group_by: tuple[str, ...]
    aggregates: tuple[tuple[Function, str], ...]

    def to_proto(self) -> pb.PartialAggregate:
        return pb.PartialAggregate(
            group_by=list(self.group_by),
            aggregates=[pb.Aggregate(function=_TO_WIRE[f], column=c) for f, c in self.aggregates],  # type: ignore[arg-type]
        )

    @classmethod
    def from_proto(cls, message: pb.PartialAggregate) -> PartialAggregate:
        """The validated spec; an unspecified or unknown function, or a misplaced column, is InvalidTicketError."""
        aggregates: list[tuple[Function, str]] = []
        for index, item in enumerate(message.aggregates):
            function = _FROM_WIRE.get(item.function)
            if function is None:
                raise InvalidTicketError(f"partial_aggregate: aggregate {index} has no (or an unknown) function")
            if (function == "count_star") == bool(item.column):
                need = "no column" if function == "count_star" else "a column"
                raise InvalidTicketError(f"partial_aggregate: aggregate {index} ({function}) needs {need}")
            aggregates.append((function, item.column))
        if not aggregates and not message.group_by:
            raise InvalidTicketError("partial_aggregate: needs at least one aggregate or group-by column")
        return cls(tuple(message.group_by), tuple(aggregates))

    def check_columns(self, schema: pa.Schema) -> None:
        """Every name is a column of the restricted output, else InvalidTicketError (names are shown quoted)."""
        known = set(schema.names)
        named = [*self.group_by, *(column for _, column in self.aggregates if column)]
        unknown = sorted({name for name in named if name not in known})
        if unknown:
            shown = ", ".join(repr(name[:100]) for name in unknown[:5])
            raise InvalidTicketError(f"partial_aggregate names column(s) not in the restricted output: {shown}")

    def sql(self, source: str = _SOURCE, where: UserFilter | None = None) -> tuple[str, list[Value]]:
        """``SELECT g0.., a0.. FROM source [WHERE ..] [GROUP BY ..]`` and its parameters: the partial rows of one
        fragment, of the rows ``where`` keeps. The WHERE's constants are bound parameters, never SQL text."""
        groups = [f"{quote_ident(name)} AS g{i}" for i, name in enumerate(self.group_by)]
        values = [f"{_call(function, column)} AS a{i}" for i, (function, column) in enumerate(self.aggregates)]
        text = f"SELECT {', '.join(groups + values)} FROM {quote_ident(source)}"
        parameters: list[Value] = []
        if where is not None:
            text += " WHERE " + where.sql(parameters)
        if self.group_by:
            text += " GROUP BY " + ", ".join(quote_ident(name) for name in self.group_by)
        return text, parameters


def _call(function: Function, column: str) -> str:
    return "count(*)" if function == "count_star" else f"{function}({quote_ident(column)})"


def partial_types(spec: PartialAggregate, schema: pa.Schema) -> tuple[pa.Schema, list[str]]:
    """The partial rows' Arrow schema and DuckDB type names, from the partial SQL over an empty ``schema`` table.
    Kept per (spec, schema): a pure function of both, asked by the coordinator per statement and by a worker per
    ticket (about 2 ms each time otherwise)."""
    spec.check_columns(schema)
    found = _PARTIAL_TYPES.get((spec, schema))
    if found is None:
        con = _connect()
        try:
            con.register(_SOURCE, pa.Table.from_batches([], schema))
            relation = con.sql(spec.sql()[0])
            found = relation.to_arrow_table().schema, tuple(str(t) for t in relation.types)
        finally:
            con.close()
        _PARTIAL_TYPES.put((spec, schema), found)
    return found[0], list(found[1])


def checked_partial_schema(spec: PartialAggregate, schema: pa.Schema) -> pa.Schema:
    """The worker's check of a ticket's spec against its restricted output: every name is a column and DuckDB can
    bind every aggregate (``sum`` of a string cannot), else InvalidTicketError before any file is read."""
    try:
        return partial_types(spec, schema)[0]
    except duckdb.Error as exc:
        shown = ", ".join(f"{function}({column[:100]!r})" for function, column in spec.aggregates[:5])
        raise InvalidTicketError(
            f"partial_aggregate cannot be computed over the restricted output: {shown} ({type(exc).__name__})"
        ) from None


class PartialInterrupt:
    """Stops one :func:`run_partial` while DuckDB works, from another thread.

    Cancelling a fragment stops its readers, which ends DuckDB's scan; but a large GROUP BY then still finalises
    its hash tables and produces every partial row. ``interrupt`` stops that at once (DuckDB's own interrupt, on
    the connection the run uses). One that comes before the run starts keeps it from starting; after it ended,
    one changes nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: duckdb.DuckDBPyConnection | None = None
        self._interrupted = False

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    def interrupt(self) -> None:
        with self._lock:
            self._interrupted = True
            if self._connection is not None:
                self._connection.interrupt()

    @contextmanager
    def running_on(self, connection: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """While the block runs, ``interrupt`` reaches ``connection``; one interrupted before it starts never
        starts (QueryCancelledError)."""
        with self._lock:
            if self._interrupted:
                raise QueryCancelledError()
            self._connection = connection
        try:
            yield
        finally:
            with self._lock:
                self._connection = None


def run_partial(
    spec: PartialAggregate,
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
    where: UserFilter | None = None,
    database: duckdb.DuckDBPyConnection | None = None,
    interrupt: PartialInterrupt | None = None,
) -> Iterator[pa.RecordBatch]:
    """The partial rows of the restricted ``batches`` (streamed into DuckDB, never materialised first), of the
    rows ``where`` keeps: DuckDB runs it in the aggregation's own pipeline, measured cheaper than filtering the
    batches first (that copies every kept value once more).

    An error raised by ``batches`` (a read failure, cancellation, expired credentials) is re-raised as itself,
    not as DuckDB's wrapping of it, so the fragment fails with its own kind. Running out of the memory or spill
    space of the database (``database``, one of :func:`open_database`; else the process's shared one) is
    QueryResourceError: the same fragment fails again under the same limits. ``interrupt`` stops DuckDB from
    another thread (QueryCancelledError)."""
    failure: list[BaseException] = []

    def guarded() -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except Exception as exc:
            failure.append(exc)
            raise

    con = _connect() if database is None else database.cursor()
    interrupt = interrupt or PartialInterrupt()
    try:
        con.register(_SOURCE, pa.RecordBatchReader.from_batches(schema, guarded()))
        try:
            with interrupt.running_on(con):
                text, parameters = spec.sql(where=where)
                reader = con.sql(text, params=parameters or None).to_arrow_reader(_PARTIAL_BATCH_ROWS)
                if interrupt.interrupted:  # it came before the query began, which clears DuckDB's flag
                    raise QueryCancelledError()
                yield from reader
        except (duckdb.Error, pa.ArrowException, OSError) as exc:
            if failure:
                raise failure[0] from None
            if interrupt.interrupted:  # DuckDB's "Interrupted!", in whichever wrapping its reader raises it
                raise QueryCancelledError() from None
            if out_of_memory(exc):  # its message: DuckDB's sizes, never a value
                raise QueryResourceError(first_line(exc)) from None
            raise
    finally:
        close = getattr(batches, "close", None)
        if close is not None:  # stops the fragment's reader threads at once
            close()
        con.close()


def _connect() -> duckdb.DuckDBPyConnection:
    """A private connection: its registered fragment stream is visible to it alone (DuckDB's temporary objects
    are per connection). It shares one locked-down in-memory database per process, because opening a new
    database costs about 25 ms, most of a small fragment's aggregation."""
    global _DATABASE
    with _DATABASE_LOCK:
        if _DATABASE is None:
            _DATABASE = connect_locked_down(_configure)
            close_at_exit(_DATABASE)
        return _DATABASE.cursor()


def open_database(limits: DatabaseLimits) -> duckdb.DuckDBPyConnection:
    """A locked-down database of its own for partial aggregation, within ``limits`` (its own spill directory, as
    every database's): a worker gives each running fragment one, so one fragment's large aggregate cannot take
    the memory or spill space of the others (within one database, DuckDB's buffers go to whoever asks first)."""

    def configure(con: duckdb.DuckDBPyConnection) -> None:
        _configure(con)
        limits.apply(con)

    return connect_locked_down(configure)


def _configure(con: duckdb.DuckDBPyConnection) -> None:
    """Threads as measured; a fixed zone, so a zoned timestamp's Arrow type (its zone label) is the same on the
    coordinator and on every worker whatever their machines' ``TZ`` (a different label fails the query)."""
    con.execute("SET GLOBAL TimeZone = 'UTC'")  # GLOBAL: the default of every cursor
    con.execute(f"SET threads = {int(DUCKDB_THREADS)}")
