"""The user's WHERE as a value, when it is simple enough to run outside DuckDB with DuckDB's exact result.

A pass-through statement (``sqe.execution.passthrough``) and a partial aggregate on workers
(``sqe.distributed.coordinator.aggregate``) both run the user's WHERE themselves, on the restricted (row-filtered,
then masked) batches, instead of DuckDB running it above the scan. Only this shape qualifies (anything else, or
anything unsure, leaves the WHERE to DuckDB):

- ANDs, ORs and NOTs (nested up to ``MAX_DEPTH``) of ``column <op> constant`` (``=``, ``<>``, ``<``, ``<=``,
  ``>``, ``>=``, either side), ``IN`` lists of constants, ``BETWEEN``, ``IS [NOT] NULL`` and ``column LIKE
  'pattern'`` (so also ``NOT IN``, ``NOT BETWEEN`` and ``NOT LIKE``);
- on columns and constants of the types whose comparison pyarrow and DuckDB define the same way: integers,
  strings, booleans, dates, and doubles (``IS [NOT] NULL`` on any primitive column).

Doubles follow DuckDB, not IEEE: DuckDB orders NaN above every number (so ``x > c`` and ``x >= c`` hold for a
NaN ``x``: compiled as ``x > c OR is_nan(x)``) and its ``IN`` finds ``-0.0`` in ``(0.0)`` as ``=`` does (both sides
are normalised by adding ``0.0``, which turns ``-0.0`` into ``0.0``). A double's constant is an integer within
2^53 or a finite decimal or exponent literal, which DuckDB and Python both round to the nearest double (checked
against DuckDB on random literals); a ``float`` (32-bit) column is left to DuckDB, which rounds the constant to
32 bits its own way.

``LIKE`` is pyarrow's ``match_like`` on string columns, for a pattern without a backslash: on every other
character, ``%`` and ``_`` (one character, not one byte) the two agree (checked against DuckDB on random patterns
over non-ASCII data); a backslash escapes in pyarrow and, differently, in DuckDB, so such a pattern stays with
DuckDB, as do a pattern longer than ``MAX_LIKE_PATTERN`` characters (pyarrow's regex of it may not compile),
``ILIKE``, ``GLOB``, ``SIMILAR TO`` and ``LIKE ... ESCAPE``.

Each compiled leaf has SQL's three values: a comparison with a NULL is NULL in pyarrow as in DuckDB, and ``IN``
is compiled as NULL for a NULL input (pyarrow's ``is_in`` alone answers false, which a NOT above it would turn
into a kept row); pyarrow's AND, OR and NOT on expressions are Kleene's, as DuckDB's. So every WHERE of this
shape is NULL, false or true on exactly the rows where DuckDB's is, and the filter keeps the true ones.

A ``UserFilter`` is plain data (column names, operators, Python constants), so a coordinator can send it to a
worker (``ScanTicket.user_filter``) and the worker compiles it against its own restricted schema with the same
``expression`` the coordinator uses; a condition that does not fit that schema is ``UserFilterMismatch``.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias, cast

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.types import DateType, DoubleType

from sqe.duckdb_connection import quote_ident
from sqe.planning.sql_analysis import FLIPPED_COMPARISONS, Node, constant_of

if TYPE_CHECKING:
    from pyiceberg.types import NestedField

__all__ = [
    "MAX_CONDITIONS",
    "MAX_DEPTH",
    "MAX_LIKE_PATTERN",
    "MAX_TEXT_BYTES",
    "MAX_VALUES",
    "AllOf",
    "AnyOf",
    "Clause",
    "Condition",
    "Mask",
    "Not",
    "NotSimple",
    "Operator",
    "UserFilter",
    "UserFilterMismatch",
    "Value",
    "simple_where",
]

Rows: TypeAlias = "pa.RecordBatch | pa.Table"
Column: TypeAlias = "pa.Array | pa.ChunkedArray"
Truth: TypeAlias = "pa.BooleanArray | pa.ChunkedArray"  # per row: true, false or NULL
Mask: TypeAlias = Callable[[Rows], Truth]
Operator = Literal["eq", "ne", "lt", "le", "gt", "ge", "in", "is_null", "is_not_null", "like"]
Value = int | str | bool | datetime.date | float
COMPARISONS: tuple[Operator, ...] = ("eq", "ne", "lt", "le", "gt", "ge")
NULL_CHECKS: tuple[Operator, ...] = ("is_null", "is_not_null")
# The most a ticket's user_filter carries (a worker refuses more as an invalid ticket): a bigger WHERE is not simple.
MAX_CONDITIONS = 1000
MAX_VALUES = 100_000  # per condition (an IN list)
MAX_TEXT_BYTES = 1 << 20  # UTF-8 bytes of all string constants: the ticket stays well inside a gRPC message
MAX_DEPTH = 16  # ANDs, ORs and NOTs nested in one another (the top-level AND is depth 0)
# Characters of one LIKE pattern: pyarrow compiles it to an RE2 regex, which fails beyond RE2's size limit (some
# 60,000 characters) and, from a few thousand, may fall back to a search far slower than DuckDB's LIKE.
MAX_LIKE_PATTERN = 1000
_INT64 = 2**63

_DUCKDB_COMPARISONS: dict[str, Operator] = {
    "COMPARE_EQUAL": "eq",
    "COMPARE_NOTEQUAL": "ne",
    "COMPARE_LESSTHAN": "lt",
    "COMPARE_LESSTHANOREQUALTO": "le",
    "COMPARE_GREATERTHAN": "gt",
    "COMPARE_GREATERTHANOREQUALTO": "ge",
}
_ARROW_COMPARISONS: dict[Operator, Callable[[Column, pa.Scalar], Truth]] = {
    "eq": pc.equal,
    "ne": pc.not_equal,
    "lt": pc.less,
    "le": pc.less_equal,
    "gt": pc.greater,
    "ge": pc.greater_equal,
}


class NotSimple(Exception):
    """Raised by ``simple_where``: the WHERE is not of the simple shape (DuckDB runs it)."""


class UserFilterMismatch(ValueError):
    """A condition does not fit the restricted schema it is compiled against (names the column, never values)."""


@dataclass(frozen=True)
class Condition:
    """One conjunct: ``column <operator> values`` (one value for comparisons, one or more for ``in``, none for
    the null checks)."""

    column: str
    operator: Operator
    values: tuple[Value, ...] = ()


@dataclass(frozen=True)
class AnyOf:
    """True where any of its clauses is (SQL OR, at least two)."""

    clauses: tuple[Clause, ...]


@dataclass(frozen=True)
class AllOf:
    """True where all of its clauses are (an AND inside an OR or a NOT, at least two)."""

    clauses: tuple[Clause, ...]


@dataclass(frozen=True)
class Not:
    """True where its clause is false (SQL NOT: a NULL stays NULL)."""

    clause: Clause


Clause = Condition | AnyOf | AllOf | Not


@dataclass(frozen=True)
class UserFilter:
    """An AND of clauses over the restricted output's columns (at least one)."""

    conditions: tuple[Clause, ...]

    def leaves(self) -> Iterator[Condition]:
        """Every condition, however deep in ANDs, ORs and NOTs."""
        for clause in self.conditions:
            yield from _leaves(clause)

    def depth(self) -> int:
        return max((_depth(clause) for clause in self.conditions), default=0)

    def text_bytes(self) -> int:
        """UTF-8 bytes of the string constants (what bounds a ticket's size: the other constants are small)."""
        return sum(len(v.encode()) for c in self.leaves() for v in c.values if isinstance(v, str))

    def mask(self, schema: pa.Schema) -> Mask:
        """The filter compiled over batches (or tables) of ``schema``: a function giving each row's SQL truth
        value, which ``filter`` keeps where true. ``UserFilterMismatch`` when a condition names no column of it,
        has the wrong number of values, or a value of another type family. Compute calls on the columns, not a
        ``pc.Expression``: a batch's ``filter(expression)`` plans the expression anew per batch, measured 1.7-2.7
        times the CPU of these calls."""
        if not self.conditions:
            raise UserFilterMismatch("a user filter needs at least one condition")
        return _all_of([_compile_clause(clause, schema) for clause in self.conditions])

    def sql(self, parameters: list[Value]) -> str:
        """The filter as DuckDB SQL over quoted column names, its constants appended to ``parameters`` (bound,
        never spliced). Compile it with ``mask`` first: that check keeps each constant of its column's own
        type family, so DuckDB compares exactly as pyarrow does (integers widened, strings as bytes)."""
        return " AND ".join(_clause_sql(clause, parameters) for clause in self.conditions)


def _leaves(clause: Clause) -> Iterator[Condition]:
    for part in _parts(clause):
        yield from _leaves(part)
    if isinstance(clause, Condition):
        yield clause


def _parts(clause: Clause) -> tuple[Clause, ...]:
    """The clauses directly inside ``clause`` (none for a condition)."""
    if isinstance(clause, Condition):
        return ()
    return (clause.clause,) if isinstance(clause, Not) else clause.clauses


def _depth(clause: Clause) -> int:
    """How deep ANDs, ORs and NOTs nest in ``clause`` (0 for a condition)."""
    return 0 if isinstance(clause, Condition) else 1 + max((_depth(c) for c in _parts(clause)), default=0)


def _compile_clause(clause: Clause, schema: pa.Schema) -> Mask:
    if isinstance(clause, Condition):
        return _compile(clause, schema)
    if isinstance(clause, Not):
        negated = _compile_clause(clause.clause, schema)
        return lambda rows: pc.invert(negated(rows))  # Kleene's NOT: NULL stays NULL
    if len(clause.clauses) < 2:
        raise UserFilterMismatch("user filter: an AND or OR needs at least two clauses")
    parts = [_compile_clause(part, schema) for part in clause.clauses]
    return _all_of(parts) if isinstance(clause, AllOf) else _any_of(parts)


# and_kleene / or_kleene: DuckDB's three-valued AND and OR
def _all_of(parts: Sequence[Mask]) -> Mask:
    return lambda rows: functools.reduce(pc.and_kleene, [part(rows) for part in parts])


def _any_of(parts: Sequence[Mask]) -> Mask:
    return lambda rows: functools.reduce(pc.or_kleene, [part(rows) for part in parts])


_NULL_BOOLEAN = pa.scalar(None, pa.bool_())
_SQL_COMPARISONS: dict[Operator, str] = {"eq": "=", "ne": "<>", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _clause_sql(clause: Clause, parameters: list[Value]) -> str:
    if isinstance(clause, Not):
        return f"NOT ({_clause_sql(clause.clause, parameters)})"
    if not isinstance(clause, Condition):  # parenthesised: AND binds tighter than OR, be explicit anyway
        junction = " OR " if isinstance(clause, AnyOf) else " AND "
        return "(" + junction.join(_clause_sql(part, parameters) for part in clause.clauses) + ")"
    column = quote_ident(clause.column)
    if clause.operator == "is_null":
        return f"{column} IS NULL"
    if clause.operator == "is_not_null":
        return f"{column} IS NOT NULL"
    parameters.extend(clause.values)
    if clause.operator == "in":
        return f"{column} IN ({', '.join('?' for _ in clause.values)})"
    if clause.operator == "like":
        return f"{column} LIKE ?"
    return f"{column} {_SQL_COMPARISONS[clause.operator]} ?"


def filtering(
    predicate: Mask, first: Callable[[pa.RecordBatch], pa.RecordBatch] | None = None
) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    """A batch step keeping the rows where ``predicate`` holds, after ``first`` (the restrictions) when given.
    ``predicate`` reads columns by position: restricted batches follow the schema it was compiled for, in column
    order, whatever a file's spelling of the names, string width or dictionary encoding."""

    def keep(batch: pa.RecordBatch) -> pa.RecordBatch:
        if first is not None:
            batch = first(batch)
        return batch.filter(predicate(batch))

    return keep


def _compile(condition: Condition, schema: pa.Schema) -> Mask:
    index = schema.get_field_index(condition.column)
    if index < 0:
        raise UserFilterMismatch(f"user filter: {condition.column[:100]!r} is not a column of the restricted output")
    arrow_type = schema.field(index).type
    operator, values = condition.operator, condition.values
    if operator in NULL_CHECKS:
        _arity(condition, len(values) == 0, "no value")
        if pa.types.is_nested(arrow_type):
            raise UserFilterMismatch(f"user filter: {condition.column[:100]!r} is nested")
        check = pc.is_null if operator == "is_null" else pc.is_valid
        return lambda rows: check(_values(rows, index))
    if operator == "in":
        _arity(condition, len(values) >= 1, "one or more values")
        return _compile_in(condition, index, arrow_type)
    if operator == "like":
        _arity(condition, len(values) == 1, "one value")
        pattern = _like_pattern(condition.column, values[0], arrow_type)
        return lambda rows: pc.match_like(_values(rows, index), pattern)
    if operator in _ARROW_COMPARISONS:
        _arity(condition, len(values) == 1, "one value")
        compare, constant = _ARROW_COMPARISONS[operator], _scalar(condition.column, values[0], arrow_type)
        if pa.types.is_float64(arrow_type) and operator in ("gt", "ge"):  # DuckDB: NaN is above every number
            return lambda rows: pc.or_kleene(compare(_values(rows, index), constant), pc.is_nan(_values(rows, index)))
        return lambda rows: compare(_values(rows, index), constant)
    raise UserFilterMismatch(f"user filter: unknown operator {str(operator)[:20]!r}")


def _values(rows: Rows, index: int) -> Column:
    """Column ``index`` of ``rows``, dictionary-decoded: a file's strings may come dictionary-encoded (pyiceberg
    keeps a Parquet dictionary page's encoding), and some kernels, ``match_like`` and ``is_nan`` among them, take
    no dictionary. Filtering before the batch is conformed keeps that conversion to the kept rows."""
    column = rows.column(index)
    return pc.cast(column, column.type.value_type) if pa.types.is_dictionary(column.type) else column


def _compile_in(condition: Condition, index: int, arrow_type: pa.DataType) -> Mask:
    values = condition.values
    for value in values:
        _scalar(condition.column, value, arrow_type)  # the type family check
    normalised = pa.types.is_float64(arrow_type)  # -0.0 + 0.0 is 0.0: IN finds -0.0 where = does, as in DuckDB
    if normalised:
        values = tuple(cast("float", v) + 0.0 for v in values)
    try:
        value_set = pa.array(list(values), type=arrow_type)
    except (pa.ArrowInvalid, OverflowError):  # a constant outside the column's range
        raise UserFilterMismatch(f"user filter: a value is out of range for {condition.column[:100]!r}") from None

    def contained(rows: Rows) -> Truth:
        column = _values(rows, index)
        found = pc.is_in(pc.add(column, 0.0) if normalised else column, value_set=value_set)
        # SQL's NULL for a NULL input (is_in alone says false; the constants are never NULL)
        return pc.if_else(pc.is_valid(column), found, _NULL_BOOLEAN)

    return contained


def _like_pattern(column: str, value: Value, arrow_type: pa.DataType) -> str:
    """A LIKE pattern pyarrow matches as DuckDB does: a string without a backslash, on a string column, of at most
    ``MAX_LIKE_PATTERN`` characters."""
    string_column = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
    if not string_column or type(value) is not str:
        raise UserFilterMismatch(f"user filter: LIKE needs a string column and pattern ({column[:100]!r})")
    trouble = _like_trouble(value)
    if trouble is not None:
        raise UserFilterMismatch(f"user filter: a LIKE pattern on {column[:100]!r} {trouble}")
    return value


def _like_trouble(pattern: str) -> str | None:
    """Why pyarrow would not match ``pattern`` as DuckDB does (None: it would): a backslash escapes in pyarrow and,
    differently, in DuckDB; a longer pattern's RE2 regex may not compile, or crawl."""
    if "\\" in pattern:
        return "holds a backslash"
    if len(pattern) > MAX_LIKE_PATTERN:
        return f"is longer than {MAX_LIKE_PATTERN} characters"
    return None


def _arity(condition: Condition, holds: bool, needs: str) -> None:
    if not holds:
        raise UserFilterMismatch(f"user filter: {condition.operator} on {condition.column[:100]!r} needs {needs}")


def _scalar(column: str, value: Value, arrow_type: pa.DataType) -> pa.Scalar:
    """The constant as an Arrow scalar of its column's family (integers as int64, like DuckDB's comparison of a
    narrower column with a wider constant); any other pairing is a mismatch."""
    if pa.types.is_integer(arrow_type) and type(value) is int and -_INT64 <= value < _INT64:
        return pa.scalar(value, pa.int64())
    if (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)) and type(value) is str:
        return pa.scalar(value, arrow_type)
    if pa.types.is_boolean(arrow_type) and type(value) is bool:
        return pa.scalar(value, arrow_type)
    if pa.types.is_date32(arrow_type) and type(value) is datetime.date:
        return pa.scalar(value, arrow_type)
    if pa.types.is_float64(arrow_type) and type(value) is float and math.isfinite(value):
        return pa.scalar(value, arrow_type)
    raise UserFilterMismatch(f"user filter: a value does not fit the type {arrow_type} of {column[:100]!r}")


# ---------------------------------------------------------------------------------------- from the parse tree


def simple_where(
    node: Node | None,
    column_of: Callable[[Node | None], str | None],
    field_of: Callable[[str], NestedField],
    schema: pa.Schema | None = None,
) -> UserFilter | None:
    """The WHERE clause ``node`` of DuckDB's parse tree as a ``UserFilter`` (None: no WHERE); raises
    ``NotSimple`` for any other shape. ``column_of``: the restricted output column a node references (None: not
    a plain column reference); ``field_of``: that column's Iceberg field (constants are typed by it). A WHERE
    larger than a ticket carries (``MAX_CONDITIONS``, ``MAX_VALUES``, ``MAX_TEXT_BYTES``) is not simple either,
    nor, given the restricted ``schema``, one that does not compile over it (a constant out of its column's range)."""
    if node is None:
        return None
    conditions = [c for child in _and_children(node) for c in _conditions(child, column_of, field_of)]
    where = UserFilter(tuple(conditions))
    leaves = list(where.leaves())
    if len(leaves) > MAX_CONDITIONS or any(len(c.values) > MAX_VALUES for c in leaves):
        raise NotSimple
    if where.depth() > MAX_DEPTH or where.text_bytes() > MAX_TEXT_BYTES:
        raise NotSimple
    if schema is not None:
        try:
            where.mask(schema)
        except UserFilterMismatch:
            raise NotSimple from None
    return where


def _and_children(node: Node) -> Iterator[Node]:
    yield from _junction_children(node, "CONJUNCTION_AND")


def _junction_children(node: Node, junction: str, depth: int = 0) -> Iterator[Node]:
    """The operands of nested same-kind junctions (``a AND (b AND c)``: a, b, c), or the node itself."""
    if depth > MAX_DEPTH:
        raise NotSimple  # nested deeper than a ticket carries (and never recursed without bound)
    if node.get("class") == "CONJUNCTION" and node.get("type") == junction:
        for child in node.get("children", []):
            yield from _junction_children(child, junction, depth + 1)
    else:
        yield node


def _conditions(
    node: Node,
    column_of: Callable[[Node | None], str | None],
    field_of: Callable[[str], NestedField],
    depth: int = 0,
) -> list[Clause]:
    def column(child: Node | None) -> str:
        name = column_of(child)
        if name is None:
            raise NotSimple
        return name

    def constant(child: Node | None, name: str) -> Value:
        return _constant(child, field_of(name))

    kind = str(node.get("type"))
    if kind == "OPERATOR_NOT":  # NOT x, x NOT IN (...), x NOT BETWEEN a AND b
        children = node.get("children", [])
        if len(children) != 1 or depth >= MAX_DEPTH:  # depth: as for OR below
            raise NotSimple
        return [Not(_conditions_of_and(children[0], column_of, field_of, depth + 1))]
    if node.get("class") == "CONJUNCTION" and kind == "CONJUNCTION_OR":
        if depth >= MAX_DEPTH:  # bounds the recursion; the exact limit is simple_where's where.depth() check
            raise NotSimple
        options = [_conditions_of_and(child, column_of, field_of, depth + 1) for child in _or_children(node)]
        return [AnyOf(tuple(options))]
    if kind in _DUCKDB_COMPARISONS:
        left, right = node.get("left"), node.get("right")
        if isinstance(right, dict) and right.get("class") == "COLUMN_REF":
            left, right, kind = right, left, FLIPPED_COMPARISONS[kind]
        name = column(left)
        return [Condition(name, _DUCKDB_COMPARISONS[kind], (constant(right, name),))]
    if kind in ("OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL"):
        children = node.get("children", [])
        if len(children) != 1:
            raise NotSimple
        return [Condition(column(children[0]), "is_null" if kind == "OPERATOR_IS_NULL" else "is_not_null")]
    if kind == "COMPARE_IN":
        children = node.get("children", [])
        if len(children) < 2:
            raise NotSimple
        name = column(children[0])
        return [Condition(name, "in", tuple(constant(child, name) for child in children[1:]))]
    if node.get("class") == "FUNCTION" and node.get("function_name") in _LIKES:
        name, pattern = _like_operands(node, column)
        value = constant(pattern, name)
        if not isinstance(value, str) or _like_trouble(value) is not None:
            raise NotSimple
        condition = Condition(name, "like", (value,))
        return [condition] if node.get("function_name") == "~~" else [Not(condition)]
    if kind == "COMPARE_BETWEEN":
        name = column(node.get("input"))
        low, high = constant(node.get("lower"), name), constant(node.get("upper"), name)
        return [Condition(name, "ge", (low,)), Condition(name, "le", (high,))]
    raise NotSimple


_LIKES = ("~~", "!~~")  # LIKE, NOT LIKE (ILIKE is ~~*, GLOB ~~~, LIKE ... ESCAPE the function like_escape)


def _like_operands(node: Node, column: Callable[[Node | None], str]) -> tuple[str, Node | None]:
    """``column LIKE constant``'s column name and constant node; any other form is not simple."""
    arguments = node.get("arguments", [])
    builtin = node.get("is_operator") is True and not node.get("schema") and not node.get("catalog")
    if not builtin or len(arguments) != 2 or node.get("filter") is not None or node.get("distinct"):
        raise NotSimple
    return column(arguments[0].get("expression")), arguments[1].get("expression")


def _or_children(node: Node) -> Iterator[Node]:
    yield from _junction_children(node, "CONJUNCTION_OR")


def _conditions_of_and(
    node: Node, column_of: Callable[[Node | None], str | None], field_of: Callable[[str], NestedField], depth: int
) -> Clause:
    """One alternative of an OR, or what a NOT negates: a clause, or the AND of several (``a AND b``, a
    BETWEEN's two bounds)."""
    parts = [c for child in _and_children(node) for c in _conditions(child, column_of, field_of, depth)]
    return parts[0] if len(parts) == 1 else AllOf(tuple(parts))


def _constant(node: Node | None, field: NestedField) -> Value:
    if isinstance(field.field_type, DoubleType):
        return _double_constant(node)
    value = constant_of(node, field)
    if value is None:
        raise NotSimple
    if isinstance(field.field_type, DateType):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:  # shaped like a date but none (2024-02-30): DuckDB runs it and says so
            raise NotSimple from None
    return value  # type: ignore[no-any-return]


_DECIMAL_OR_EXPONENT = re.compile(r"-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?")


def _double_constant(node: Node | None) -> float:
    """A double column's constant: an integer literal within 2^53 (exact as a double) or a decimal or exponent
    literal whose nearest double is finite; DuckDB and Python both round such a literal to the nearest double."""
    if node is None or node.get("class") != "CONSTANT":
        raise NotSimple
    literal = node.get("literal", {})
    kind, text = literal.get("kind"), literal.get("text")
    if not isinstance(text, str) or not _DECIMAL_OR_EXPONENT.fullmatch(text):
        raise NotSimple
    if kind == "INTEGER" and abs(int(text)) <= 2**53:
        return float(int(text))
    if kind == "NUMERIC" and math.isfinite(value := float(text)):
        return value
    raise NotSimple
