"""Partial aggregation on the workers: which statements qualify, and the final query over the partial rows.

For an aggregate the workers would ship every restricted row and DuckDB on the coordinator would aggregate
them. A statement of exactly this shape (anything else, or anything unsure, runs as before) is instead
aggregated per fragment on the workers (``ScanTicket.partial_aggregate``) and merged here:

- one SELECT over one Iceberg base table: no CTE, join, subquery, view, time travel, sample, DISTINCT,
  HAVING, QUALIFY, window, ORDER BY, LIMIT or OFFSET;
- no WHERE, or a simple one (``sqe.planning.user_filter``: ANDs, ORs and NOTs of comparisons of columns with
  constants of their own type family, ``IN``, ``BETWEEN``, ``IS [NOT] NULL``, ``LIKE``; the pass-through rule);
- a GROUP BY of plain column references (or none), never a float column (a group's ``-0.0``/``0.0`` spelling
  could differ from a local run), no ROLLUP/CUBE/GROUPING SETS/GROUP BY ALL, no name that is also a select alias;
- a select list of group-by columns and ``count(*)``, ``count(col)``, ``sum(col)``, ``min(col)``, ``max(col)`` on
  plain column references of primitive types (aliases fine; no DISTINCT, FILTER or ORDER BY inside).

The order is DuckDB's: the workers run the row filter on raw values, then the masks, then the user's WHERE on
the masked values (``ScanTicket.user_filter``), and aggregate the rows it keeps. Any other WHERE leaves the
statement to DuckDB, which would apply it above the scan.

The final query sums counts and sums, takes the min of mins and the max of maxes, grouped by the same columns,
and casts every column to exactly the name and type DuckDB bound for the original statement (so ``sum(BIGINT)``
stays HUGEINT, and ``count(*)`` over no rows is 0, not NULL).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from sqe.distributed.coordinator.job import PartialAggregatePlan
from sqe.distributed.protocol.partial import Function, PartialAggregate
from sqe.distributed.protocol.partial import partial_types as partial_schema_of
from sqe.duckdb_connection import quote_ident
from sqe.planning.sql_analysis import Node, referenced_column, single_base_table
from sqe.planning.user_filter import NotSimple, UserFilter, simple_where

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from sqe.catalog.base import TableIdent
    from sqe.planning.sql_analysis import TableRef

PATH_PARTIAL_AGGREGATE = "partial-aggregate"

_SELECT_KEYS = {
    "type",
    "where_clause",
    "modifiers",
    "cte_map",
    "select_list",
    "from_table",
    "group_expressions",
    "group_sets",
    "aggregate_handling",
}
_COLUMN_KEYS = {"class", "type", "alias", "query_location", "query_location_length", "column_names"}
_FUNCTION_KEYS = {
    "class",
    "type",
    "alias",
    "query_location",
    "query_location_length",
    "function_name",
    "schema",
    "catalog",
    "filter",
    "order_bys",
    "distinct",
    "is_operator",
    "export_state",
    "arguments",
    "qualified_name",
    "is_legacy_function_call",
}
_FUNCTIONS: dict[str, Function] = {
    "count_star": "count_star",
    "count": "count",
    "sum": "sum",
    "min": "min",
    "max": "max",
}


class _NotEligible(Exception):
    """Raised inside recognition: the statement runs as before."""


def _require(condition: object) -> None:
    if not condition:
        raise _NotEligible


@dataclass(frozen=True)
class AggregateShape:
    """A recognised statement: the partial spec and, per output column, where it comes from."""

    spec: PartialAggregate
    outputs: tuple[tuple[str, int], ...]  # ("g", group index) or ("a", aggregate index), in select-list order
    where: UserFilter | None = None  # the rows aggregated (the workers run it after the restrictions)

    def final_sql(self, source: str, partial_types: Sequence[str], names: Sequence[str], types: Sequence[str]) -> str:
        """The coordinator's merge of the partial rows in ``source`` (a quoted relation name). ``partial_types``:
        DuckDB's types of the partial columns (g.., a..); ``names``/``types``: the original statement's binding."""
        groups = len(self.spec.group_by)
        columns = []
        for (kind, index), name, out_type in zip(self.outputs, names, types, strict=True):
            if kind == "g":
                value = f"CAST(g{index} AS {partial_types[index]})"
            else:
                function = self.spec.aggregates[index][0]
                value = _merge(function, f"CAST(a{index} AS {partial_types[groups + index]})")
            columns.append(f"CAST({value} AS {out_type}) AS {quote_ident(name)}")
        text = f"SELECT {', '.join(columns)} FROM {source}"
        if groups:
            text += " GROUP BY " + ", ".join(f"g{i}" for i in range(groups))
        return text

    def describe(self) -> str:
        grouped = f"grouped by {', '.join(self.spec.group_by)}" if self.spec.group_by else "one row per fragment"
        rows = "restricted rows" if self.where is None else "restricted rows the WHERE keeps"
        return f"each worker aggregates its fragments' {rows} ({grouped}); the coordinator merges them"


def _merge(function: Function, partial: str) -> str:
    if function in ("count_star", "count"):
        return f"coalesce(sum({partial}), 0)"  # no partial rows at all (no files) is a count of 0
    return f"{function}({partial})"


def recognise(tree: Node, scan: ScanShape, resolve: Callable[[TableRef], TableIdent]) -> AggregateShape | None:
    """The partial-aggregate form of a parsed statement whose only scan is ``scan``, or None when it must run as
    before."""
    try:
        return _recognise(tree, scan, resolve)
    except _NotEligible:
        return None


@dataclass(frozen=True)
class ScanShape:
    """The statement's one scan: its table, the restricted Arrow schema and the Iceberg schema it reads."""

    ident: TableIdent
    schema: pa.Schema
    read_schema: Schema


def _recognise(tree: Node, scan: ScanShape, resolve: Callable[[TableRef], TableIdent]) -> AggregateShape:
    schema = scan.schema
    _require(tree.get("type") == "SELECT_NODE" and "class" not in tree)
    _require(all(not value for key, value in tree.items() if key not in _SELECT_KEYS))
    _require(not tree.get("modifiers") and not (tree.get("cte_map") or {}).get("map"))
    _require(tree.get("aggregate_handling") == "STANDARD_HANDLING")
    columns = _Columns(schema, _base_table(tree.get("from_table"), scan.ident, resolve))
    where = _where(tree.get("where_clause"), columns, scan)
    group_nodes = tree.get("group_expressions") or []
    expected_sets = [list(range(len(group_nodes)))] if group_nodes else []
    _require(tree.get("group_sets") == expected_sets)
    items = tree.get("select_list") or []
    aliases = {str(item.get("alias") or "").lower() for item in items} - {""}
    group_by: list[str] = []
    for node in group_nodes:
        _require(_last_part(node) not in aliases)  # GROUP BY may name a select alias: never guess which
        name = columns.name(node)
        _require(name not in group_by and not pa.types.is_floating(schema.field(name).type))
        group_by.append(name)
    aggregates: list[tuple[Function, str]] = []
    outputs: list[tuple[str, int]] = []
    for item in items:
        if item.get("class") == "COLUMN_REF":
            name = columns.name(item)
            _require(name in group_by)
            outputs.append(("g", group_by.index(name)))
        else:
            aggregates.append(_aggregate(item, columns))
            outputs.append(("a", len(aggregates) - 1))
    _require(outputs and (aggregates or group_by))
    return AggregateShape(PartialAggregate(tuple(group_by), tuple(aggregates)), tuple(outputs), where)


def _where(node: Node | None, columns: _Columns, scan: ScanShape) -> UserFilter | None:
    """The simple WHERE, checked to compile over the restricted schema; any other WHERE is not eligible."""

    def column_of(child: Node | None) -> str | None:
        try:
            return columns.name(child)
        except _NotEligible:
            return None

    try:
        return simple_where(node, column_of, scan.read_schema.find_field, scan.schema)
    except NotSimple:
        raise _NotEligible from None


def _base_table(node: Node | None, ident: TableIdent, resolve: Callable[[TableRef], TableIdent]) -> TableRef:
    ref = single_base_table(node, ident, resolve)
    _require(ref is not None)
    assert ref is not None
    return ref


def _last_part(node: Node) -> str:
    parts = node.get("column_names") or [""]
    return str(parts[-1]).lower()


def _aggregate(node: Node, columns: _Columns) -> tuple[Function, str]:
    _require(node.get("class") == "FUNCTION" and node.get("type") == "FUNCTION")
    _require(all(not value for key, value in node.items() if key not in _FUNCTION_KEYS))
    function = _FUNCTIONS.get(str(node.get("function_name")))
    _require(function is not None and not node.get("schema") and not node.get("catalog"))
    assert function is not None
    _require((node.get("qualified_name") or {}).get("path") == [node.get("function_name")])
    _require(node.get("filter") is None and not (node.get("order_bys") or {}).get("orders"))
    _require(not node.get("distinct") and not node.get("is_operator") and not node.get("export_state"))
    arguments = node.get("arguments") or []
    if function == "count_star":
        _require(not arguments)
        return function, ""
    _require(len(arguments) == 1 and not arguments[0].get("name"))
    name = columns.name(arguments[0].get("expression"))
    arrow_type = columns.type(name)
    if function == "sum":
        _require(pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type))
    return function, name


def _primitive(arrow_type: pa.DataType) -> bool:
    """The column types partial rows carry through Arrow and back into DuckDB unchanged."""
    checks = (
        pa.types.is_integer,
        pa.types.is_floating,
        pa.types.is_decimal,
        pa.types.is_string,
        pa.types.is_large_string,
        pa.types.is_boolean,
        pa.types.is_date,
        pa.types.is_timestamp,
    )
    return any(check(arrow_type) for check in checks)


class _Columns:
    """Column references of the statement, resolved to columns of the restricted output (exact spelling)."""

    def __init__(self, schema: pa.Schema, ref: TableRef) -> None:
        self._schema = schema
        self._ref = ref

    def name(self, node: Node | None) -> str:
        _require(isinstance(node, dict) and all(not v for k, v in node.items() if k not in _COLUMN_KEYS))
        found = referenced_column(node, self._schema.names, self._ref)
        _require(found is not None and _primitive(self._schema.field(found).type))
        assert found is not None
        return str(self._schema.field(found).name)

    def type(self, name: str) -> pa.DataType:
        return self._schema.field(name).type


@dataclass(frozen=True)
class PreparedAggregate:
    """A recognised statement with everything the final query needs: the partial schema (computed before any
    worker answers) and the original statement's output names and DuckDB types."""

    shape: AggregateShape
    partial: PartialAggregatePlan
    partial_types: tuple[str, ...]
    names: tuple[str, ...]
    types: tuple[str, ...]

    def final_sql(self, source: str) -> str:
        return self.shape.final_sql(source, self.partial_types, self.names, self.types)

    def describe(self) -> str:
        return self.shape.describe()


def prepare(
    tree: Node,
    scan: ScanShape,
    resolve: Callable[[TableRef], TableIdent],
    binding: Callable[[], tuple[Sequence[str], Sequence[object]]],
) -> PreparedAggregate | None:
    """The statement prepared for partial aggregation over ``scan``, or None. ``binding``: DuckDB's output names
    and types of the original statement (asked only when the shape qualifies)."""
    schema = scan.schema
    shape = recognise(tree, scan, resolve)
    if shape is None:
        return None
    names, types = binding()
    if len(names) != len(shape.outputs):
        return None
    try:
        partial_schema, partial_types = partial_schema_of(shape.spec, schema)
    except duckdb.Error:  # DuckDB cannot aggregate these columns this way: the statement runs as before
        return None
    return PreparedAggregate(
        shape,
        PartialAggregatePlan(shape.spec, partial_schema, shape.where),
        tuple(partial_types),
        tuple(names),
        tuple(str(t) for t in types),
    )
