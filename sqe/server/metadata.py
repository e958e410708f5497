"""Flight SQL metadata results: catalogs (warehouses), DB schemas (namespaces), tables and views, table types,
SQL info.

Everything listed comes from the catalog as the calling user (their token), so a user sees the warehouses,
namespaces and tables the catalog lets them list. A table's schema (``include_schema``) is the one its queries
return — after masks — obtained by planning ``SELECT * ... LIMIT 0`` in the user's engine session; a table the
user may list but not read is left out of a schema listing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import pyarrow as pa

from sqe import __version__ as sqe_version
from sqe.duckdb_connection import quote_qualified
from sqe.errors import CatalogError, NoSuchNamespaceError, QueryError, SQEError
from sqe.server.sessions import Engine

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema([("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8(), nullable=False)])
MAX_PATTERN_CHARS = 1024  # of a GetDbSchemas/GetTables filter pattern
SEARCH_STRING_ESCAPE = "\\"  # JDBC's getSearchStringEscape: makes a pattern's next % or _ literal
_ANY_RUN, _ANY_ONE = ("%", True), ("_", True)
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
TABLE_TYPES = ("TABLE", "VIEW")  # as SHOW TABLES marks them (``kind``)
_TABLES_FIELDS = [
    ("catalog_name", pa.utf8()),
    ("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False),
    pa.field("table_type", pa.utf8(), nullable=False),
]
TABLES_SCHEMA = pa.schema(_TABLES_FIELDS)
TABLES_WITH_SCHEMA_SCHEMA = pa.schema([*_TABLES_FIELDS, pa.field("table_schema", pa.binary(), nullable=False)])

_SQL_INFO_VALUE = pa.dense_union(
    [
        pa.field("string_value", pa.utf8()),
        pa.field("bool_value", pa.bool_()),
        pa.field("bigint_value", pa.int64()),
        pa.field("int32_bitmask", pa.int32()),
        pa.field("string_list", pa.list_(pa.utf8())),
        pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.int32()))),
    ]
)
SQL_INFO_SCHEMA = pa.schema([pa.field("info_name", pa.uint32(), nullable=False), ("value", _SQL_INFO_VALUE)])

# SqlInfo ids (Flight SQL's SqlInfo enum) -> value; str -> string_value, bool -> bool_value, int -> int32_bitmask.
_SQL_INFO: dict[int, str | bool | int] = {
    0: "sqe",  # FLIGHT_SQL_SERVER_NAME
    1: sqe_version,  # FLIGHT_SQL_SERVER_VERSION
    2: pa.__version__,  # FLIGHT_SQL_SERVER_ARROW_VERSION
    3: False,  # FLIGHT_SQL_SERVER_READ_ONLY
    4: True,  # FLIGHT_SQL_SERVER_SQL
    5: False,  # FLIGHT_SQL_SERVER_SUBSTRAIT
    8: 0,  # FLIGHT_SQL_SERVER_TRANSACTION: none
    9: True,  # FLIGHT_SQL_SERVER_CANCEL
    500: False,  # SQL_DDL_CATALOG: warehouses are made in the catalog, not by SQL
    501: True,  # SQL_DDL_SCHEMA: CREATE/DROP SCHEMA run at the catalog as the user
    502: True,  # SQL_DDL_TABLE: CREATE TABLE [AS] / DROP TABLE likewise
    # SQL_IDENTIFIER_CASE / SQL_QUOTED_IDENTIFIER_CASE: UNKNOWN, the only value that fits. Names are kept as
    # written and the catalog looks them up case-sensitively, so neither "insensitive" nor "stored lower case".
    503: 0,
    504: '"',  # SQL_IDENTIFIER_QUOTE_CHAR
    505: 0,
    506: False,  # SQL_ALL_TABLES_ARE_SELECTABLE: TABLE_LIST lists tables the user may not read
    513: SEARCH_STRING_ESCAPE,  # SQL_SEARCH_STRING_ESCAPE
    529: "namespace",  # SQL_SCHEMA_TERM
    531: "warehouse",  # SQL_CATALOG_TERM
    532: True,  # SQL_CATALOG_AT_START
}


def sql_info(requested: Iterable[int]) -> pa.Table:
    ids = sorted(set(requested) & set(_SQL_INFO)) if requested else sorted(_SQL_INFO)
    type_codes, offsets = [], []
    children: list[list[object]] = [[] for _ in range(6)]
    for info_id in ids:
        value = _SQL_INFO[info_id]
        code = 0 if isinstance(value, str) else 1 if isinstance(value, bool) else 3
        type_codes.append(code)
        offsets.append(len(children[code]))
        children[code].append(value)
    arrays = [pa.array(children[i], type=_SQL_INFO_VALUE.field(i).type) for i in range(6)]
    value = pa.UnionArray.from_dense(
        pa.array(type_codes, pa.int8()),
        pa.array(offsets, pa.int32()),
        arrays,
        [f.name for f in _SQL_INFO_VALUE],
        type_codes=list(range(6)),
    )
    return pa.Table.from_arrays([pa.array(ids, pa.uint32()), value], schema=SQL_INFO_SCHEMA)


def like(pattern: str | None) -> Callable[[str], bool] | None:
    """A Flight SQL filter pattern (``%`` any run, ``_`` one character, ``\\`` makes the next character literal, as
    advertised by SQL_SEARCH_STRING_ESCAPE); None matches everything.

    Matching costs up to len(pattern) * len(name) steps per name, so a pattern is bounded."""
    if pattern is None:
        return None
    if len(pattern) > MAX_PATTERN_CHARS:
        raise QueryError(f"a filter pattern may be at most {MAX_PATTERN_CHARS} characters")
    return functools.partial(_like, _tokens(pattern))


def _matches(selected: Callable[[str], bool] | None, value: str) -> bool:
    return selected is None or selected(value)


def _tokens(pattern: str) -> list[tuple[str, bool]]:
    """(character, is_wildcard) per position of ``pattern``: an escaped ``%``/``_`` is a literal, so a name such
    as ``a_b`` can be asked for exactly (``a\\_b``) rather than also matching ``axb``."""
    tokens: list[tuple[str, bool]] = []
    escaped = False
    for char in pattern:
        if escaped:
            tokens.append((char, False))
            escaped = False
        elif char == SEARCH_STRING_ESCAPE:
            escaped = True
        else:
            tokens.append((char, char in "%_"))
    if escaped:
        raise QueryError(f"the filter pattern {pattern[:60]!r} ends with the escape character; write \\\\ for one")
    return tokens


def _like(tokens: list[tuple[str, bool]], value: str) -> bool:
    """Whether ``value`` matches the pattern ``tokens``, in O(len(tokens) * len(value)): a backtracking regex (``%``
    as ``.*``) takes exponential time on ``%%%…%x`` while holding the GIL, freezing the server for every user."""
    p = v = 0
    star, resume = -1, 0  # the last ``%`` seen and where in ``value`` its run ends so far
    while v < len(value):
        if p < len(tokens) and tokens[p] == _ANY_RUN:
            star, resume, p = p, v, p + 1
        elif p < len(tokens) and (tokens[p] == _ANY_ONE or tokens[p][0] == value[v]):
            p, v = p + 1, v + 1
        elif star >= 0:  # let the last ``%`` take one more character; earlier ones never need to
            resume += 1
            p, v = star + 1, resume
        else:
            return False
    return all(token == _ANY_RUN for token in tokens[p:])


def catalogs(warehouses: Iterable[str]) -> pa.Table:
    return pa.Table.from_pylist([{"catalog_name": w} for w in sorted(warehouses)], schema=CATALOGS_SCHEMA)


def _namespaces(engine: Engine, warehouse: str) -> list[str]:
    try:
        found = engine.provider.catalog(warehouse).list_namespaces()
    except SQEError:
        raise
    except Exception as exc:
        raise CatalogError(f"listing namespaces of {warehouse} failed: {type(exc).__name__}") from None
    return sorted(".".join(ns) for ns in found)


def _selected(warehouses: Iterable[str], catalog: str | None) -> list[str]:
    return [w for w in sorted(warehouses) if catalog is None or w == catalog]


def db_schemas(engine: Engine, warehouses: Iterable[str], catalog: str | None, pattern: str | None) -> pa.Table:
    selected = like(pattern)
    rows = [
        {"catalog_name": w, "db_schema_name": ns}
        for w in _selected(warehouses, catalog)
        for ns in _namespaces(engine, w)
        if _matches(selected, ns)
    ]
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def tables_schema(include_schema: bool) -> pa.Schema:
    """The schema of a GetTables answer: with ``include_schema`` its rows carry each table's schema as well."""
    return TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA


def tables(
    engine: Engine,
    warehouses: Iterable[str],
    catalog: str | None,
    schema_pattern: str | None,
    table_pattern: str | None,
    table_types: list[str],
    include_schema: bool,
) -> pa.Table:
    wanted = set(table_types) & set(TABLE_TYPES) if table_types else set(TABLE_TYPES)
    schema_like, table_like = like(schema_pattern), like(table_pattern)
    rows: list[dict[str, object]] = []
    for warehouse in _selected(warehouses, catalog) if wanted else []:
        for namespace in _namespaces(engine, warehouse):
            if not _matches(schema_like, namespace):
                continue
            for name, kind in _relations(engine, warehouse, namespace):
                if kind not in wanted or not _matches(table_like, name):
                    continue
                row: dict[str, object] = {
                    "catalog_name": warehouse,
                    "db_schema_name": namespace,
                    "table_name": name,
                    "table_type": kind,
                }
                if include_schema:
                    schema = _query_schema(engine, warehouse, namespace, name)
                    if schema is None:
                        continue
                    row["table_schema"] = schema.serialize().to_pybytes()
                rows.append(row)
    return pa.Table.from_pylist(rows, schema=tables_schema(include_schema))


def table_types() -> pa.Table:
    return pa.Table.from_pylist([{"table_type": t} for t in TABLE_TYPES], schema=TABLE_TYPES_SCHEMA)


def _relations(engine: Engine, warehouse: str, namespace: str) -> list[tuple[str, str]]:
    """(name, ``TABLE`` or ``VIEW``) of what the namespace holds that this user may list, by name."""
    try:
        listed = engine.session.list_tables(quote_qualified(warehouse, namespace))  # a name may hold '.' or '-'
    except NoSuchNamespaceError:
        return []
    names, kinds = listed.column("table").to_pylist(), listed.column("kind").to_pylist()
    return sorted((str(name), str(kind)) for name, kind in zip(names, kinds, strict=True))


def _query_schema(engine: Engine, warehouse: str, namespace: str, name: str) -> pa.Schema | None:
    """The schema a query of the table returns (masks applied), or None when the user cannot read it."""
    try:
        result = engine.session.sql(f"SELECT * FROM {quote_qualified(warehouse, namespace, name)} LIMIT 0")
        return result.arrow().schema
    except SQEError:
        return None
