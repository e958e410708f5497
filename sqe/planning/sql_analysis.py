"""What a SELECT reads, found from DuckDB's own parse tree (``json_serialize_sql``), never by binding it.

Three questions, each answered conservatively (a wrong "yes" costs only speed, never correctness):
- which Iceberg tables it names: every base-table reference with two or three name parts (CTE names and other
  single-part names are DuckDB's business);
- which columns of each table it can touch: every identifier used in a column reference, or *all* columns as
  soon as anything could depend on the full column list (``*``, ``COLUMNS(..)``, positional ``#n``, NATURAL
  joins, column-renaming aliases, whole-row references, PIVOT/DESCRIBE and other table-reference kinds);
- which simple predicates may be pushed to pyiceberg for pruning: top-level AND conjuncts of a WHERE whose FROM
  is a tree of inner joins, comparing a column that certainly belongs to that table with a constant of the
  column's own type. DuckDB re-applies every WHERE on the (masked) rows it receives, so pushdown only prunes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqe._lru import LRUCache
from sqe.errors import QueryError

# pyiceberg is imported by the functions that build predicates: finding a statement's tables must not import it
# (a statement that names none never needs pyiceberg; start-up cost).
if TYPE_CHECKING:
    import duckdb
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    from sqe.catalog.base import TableIdent

Node = dict[str, Any]
K = TypeVar("K")

_TABLE_REF_TYPES_KNOWN = {"BASE_TABLE", "JOIN", "SUBQUERY", "EMPTY", "EXPRESSION_LIST", "TABLE_FUNCTION"}
_QUERY_NODE_TYPES_KNOWN = {"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"}
_ALL_COLUMN_EXPRESSIONS = {"STAR", "POSITIONAL_REFERENCE"}
_INT_RANGE = 2**63
# DuckDB's parse of a text is a pure function of the text: a repeat query skips the round trip into DuckDB
# (about half a millisecond of a warm tiny query). Bounded by entries and by the length of a kept text.
_PARSED_ENTRIES = 256
TOO_DEEP = "the statement nests its expressions too deeply for SQE to analyse (a few hundred levels at most)"
_PARSED_MAX_SQL_CHARS = 16 << 10
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")

_COMPARISONS: dict[str, str] = {  # DuckDB comparison -> pyiceberg predicate class in pyiceberg.expressions
    "COMPARE_EQUAL": "EqualTo",
    "COMPARE_NOTEQUAL": "NotEqualTo",
    "COMPARE_LESSTHAN": "LessThan",
    "COMPARE_LESSTHANOREQUALTO": "LessThanOrEqual",
    "COMPARE_GREATERTHAN": "GreaterThan",
    "COMPARE_GREATERTHANOREQUALTO": "GreaterThanOrEqual",
}
# The comparison that holds with its operands swapped (``5 < x`` is ``x > 5``).
FLIPPED_COMPARISONS = {
    "COMPARE_EQUAL": "COMPARE_EQUAL",
    "COMPARE_NOTEQUAL": "COMPARE_NOTEQUAL",
    "COMPARE_LESSTHAN": "COMPARE_GREATERTHAN",
    "COMPARE_LESSTHANOREQUALTO": "COMPARE_GREATERTHANOREQUALTO",
    "COMPARE_GREATERTHAN": "COMPARE_LESSTHAN",
    "COMPARE_GREATERTHANOREQUALTO": "COMPARE_LESSTHANOREQUALTO",
}


@dataclass(frozen=True)
class TableRef:
    """A base-table reference as written in the SQL."""

    parts: tuple[str, ...]
    alias: str
    renames_columns: bool  # FROM t AS x(c1, c2): columns are renamed by position
    time_travel: bool  # FROM t AT (VERSION => ...)

    @property
    def qualifier(self) -> str:
        """The name column references use for this table in its FROM clause."""
        return (self.alias or self.parts[-1]).lower()

    @property
    def qualifiers(self) -> frozenset[str]:
        """Every lower-case name a column reference may put before a column of this table."""
        return frozenset({self.qualifier, self.parts[-1].lower()})


@dataclass(frozen=True)
class ColumnUsage:
    all_columns: bool
    names: frozenset[str]  # lower-case identifiers appearing in column references (every part)
    last_parts: frozenset[str]  # lower-case last parts (a whole-row reference is one of these)


def parse_select(con: duckdb.DuckDBPyConnection, sql: str) -> Node:
    """The parse tree of one SELECT-like statement; parse errors become one-line QueryErrors.

    Each call returns a fresh tree (decoded anew from DuckDB's serialized parse, kept per text once it parsed
    cleanly), so a caller may change it freely."""
    serialized = _PARSED.get(sql)
    fresh = serialized is None
    if serialized is None:
        row = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
        serialized = str(row[0]) if row else '{"error": true, "error_message": "empty statement"}'
    try:
        parsed: dict[str, Any] = json.loads(serialized)
    except RecursionError:  # DuckDB parsed it, but its tree is deeper than Python decodes
        raise QueryError(TOO_DEEP) from None
    if parsed.get("error"):
        message = str(parsed.get("error_message", "cannot parse the statement")).splitlines()[0]
        if "Only SELECT statements" in message:
            message = "this statement form cannot be analysed (only SELECT queries can read Iceberg tables)"
        raise QueryError(message)
    statements: list[Node] = parsed.get("statements", [])
    if len(statements) != 1:
        raise QueryError(f"expected one statement, got {len(statements)}")
    if fresh:
        _PARSED.put(sql, serialized)
    node: Node = statements[0]["node"]
    return node


class _ParsedTexts(LRUCache[str, str]):
    """Statement text -> DuckDB's serialized parse of it; texts longer than ``max_sql_chars`` are not kept."""

    def __init__(self, max_entries: int, max_sql_chars: int) -> None:
        super().__init__(max_entries)
        self._max_sql_chars = max_sql_chars

    def put(self, key: str, value: str) -> bool:
        return len(key) <= self._max_sql_chars and super().put(key, value)


_PARSED = _ParsedTexts(_PARSED_ENTRIES, _PARSED_MAX_SQL_CHARS)


def walk(obj: Any) -> Iterator[Node]:
    """Every dict in the tree, depth first."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def _is_table_ref(node: Node) -> bool:
    kind = node.get("type")
    return (
        isinstance(kind, str)
        and "class" not in node
        and "alias" in node
        and "query_location" in node
        and not kind.endswith("_NODE")
    )


def _is_unknown_query_node(node: Node) -> bool:
    kind = str(node.get("type", ""))
    return kind.endswith("_NODE") and kind not in _QUERY_NODE_TYPES_KNOWN


def _predicate(name: str, *args: Any) -> BooleanExpression:
    """``pyiceberg.expressions.<name>(*args)``: pyiceberg's pydantic predicates take (term, literal) positionally;
    their typed signatures do not say so."""
    from pyiceberg import expressions

    cls: type[BooleanExpression] = getattr(expressions, name)
    made: BooleanExpression = cls(*args)
    return made


def single_base_table(
    node: Node | None, ident: TableIdent, resolve: Callable[[TableRef], TableIdent]
) -> TableRef | None:
    """The reference of a FROM clause that is exactly the base table ``ident`` (no sample, time travel or column
    aliases), else None: the one-table shape the statement rewrites (pass-through, partial aggregation) accept."""
    if not isinstance(node, dict) or node.get("type") != "BASE_TABLE":
        return None
    if node.get("sample") or node.get("at_clause") is not None or node.get("column_name_alias"):
        return None
    refs = find_table_refs({"from": node})
    if len(refs) != 1 or refs[0].time_travel or resolve(refs[0]) != ident:
        return None
    return refs[0]


def referenced_column(node: Node | None, names: Sequence[str], ref: TableRef) -> int | None:
    """Which of ``names`` (a table's columns) a plain column reference to ``ref``'s table names, matched without
    case; None if ``node`` is no such reference or the name is unknown or ambiguous."""
    if not isinstance(node, dict) or node.get("class") != "COLUMN_REF":
        return None
    parts = [str(p) for p in node.get("column_names", [])]
    if len(parts) not in (1, 2) or (len(parts) == 2 and parts[0].lower() not in ref.qualifiers):
        return None
    matches = [i for i, name in enumerate(names) if name.lower() == parts[-1].lower()]
    return matches[0] if len(matches) == 1 else None


def find_table_refs(tree: Node) -> list[TableRef]:
    """Base-table references with two or three parts (namespace.table, warehouse.namespace.table)."""
    refs: list[TableRef] = []
    for node in walk(tree):
        if node.get("type") != "BASE_TABLE" or "class" in node:
            continue
        path = (node.get("qualified_name") or {}).get("path")  # keeps every part of a.b.c.d
        names = path or (node.get("catalog_name"), node.get("schema_name"), node.get("table_name"))
        parts = tuple(str(p) for p in names if p)
        if len(parts) < 2:
            continue
        refs.append(
            TableRef(
                parts=parts,
                alias=str(node.get("alias") or ""),
                renames_columns=bool(node.get("column_name_alias")),
                time_travel=node.get("at_clause") is not None,
            )
        )
    return refs


def column_usage(tree: Node) -> ColumnUsage:
    all_columns = False
    names: set[str] = set()
    last_parts: set[str] = set()
    for node in walk(tree):
        cls = node.get("class")
        if cls in _ALL_COLUMN_EXPRESSIONS:
            all_columns = True
        elif cls == "COLUMN_REF":
            parts = [str(p).lower() for p in node.get("column_names", [])]
            names.update(parts)
            if parts:
                last_parts.add(parts[-1])
        elif cls is None and _is_table_ref(node):
            kind = node["type"]
            if kind not in _TABLE_REF_TYPES_KNOWN or node.get("ref_type") == "NATURAL":
                all_columns = True
            names.update(str(c).lower() for c in node.get("using_columns", []) or [])
        elif cls is None and _is_unknown_query_node(node):
            all_columns = True
    return ColumnUsage(all_columns, frozenset(names), frozenset(last_parts))


def columns_to_read(usage: ColumnUsage, refs: list[TableRef], schema: Schema) -> list[str] | None:
    """Columns of one table (all of whose references are ``refs``) the query may use; None means all."""
    if usage.all_columns or any(r.renames_columns for r in refs):
        return None
    qualifiers = {r.qualifier for r in refs} | {r.parts[-1].lower() for r in refs}
    if qualifiers & usage.last_parts:  # SELECT t FROM ns.t: the whole row as a struct
        return None
    wanted = [f.name for f in schema.columns if f.name.lower() in usage.names]
    return wanted or [_cheapest_column(schema)]


def _cheapest_column(schema: Schema) -> str:
    """For COUNT(*)-style queries something must carry the row count; prefer a narrow fixed-width column."""
    from pyiceberg.types import BooleanType, DateType, IntegerType, LongType

    for preference in (BooleanType, DateType, IntegerType, LongType):
        for f in schema.columns:
            if isinstance(f.field_type, preference):
                return f.name
    return schema.columns[0].name


# ----------------------------------------------------------------------------------------------- pushdown


@dataclass(frozen=True)
class _Leaf:
    ref: TableRef | None  # None: a subquery, table function or VALUES list whose columns we do not know


def pushdown_predicates(
    tree: Node, resolve: Callable[[TableRef], K], schemas: Mapping[K, Schema]
) -> dict[K, list[BooleanExpression]]:
    """Safe-to-push conjuncts per table key. Callers use them only for tables referenced exactly once."""
    found: dict[K, list[BooleanExpression]] = {}
    for node in walk(tree):
        if node.get("type") != "SELECT_NODE" or "class" in node or not node.get("where_clause"):
            continue
        if node.get("sample"):  # USING SAMPLE runs before WHERE: filtering first would change the sample
            continue
        leaves = _inner_join_leaves(node.get("from_table"))
        if not leaves:
            continue
        aliases = {str(e.get("alias", "")).lower() for e in node.get("select_list", []) if e.get("alias")}
        for conjunct in _and_children(node["where_clause"]):
            for ref, expr in _predicates(conjunct, leaves, aliases, resolve, schemas):
                found.setdefault(resolve(ref), []).append(expr)
    return found


def _inner_join_leaves(table_ref: Node | None) -> list[_Leaf] | None:
    if not table_ref:
        return None
    kind = table_ref.get("type")
    if kind == "BASE_TABLE":
        refs = find_table_refs({"x": table_ref})
        sampled = bool(table_ref.get("sample"))  # TABLESAMPLE runs on the raw table, before any WHERE
        return [_Leaf(refs[0] if refs and not sampled else None)]
    if kind == "JOIN":
        if table_ref.get("join_type") != "INNER" or table_ref.get("ref_type") not in ("REGULAR", "CROSS"):
            return None  # outer/semi/anti/asof/positional/natural: a WHERE there is not a per-table filter
        left = _inner_join_leaves(table_ref.get("left"))
        right = _inner_join_leaves(table_ref.get("right"))
        return None if left is None or right is None else left + right
    if kind in ("SUBQUERY", "TABLE_FUNCTION", "EXPRESSION_LIST"):
        return [_Leaf(None)]
    return None


def _and_children(expr: Node) -> list[Node]:
    if expr.get("class") == "CONJUNCTION" and expr.get("type") == "CONJUNCTION_AND":
        return [c for child in expr.get("children", []) for c in _and_children(child)]
    return [expr]


def _predicates(
    expr: Node,
    leaves: list[_Leaf],
    aliases: set[str],
    resolve: Callable[[TableRef], K],
    schemas: Mapping[K, Schema],
) -> list[tuple[TableRef, BooleanExpression]]:
    kind = expr.get("type")

    def column(node: Node | None) -> tuple[TableRef, NestedField] | None:
        return _resolve_column(node, leaves, aliases, resolve, schemas)

    if kind in _COMPARISONS:
        left, right = expr.get("left"), expr.get("right")
        if right is not None and right.get("class") == "COLUMN_REF":
            left, right, kind = right, left, FLIPPED_COMPARISONS[kind]
        target = column(left)
        value = constant_of(right, target[1]) if target else None
        if target is None or value is None:
            return []
        return [(target[0], _predicate(_COMPARISONS[kind], target[1].name, value))]
    if kind in ("OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL"):
        children = expr.get("children", [])
        target = column(children[0]) if len(children) == 1 else None
        if target is None:
            return []
        return [(target[0], _predicate("IsNull" if kind == "OPERATOR_IS_NULL" else "NotNull", target[1].name))]
    if kind == "COMPARE_IN":
        children = expr.get("children", [])
        target = column(children[0]) if children else None
        values = [constant_of(c, target[1]) for c in children[1:]] if target else []
        if target is None or not values or any(v is None for v in values):
            return []
        return [(target[0], _predicate("In", target[1].name, set(values)))]
    if kind == "COMPARE_BETWEEN":
        target = column(expr.get("input"))
        low = constant_of(expr.get("lower"), target[1]) if target else None
        high = constant_of(expr.get("upper"), target[1]) if target else None
        if target is None or low is None or high is None:
            return []
        return [
            (target[0], _predicate("GreaterThanOrEqual", target[1].name, low)),
            (target[0], _predicate("LessThanOrEqual", target[1].name, high)),
        ]
    return []


def _resolve_column(
    node: Node | None,
    leaves: list[_Leaf],
    aliases: set[str],
    resolve: Callable[[TableRef], K],
    schemas: Mapping[K, Schema],
) -> tuple[TableRef, NestedField] | None:
    """The table and top-level field a column reference certainly binds to, or None when unsure."""
    if node is None or node.get("class") != "COLUMN_REF":
        return None
    parts = [str(p) for p in node.get("column_names", [])]
    if len(parts) == 1:
        if parts[0].lower() in aliases or any(leaf.ref is None for leaf in leaves):
            return None
        candidates = [leaf.ref for leaf in leaves if leaf.ref and _field(schemas[resolve(leaf.ref)], parts[0])]
    elif len(parts) == 2:
        candidates = [leaf.ref for leaf in leaves if leaf.ref and leaf.ref.qualifier == parts[0].lower()]
        if any(leaf.ref is None for leaf in leaves) and not candidates:
            return None
    else:
        return None
    if len(candidates) != 1 or candidates[0] is None:
        return None
    ref = candidates[0]
    f = _field(schemas[resolve(ref)], parts[-1])
    return (ref, f) if f is not None else None


def _field(schema: Schema, name: str) -> NestedField | None:
    matches = [f for f in schema.columns if f.name.lower() == name.lower()]
    if len(matches) != 1 or "." in matches[0].name:
        return None
    return matches[0]


def constant_of(node: Node | None, f: NestedField) -> Any:
    """The Python value of a constant when its SQL type is the column's own type family, else None."""
    from pyiceberg.types import BooleanType, DateType, IntegerType, LongType, StringType

    if node is None:
        return None
    if node.get("class") == "CAST" and isinstance(f.field_type, DateType):
        type_name = str(node.get("type_expr", {}).get("type_name", "")).upper()
        return constant_of(node.get("child"), f) if type_name == "DATE" and not node.get("try_cast") else None
    if node.get("class") != "CONSTANT":
        return None
    literal = node.get("literal", {})
    kind, text = literal.get("kind"), literal.get("text")
    if not isinstance(text, str):
        return None
    field_type = f.field_type
    if isinstance(field_type, (IntegerType, LongType)) and kind == "INTEGER":
        value = int(text)
        return value if -_INT_RANGE < value < _INT_RANGE else None
    if isinstance(field_type, StringType) and kind == "STRING":
        return text
    if isinstance(field_type, BooleanType) and kind == "BOOLEAN":
        return text.lower() == "true"
    if isinstance(field_type, DateType) and kind == "STRING" and _ISO_DATE.match(text):
        return text
    return None
