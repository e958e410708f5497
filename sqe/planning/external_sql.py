"""SQL forms for data outside the Iceberg catalog: file table function calls, external-table names, and the
statements SQE runs itself (``CREATE/DROP/SHOW EXTERNAL TABLE(S)``, ``OPTIMIZE``).

Calls and names are found in DuckDB's own parse tree (``json_serialize_sql`` gives each node's byte offset and
length), so quoting, comments and nesting are DuckDB's rules; argument values are folded by the table-less
parser connection (``SELECT <expr>``), never evaluated by hand. The statements DuckDB cannot parse at all are
read with its tokenizer. DuckDB reports UTF-8 byte offsets; they are turned into character offsets here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from sqe._text import first_line
from sqe.duckdb_connection import fold_row
from sqe.errors import QueryError
from sqe.planning.sql_analysis import Node, walk
from sqe.planning.tokens import sql_tokens

# DuckDB's names for the three file functions (and their aliases) -> the format SQE reads.
FILE_FUNCTIONS: dict[str, str] = {
    "read_parquet": "parquet",
    "parquet_scan": "parquet",
    "read_csv": "csv",
    "read_csv_auto": "csv",
    "read_json": "json",
    "read_json_auto": "json",
    "read_ndjson": "json",
    "read_ndjson_auto": "json",
}
REWRITTEN_PREFIX = "__sqe_ext_"  # names SQE registers; user SQL may not use them


@dataclass(frozen=True)
class FileCall:
    """``read_parquet(...)`` as written: where it is, and its folded arguments."""

    function: str
    start: int  # character offsets of the call (without its alias) in the statement
    end: int
    has_alias: bool
    paths: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NamedRef:
    """A two- or three-part base-table name as written (a candidate external table)."""

    parts: tuple[str, ...]
    start: int
    end: int
    alias: str


@dataclass(frozen=True)
class ColumnDef:
    name: str
    type: pa.DataType
    type_text: str


@dataclass(frozen=True)
class CreateExternal:
    parts: tuple[str, ...]
    columns: tuple[ColumnDef, ...]
    partitions: tuple[ColumnDef, ...]
    file_format: str  # parquet | csv | json
    location: str
    options: dict[str, str] = field(repr=False)  # WITH (...): may hold secrets, never shown
    if_not_exists: bool = False


@dataclass(frozen=True)
class DropExternal:
    parts: tuple[str, ...]
    if_exists: bool = False


@dataclass(frozen=True)
class ShowExternal:
    pass


@dataclass(frozen=True)
class Optimize:
    parts: tuple[str, ...]
    where: str | None  # the predicate text
    options: dict[str, Any]


ExternalStatement = CreateExternal | DropExternal | ShowExternal | Optimize


# ------------------------------------------------------------------------------------- calls and names


def char_tokens(text: str) -> list[tuple[int, str]]:
    """DuckDB's tokens of ``text`` as (character offset, kind), comments left out."""
    return [(start, kind) for start, kind in sql_tokens(text) if kind != "comment"]


def _nesting(text: str) -> Iterator[tuple[int, str, int]]:
    """(offset, first character, parenthesis depth after it) of each token, quoted text and comments skipped."""
    depth = 0
    for offset, _kind in char_tokens(text):
        char = text[offset]
        depth += char == "("
        depth -= char == ")"
        yield offset, char, depth


def _char_offset(text: str, byte_offset: int) -> int:
    return len(text.encode()[:byte_offset].decode(errors="ignore"))


def find_file_calls(con: duckdb.DuckDBPyConnection, tree: Node, text: str) -> list[FileCall]:
    calls: list[FileCall] = []
    for node in walk(tree):
        if node.get("type") != "TABLE_FUNCTION" or "class" in node:
            continue
        function = node.get("function") or {}
        name = str(function.get("function_name", "")).lower()
        if name not in FILE_FUNCTIONS:
            continue
        start = _char_offset(text, int(node["query_location"]))
        end = _call_end(text, start)
        calls.append(_file_call(con, name, function, start, end, bool(node.get("alias")), text))
    return sorted(calls, key=lambda c: c.start)


def _file_call(
    con: duckdb.DuckDBPyConnection, name: str, function: Node, start: int, end: int, alias: bool, text: str
) -> FileCall:
    arguments = function.get("arguments") or function.get("children") or []
    positional: list[Any] = []
    options: dict[str, Any] = {}
    for argument in arguments:
        expr = argument.get("expression", argument) if isinstance(argument, dict) else argument
        if expr.get("type") == "COMPARE_EQUAL" and (expr.get("left") or {}).get("class") == "COLUMN_REF":
            key = ".".join(str(p) for p in expr["left"].get("column_names", [])).lower()
            options[key] = fold(con, _span(expr["right"], text), name)
        else:
            positional.append(fold(con, _span(expr, text), name))
    if len(positional) != 1:
        raise QueryError(f"{name} takes one path or a list of paths, then named options")
    paths = positional[0]
    listed = paths if isinstance(paths, list) else [paths]
    if not listed or not all(isinstance(p, str) and p for p in listed):
        raise QueryError(f"{name}: the path must be a string or a list of strings")
    return FileCall(name, start, end, alias, tuple(listed), options)


def _span(expr: Node, text: str) -> str:
    encoded = text.encode()
    start, length = int(expr["query_location"]), int(expr.get("query_location_length", 0))
    if length <= 0 or start >= len(encoded):
        raise QueryError("cannot locate a file table function argument in the statement")
    return encoded[start : start + length].decode()


def fold(con: duckdb.DuckDBPyConnection, expression: str, what: str) -> Any:
    """A constant expression's value, computed by the locked-down, table-less parser connection."""
    try:
        row = fold_row(con, expression, what)
    except duckdb.Error as exc:
        raise QueryError(f"{what}: arguments must be constants: {first_line(exc)}") from None
    return row[0] if row else None


def _call_end(text: str, start: int) -> int:
    """The offset just after the call's closing parenthesis (DuckDB's tokenizer skips quoted text)."""
    for offset, char, depth in _nesting(text[start:]):
        if char == ")" and depth == 0:
            return start + offset + 1
    raise QueryError("unbalanced parentheses in a file table function call")


def find_named_refs(tree: Node, text: str) -> list[NamedRef]:
    refs: list[NamedRef] = []
    for node in walk(tree):
        if node.get("type") != "BASE_TABLE" or "class" in node:
            continue
        path = (node.get("qualified_name") or {}).get("path")
        names = path or (node.get("catalog_name"), node.get("schema_name"), node.get("table_name"))
        parts = tuple(str(p) for p in names if p)
        if len(parts) not in (2, 3):
            continue
        start = _char_offset(text, int(node["query_location"]))
        end = _name_end(text, start, len(parts))
        refs.append(NamedRef(parts, start, end, str(node.get("alias") or "")))
    return sorted(refs, key=lambda r: r.start)


def _name_end(text: str, start: int, parts: int) -> int:
    piece = text[start:]
    tokens = char_tokens(piece)
    needed = 2 * parts - 1  # name . name . name
    if len(tokens) < needed:
        raise QueryError("cannot locate a table name in the statement")
    stop = tokens[needed][0] if len(tokens) > needed else len(piece)
    return start + len(piece[:stop].rstrip())


def splice(text: str, replacements: list[tuple[int, int, str]]) -> str:
    """``text`` with each (start, end) span replaced; spans must not overlap."""
    out = text
    for start, end, new in sorted(replacements, reverse=True):
        out = out[:start] + new + out[end:]
    return out


# --------------------------------------------------------------------------------------------- statements


_WORD = re.compile(r"\s+")


def parse_external_statement(con: duckdb.DuckDBPyConnection, sql: str) -> ExternalStatement | None:
    """One of SQE's own statements, or None for anything else (then DuckDB's classification applies)."""
    text = sql.strip().rstrip(";").strip()
    head = _WORD.split(text[:40].upper(), maxsplit=3)
    if head[:3] == ["CREATE", "EXTERNAL", "TABLE"]:
        return _create_external(con, text)
    if head[:3] == ["DROP", "EXTERNAL", "TABLE"]:
        return _drop_external(text)
    if head[:3] == ["SHOW", "EXTERNAL", "TABLES"] and len(head) == 3:
        return ShowExternal()
    if head[:1] == ["OPTIMIZE"]:
        return _optimize(con, text)
    return None


@dataclass
class _Cursor:
    text: str
    tokens: list[tuple[int, str]]  # (char offset, token text)
    i: int = 0

    @classmethod
    def of(cls, text: str) -> _Cursor:
        raw = char_tokens(text)
        tokens: list[tuple[int, str]] = []
        for index, (start, _kind) in enumerate(raw):
            stop = raw[index + 1][0] if index + 1 < len(raw) else len(text)
            tokens.append((start, text[start:stop].strip()))
        return cls(text, tokens)

    def peek(self, ahead: int = 0) -> str:
        index = self.i + ahead
        return self.tokens[index][1] if index < len(self.tokens) else ""

    def word(self) -> str:
        return self.peek().upper()

    def take(self) -> str:
        if self.i >= len(self.tokens):
            raise QueryError("unexpected end of statement")
        token = self.tokens[self.i][1]
        self.i += 1
        return token

    def expect(self, *words: str) -> None:
        for word in words:
            found = self.take()
            if found.upper() != word:
                raise QueryError(f"expected {word}, found {found!r}")

    def accept(self, *words: str) -> bool:
        if [self.peek(k).upper() for k in range(len(words))] == list(words):
            self.i += len(words)
            return True
        return False

    def done(self) -> bool:
        return self.i >= len(self.tokens)

    def rest(self) -> str:
        return self.text[self.tokens[self.i][0] :] if not self.done() else ""

    def name(self) -> tuple[str, ...]:
        parts = [_unquote(self.take())]
        while self.peek() == ".":
            self.take()
            parts.append(_unquote(self.take()))
        return tuple(parts)

    def balanced(self) -> str:
        """The text inside the parentheses that start here; the cursor moves past the closing one."""
        if self.take() != "(":
            raise QueryError("expected (")
        start = self.tokens[self.i][0] if not self.done() else len(self.text)
        depth = 1
        while not self.done():
            token = self.take()
            if token == "(":
                depth += 1
            elif token == ")":
                depth -= 1
                if depth == 0:
                    return self.text[start : self.tokens[self.i - 1][0]]
        raise QueryError("unbalanced parentheses")


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] == '"':
        return token[1:-1].replace('""', '"')
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", token):
        raise QueryError(f"expected a name, found {token!r}")
    return token


def _create_external(con: duckdb.DuckDBPyConnection, text: str) -> CreateExternal:
    cursor = _Cursor.of(text)
    cursor.expect("CREATE", "EXTERNAL", "TABLE")
    if_not_exists = cursor.accept("IF", "NOT", "EXISTS")
    parts = cursor.name()
    columns = _column_defs(cursor.balanced(), require_types=True) if cursor.peek() == "(" else ()
    file_format = location = None
    partitions: tuple[ColumnDef, ...] = ()
    options: dict[str, str] = {}
    while not cursor.done():
        if cursor.accept("STORED", "AS"):
            file_format = cursor.take().lower()
        elif cursor.accept("LOCATION"):
            location = _string(cursor.take(), "LOCATION")
        elif cursor.accept("PARTITIONED", "BY"):
            partitions = _partition_defs(cursor.balanced(), columns)
        elif cursor.accept("WITH"):
            options = {k: _option_text(con, v) for k, v in _options(cursor.balanced()).items()}
        else:
            raise QueryError(f"unexpected {cursor.peek()!r} in CREATE EXTERNAL TABLE")
    if file_format not in ("parquet", "csv", "json"):
        raise QueryError("CREATE EXTERNAL TABLE needs STORED AS PARQUET, CSV or JSON")
    if location is None:
        raise QueryError("CREATE EXTERNAL TABLE needs LOCATION 's3://bucket/path'")
    data_columns = tuple(c for c in columns if c.name.lower() not in {p.name.lower() for p in partitions})
    if not data_columns:
        raise QueryError("CREATE EXTERNAL TABLE needs its column list: (name TYPE, ...)")
    return CreateExternal(parts, data_columns, partitions, file_format, location, options, if_not_exists)


def _drop_external(text: str) -> DropExternal:
    cursor = _Cursor.of(text)
    cursor.expect("DROP", "EXTERNAL", "TABLE")
    if_exists = cursor.accept("IF", "EXISTS")
    parts = cursor.name()
    if not cursor.done():
        raise QueryError(f"unexpected {cursor.peek()!r} after DROP EXTERNAL TABLE name")
    return DropExternal(parts, if_exists)


def _optimize(con: duckdb.DuckDBPyConnection, text: str) -> Optimize:
    cursor = _Cursor.of(text)
    cursor.expect("OPTIMIZE")
    parts = cursor.name()
    where: str | None = None
    options: dict[str, Any] = {}
    if cursor.accept("WHERE"):
        rest = cursor.rest()
        split = _top_level_with(rest)
        where = rest[:split].strip() if split is not None else rest.strip()
        cursor = _Cursor.of(rest[split:] if split is not None else "")
    if cursor.accept("WITH"):
        options = {k: fold(con, v, "OPTIMIZE") for k, v in _options(cursor.balanced()).items()}
    if not cursor.done():
        raise QueryError(f"unexpected {cursor.peek()!r} in OPTIMIZE; use OPTIMIZE ns.t [WHERE ...] [WITH (...)]")
    if where == "":
        raise QueryError("OPTIMIZE ... WHERE needs a predicate")
    return Optimize(parts, where, options)


def _top_level_with(text: str) -> int | None:
    for offset, _char, depth in _nesting(text):
        if depth == 0 and text[offset : offset + 4].upper() == "WITH" and text[offset + 4 : offset + 5] in (" ", "("):
            return offset
    return None


def _column_defs(inner: str, *, require_types: bool) -> tuple[ColumnDef, ...]:
    defs: list[ColumnDef] = []
    for piece in _split_commas(inner):
        cursor = _Cursor.of(piece)
        name = _unquote(cursor.take())
        type_text = cursor.rest().strip()
        if not type_text and require_types:
            raise QueryError(f"column {name!r} needs a type")
        defs.append(ColumnDef(name, arrow_type(type_text) if type_text else pa.null(), type_text.upper()))
    names = [d.name.lower() for d in defs]
    if len(set(names)) != len(names):
        raise QueryError("duplicate column name in the column list")
    return tuple(defs)


def _partition_defs(inner: str, columns: tuple[ColumnDef, ...]) -> tuple[ColumnDef, ...]:
    by_name = {c.name.lower(): c for c in columns}
    defs = []
    for d in _column_defs(inner, require_types=False):
        if d.type == pa.null():
            if d.name.lower() not in by_name:
                raise QueryError(f"partition column {d.name!r} needs a type (or appear in the column list)")
            d = by_name[d.name.lower()]
        defs.append(d)
    return tuple(defs)


def _options(inner: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for piece in _split_commas(inner):
        key, sep, value = piece.partition("=")
        key = key.strip().lower()
        if not sep or not re.fullmatch(r"[a-z_][a-z0-9_]*", key):
            raise QueryError("options are written key = value")
        options[key] = value.strip()
    return options


def _option_text(con: duckdb.DuckDBPyConnection, value: str) -> str:
    folded = fold(con, value, "CREATE EXTERNAL TABLE option")
    if not isinstance(folded, str):
        raise QueryError("CREATE EXTERNAL TABLE options take string values")
    return folded


def _split_commas(inner: str) -> list[str]:
    pieces, start = [], 0
    for offset, char, depth in _nesting(inner):
        if char == "," and depth == 0:
            pieces.append(inner[start:offset])
            start = offset + 1
    pieces.append(inner[start:])
    return [p.strip() for p in pieces if p.strip()]


def _string(token: str, what: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] == "'":
        return token[1:-1].replace("''", "'")
    raise QueryError(f"{what} takes a quoted string")


# ------------------------------------------------------------------------------------------------ types

_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "TEXT": pa.string(),
    "STRING": pa.string(),
    "BOOLEAN": pa.bool_(),
    "BOOL": pa.bool_(),
    "TINYINT": pa.int8(),
    "SMALLINT": pa.int16(),
    "INTEGER": pa.int32(),
    "INT": pa.int32(),
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us"),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "BLOB": pa.binary(),
}
_DECIMAL = re.compile(r"^DECIMAL\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)$")


def arrow_type(text: str) -> pa.DataType:
    """A SQL type name (the common DuckDB/Hive spellings) as an Arrow type."""
    name = " ".join(text.upper().split())
    if name in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[name]
    decimal = _DECIMAL.match(name)
    if decimal:
        return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
    raise QueryError(f"unsupported column type {text!r}")
