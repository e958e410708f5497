"""Pass-through queries: results DuckDB would not transform stream from SQE's readers straight to the caller.

A plain ``SELECT *`` handed to DuckDB is read by the reader threads into Arrow, imported by DuckDB and exported
back to Arrow on one thread: a full copy of every value for nothing. A statement is *pass-through* when its
result is, value for value, the restricted batches of its one table with columns picked, rows dropped by simple
predicates and a row count cut. Only this shape qualifies (anything else, or anything unsure, runs in DuckDB
as before):

- one SELECT over one base table (no CTE, join, subquery, sample, time travel, DISTINCT, GROUP BY, HAVING,
  QUALIFY, window or ORDER BY);
- a select list of plain column references (qualified or not, aliased or not) or a bare ``*``;
- an optional WHERE that is an AND/OR/NOT (``sqe.planning.user_filter``) of ``column <op> constant``,
  ``IN`` lists of constants, ``BETWEEN``, ``IS [NOT] NULL`` and ``LIKE``, on columns and constants of the types
  whose comparison pyarrow and DuckDB define the same way (integers, strings, booleans, dates, doubles;
  ``IS [NOT] NULL`` on any primitive column);
- an optional ``LIMIT`` / ``OFFSET`` of integer constants, without ORDER BY.

The restriction order is the same as in DuckDB: each batch is row-filtered on raw values and masked by the
scan (``ScanStream``, or the workers for a ``DistributedScanStream``), and only then does the user's WHERE run
here, on the masked values: in the reader threads, or on the coordinator's consumer thread for a distributed
scan. Projection is zero-copy. ``LIMIT`` closes the scan once enough rows came, which stops the readers (or
cancels the workers' fragments).

The output looks exactly like DuckDB's: the column names come from DuckDB's own binding of the statement and
each column's type is what DuckDB exports for the scan's Arrow type (probed once per schema on the session's
connection, so settings like the time zone count). Columns DuckDB exports with another type are cast only
where the cast keeps every value (64- to 32-bit string offsets, a timestamptz's zone label); any other
difference, and any nested column, sends the statement to DuckDB.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from sqe._lru import LRUCache
from sqe.errors import QueryError
from sqe.planning.sql_analysis import Node, parse_select, referenced_column, single_base_table
from sqe.planning.user_filter import NotSimple, UserFilter, simple_where

if TYPE_CHECKING:
    import duckdb
    from pyiceberg.types import NestedField

    from sqe.catalog.base import TableIdent
    from sqe.execution.local import BatchTransform
    from sqe.planning.planner import ScanPlan
    from sqe.planning.sql_analysis import TableRef

PATH_PASS_THROUGH = "pass-through"
PATH_DUCKDB = "duckdb"
_KEPT_SCHEMAS = 64  # DuckDB's export schema of recent scan schemas, per session

# Keys of a SELECT_NODE that must be empty for a pass-through statement (any other key must be falsy too).
_SELECT_KEYS = {"type", "modifiers", "cte_map", "select_list", "from_table", "where_clause", "aggregate_handling"}
_STAR_KEYS = {"class", "type", "alias", "query_location", "query_location_length", "relation_name", "columns"}


class _NotPassThrough(Exception):
    """Raised inside recognition: the statement runs in DuckDB."""


@dataclass(frozen=True)
class PassThrough:
    """How to turn one scan's restricted batches into the statement's result without DuckDB."""

    schema: pa.Schema  # the result: DuckDB's column names and export types
    scan_names: list[str]  # the restricted batches' column names (the scan's schema)
    sources: tuple[int, ...]  # per output column, its index in the restricted batch
    where: UserFilter | None  # the user's WHERE, run by the scan on restricted (masked) values
    limit: int | None
    offset: int

    def shape(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """Project and conform one restricted batch the scan kept (runs in the reader threads, or on the
        coordinator's consumer thread for a distributed scan). The batch is not yet conformed to the scan's
        schema: each kept column is cast once, straight to the result's type (a file's plain strings stay plain
        instead of going to 64-bit offsets and back)."""
        if batch.schema.names != self.scan_names:
            batch = batch.rename_columns(self.scan_names)
        columns = [batch.column(index) for index in self.sources]
        columns = [c if c.type == f.type else c.cast(f.type) for c, f in zip(columns, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)

    def batches(self, shaped: Iterator[pa.RecordBatch], max_rows: int | None = None) -> Generator[pa.RecordBatch]:
        """The result's batches from the shaped scan: OFFSET and LIMIT applied, the scan closed as soon as the
        limit is reached (its readers stop), batches cut to ``max_rows``."""
        skip, left = self.offset, self.limit
        try:
            if left == 0:
                return
            for batch in shaped:
                if skip:
                    dropped = min(skip, batch.num_rows)
                    batch, skip = batch.slice(dropped), skip - dropped
                if left is not None:
                    batch = batch.slice(0, left)
                    left -= batch.num_rows
                if batch.num_rows:
                    yield from _cut(batch, max_rows)
                if left == 0:
                    return
        finally:
            close = getattr(shaped, "close", None)
            if close is not None:  # a generator over the scan: closing it stops the reader threads
                close()

    def describe(self) -> str:
        parts = ["SQE streams the restricted batches; DuckDB does not run the query"]
        if self.where is not None:
            parts.append("the WHERE runs after the row filter and masks")
        if self.limit is not None:
            parts.append(f"LIMIT {self.limit} stops the scan")
        return "; ".join(parts)


def _cut(batch: pa.RecordBatch, max_rows: int | None) -> Iterator[pa.RecordBatch]:
    if max_rows is None or batch.num_rows <= max_rows:
        yield batch
        return
    for start in range(0, batch.num_rows, max_rows):
        yield batch.slice(start, max_rows)


def _recognise(
    tree: Node,
    plan: ScanPlan,
    output_names: Sequence[str],
    resolve: Callable[[TableRef], TableIdent],
    exported: Callable[[pa.Schema], pa.Schema],
) -> PassThrough:
    """The pass-through form of a parsed statement over ``plan``'s scan; raises ``_NotPassThrough`` when DuckDB
    must run it. ``output_names``: DuckDB's names of the result columns (its binding of the statement);
    ``exported``: the schema DuckDB exports for a registered Arrow stream of a schema."""
    _require(tree.get("type") == "SELECT_NODE" and "class" not in tree)
    _require(all(not value for key, value in tree.items() if key not in _SELECT_KEYS))
    _require(not (tree.get("cte_map") or {}).get("map") and tree.get("aggregate_handling") == "STANDARD_HANDLING")
    ref = _base_table(tree.get("from_table"), plan, resolve)
    scan = plan.arrow_schema
    columns = _Columns(scan, ref, plan)
    sources = [index for item in tree.get("select_list") or [] for index in columns.selected(item)]
    _require(bool(sources) and len(sources) == len(output_names))
    where = _where(tree.get("where_clause"), columns, scan)
    limit, offset = _limit(tree.get("modifiers") or [])
    duck = exported(scan)
    fields = []
    for name, index in zip(output_names, sources, strict=True):
        ours, theirs = scan.field(index).type, duck.field(index).type
        _require(not pa.types.is_nested(ours) and (ours == theirs or _exact_cast(ours, theirs)))
        fields.append(duck.field(index).with_name(name))
    schema = pa.schema(fields, metadata=duck.metadata)
    return PassThrough(schema, scan.names, tuple(sources), where, limit, offset)


def _require(condition: bool) -> None:
    if not condition:
        raise _NotPassThrough


def _base_table(node: Node | None, plan: ScanPlan, resolve: Callable[[TableRef], TableIdent]) -> TableRef:
    ref = single_base_table(node, plan.ident, resolve)
    _require(ref is not None)
    assert ref is not None
    return ref


def _exact_cast(ours: pa.DataType, theirs: pa.DataType) -> bool:
    """Whether casting to DuckDB's export type keeps every value: DuckDB exports strings and binaries with
    32-bit offsets (``large_*`` in, plain out) and names the session's zone for a timestamptz (``Etc/UTC`` for
    ``UTC``). Any other difference sends the statement to DuckDB."""
    narrowed = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}.get(ours)
    if narrowed is not None:
        return bool(narrowed == theirs)
    same_instant = pa.types.is_timestamp(ours) and pa.types.is_timestamp(theirs)
    return bool(same_instant and ours.unit == theirs.unit and ours.tz and theirs.tz)


class _Columns:
    """Column references of the statement, resolved to columns of the restricted batches."""

    def __init__(self, scan: pa.Schema, ref: TableRef, plan: ScanPlan) -> None:
        self._scan = scan
        self._ref = ref
        self._read_schema = plan.read.projected_schema

    def selected(self, item: Node) -> list[int]:
        if item.get("class") == "STAR":
            _require(all(not value for key, value in item.items() if key not in _STAR_KEYS))
            relation = str(item.get("relation_name") or "").lower()
            _require(item.get("columns") is False and (not relation or relation in self._ref.qualifiers))
            return list(range(len(self._scan)))
        return [self.index(item)]

    def index(self, node: Node | None) -> int:
        found = referenced_column(node, self._scan.names, self._ref)
        _require(found is not None)
        assert found is not None
        return found

    def name(self, node: Node | None) -> str | None:
        found = referenced_column(node, self._scan.names, self._ref)
        return None if found is None else str(self._scan.field(found).name)

    def read_field(self, name: str) -> NestedField:
        return self._read_schema.find_field(name)


def _where(node: Node | None, columns: _Columns, scan: pa.Schema) -> UserFilter | None:
    """The simple WHERE (``sqe.planning.user_filter``), checked to compile over the scan's schema."""
    try:
        return simple_where(node, columns.name, columns.read_field, scan)
    except NotSimple:
        raise _NotPassThrough from None


def _limit(modifiers: list[Node]) -> tuple[int | None, int]:
    _require(len(modifiers) <= 1)
    if not modifiers:
        return None, 0
    [modifier] = modifiers
    _require(modifier.get("type") == "LIMIT_MODIFIER" and modifier.get("limit_type", "ROW_COUNT") == "ROW_COUNT")
    limit = modifier.get("limit")
    offset = modifier.get("offset")
    return (None if limit is None else _count(limit)), (0 if offset is None else _count(offset))


def _count(node: Node) -> int:
    literal = node.get("literal") or {}
    text = str(literal.get("text"))
    _require(node.get("class") == "CONSTANT" and literal.get("kind") in ("INTEGER", "BIGINT") and text.isdigit())
    value = int(text)
    _require(0 <= value < 2**63)
    return value


class RestrictedScan(Protocol):
    """What a pass-through run reads: a scan of one table whose batches are already restricted (``ScanStream``
    in-process, ``DistributedScanStream`` on workers); ``where`` keeps the rows it matches (in the reader threads,
    or on the workers), then ``then`` runs on each batch; closing stops the scan."""

    @property
    def plan(self) -> ScanPlan: ...

    def batches(
        self, then: BatchTransform | None = None, where: UserFilter | None = None
    ) -> Iterator[pa.RecordBatch]: ...


@dataclass(frozen=True)
class PassThroughRun:
    """A recognised statement bound to the scan stream it reads; runs (once per ``batches`` call) when read."""

    shape: PassThrough
    stream: RestrictedScan

    @property
    def schema(self) -> pa.Schema:
        return self.shape.schema

    def batches(self, max_rows: int | None = None) -> Generator[pa.RecordBatch]:
        """The result's batches; closing the generator ends the run."""
        return self.shape.batches(self.stream.batches(self.shape.shape, self.shape.where), max_rows)

    def table(self) -> pa.Table:
        return pa.Table.from_batches(list(self.batches()), schema=self.schema)


class PassThroughPlanner:
    """Recognises pass-through statements of one session; probes (and keeps) DuckDB's export types."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        parser: duckdb.DuckDBPyConnection,
        resolve: Callable[[TableRef], TableIdent],
    ) -> None:
        self._con = con
        self._parser = parser
        self._resolve = resolve
        # Keyed by the schema's IPC bytes: ``pa.Schema`` equality ignores field metadata that changes DuckDB's
        # export (``ARROW:extension:name``). Not shared between sessions: a new connection's first statement pays
        # a start-up cost that the probe otherwise pays, so a process-wide cache measured no faster.
        self._exported: LRUCache[bytes, pa.Schema] = LRUCache(_KEPT_SCHEMAS)

    def plan(
        self, sql: str, stream: RestrictedScan, output_names: Callable[[], Sequence[str]]
    ) -> PassThroughRun | None:
        """The pass-through run of ``sql`` (a SELECT whose only scan is ``stream``), or None for DuckDB.
        ``output_names``: DuckDB's result column names (asked only when the statement's shape qualifies)."""
        tree = self._tree(sql)
        if tree is None:
            return None
        try:
            _shape_only(tree, stream.plan, self._resolve)
            shape = _recognise(tree, stream.plan, output_names(), self._resolve, self.exported)
        except _NotPassThrough:
            return None
        return PassThroughRun(shape, stream)

    def _tree(self, sql: str) -> Node | None:
        """The statement's parse tree (``parse_select`` keeps the parses of repeated texts)."""
        try:
            return parse_select(self._parser, sql)
        except QueryError:
            return None

    def exported(self, schema: pa.Schema) -> pa.Schema:
        """What DuckDB's export of a registered Arrow stream of ``schema`` looks like, on this connection."""
        key = schema.serialize().to_pybytes()
        found = self._exported.get(key)
        if found is None:
            # A relation over the empty table, not a registered view of it: the same scan and export without a
            # catalog transaction to register and another to drop (measured 2.6 against 4.3 ms a probe).
            found = self._con.from_arrow(pa.Table.from_batches([], schema)).to_arrow_table().schema
            self._exported.put(key, found)
        return found


def _shape_only(tree: Node, plan: ScanPlan, resolve: Callable[[TableRef], TableIdent]) -> None:
    """The checks that need no DuckDB binding: raises ``_NotPassThrough`` early for most statements."""
    _require(tree.get("type") == "SELECT_NODE" and "class" not in tree)
    _require(all(not value for key, value in tree.items() if key not in _SELECT_KEYS))
    _base_table(tree.get("from_table"), plan, resolve)
