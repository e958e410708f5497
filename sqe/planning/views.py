"""Iceberg views in SQE: which SQL of a catalog view SQE runs, and how views are listed.

A view is stored in the catalog (the REST view endpoints) with one SQL representation per dialect. SQE writes
``duckdb``; it runs ``duckdb`` first, then ``spark`` or ``trino`` SQL when DuckDB parses it as one query, and
otherwise fails with a typed error naming the dialects the view has. The SQL is expanded in the invoker's
session (``sqe.session``): every table it reads is loaded with the invoker's own credentials and
read-restrictions, never the definer's, so a view is never a way around a row filter or a mask.

Names in a view's SQL resolve from the view's own defaults, never the invoker's (Iceberg view spec): a
two-part ``ns.t`` is in the view version's ``default-catalog`` (when unset, or naming no warehouse SQE knows,
such as another engine's name for its catalog: the warehouse the view is stored in),
and a one-part ``t`` that is not a CTE name where it stands (DuckDB's scoping) is
``default-catalog.default-namespace.t``. ``qualified_sql`` writes
every such name out in full before the invoker's session plans and runs the view, so DuckDB and the planner
read the same tables whatever the invoker's default warehouse.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sqe.catalog.base import TableIdent, ViewDefinition
from sqe.duckdb_connection import quote_qualified
from sqe.errors import QueryError, UnsupportedViewDialectError
from sqe.planning.sql_analysis import Node, parse_select
from sqe.planning.statements import classify
from sqe.planning.tokens import sql_tokens

__all__ = [
    "MAX_VIEW_DEPTH",
    "RUNNABLE_DIALECTS",
    "SQE_DIALECT",
    "default_catalog",
    "qualified_sql",
    "relation_listing",
    "runnable_sql",
    "view_listing",
]

SQE_DIALECT = "duckdb"  # what CREATE VIEW in SQE writes
RUNNABLE_DIALECTS = (SQE_DIALECT, "spark", "trino")  # in order of preference
MAX_VIEW_DEPTH = 8  # views of views; deeper (or a cycle) is refused


def runnable_sql(view: ViewDefinition, parser: duckdb.DuckDBPyConnection) -> str:
    """The view's SQL SQE runs: one plain query, from the first runnable dialect whose SQL DuckDB parses."""
    by_dialect: dict[str, str] = {}
    for dialect, sql in view.representations:
        by_dialect.setdefault(dialect.lower(), sql)
    for dialect in RUNNABLE_DIALECTS:
        if dialect not in by_dialect:
            continue
        sql = by_dialect[dialect]
        try:
            statement = classify(parser, sql)
        except QueryError:
            if dialect == SQE_DIALECT:
                raise QueryError(f"view {view.ident}: its duckdb SQL does not parse") from None
            continue  # e.g. Spark's backticks: try the next dialect
        if statement.kind != "select" or statement.travels:
            raise QueryError(f"view {view.ident}: a view must be one plain query (no time travel)")
        return statement.text
    have = ", ".join(sorted(by_dialect)) or "none"
    raise UnsupportedViewDialectError(
        f"view {view.ident} has no SQL SQE can run: dialects {have} (SQE runs duckdb, or spark/trino SQL that "
        "DuckDB parses)"
    )


def default_catalog(view: ViewDefinition, known: Collection[str] | None = None) -> str:
    """The warehouse a name without one resolves in: ``default-catalog`` when it names a warehouse SQE knows
    (one of ``known``; None: any), else the view's own. The spec's rule for an unset one, and what another
    engine's name for its catalog means here: Spark writes its session's catalog name (``demo``), which names
    the catalog the view is stored in, not a warehouse of SQE's."""
    named = view.default_catalog
    if named and (known is None or named in known):
        return named
    return view.ident.warehouse


def qualified_sql(
    view: ViewDefinition, sql: str, parser: duckdb.DuckDBPyConnection, known: Collection[str] | None = None
) -> str:
    """``sql`` (the view's runnable SQL) with each one- and two-part table name written as
    ``warehouse.namespace.table`` from the view's defaults (``known``: see :func:`default_catalog`); other
    text is kept as it is."""
    tree = parse_select(parser, sql)
    catalog = default_catalog(view, known)
    namespace = view.default_namespace
    encoded = sql.encode()
    tokens = sql_tokens(sql)
    starts = {start: i for i, (start, _) in enumerate(tokens)}
    edits: list[tuple[int, int, str]] = []
    for node, ctes in _base_tables(tree):
        names = (node.get("qualified_name") or {}).get("path")  # keeps every part of a.b.c.d
        names = names or (node.get("catalog_name"), node.get("schema_name"), node.get("table_name"))
        path = [str(p) for p in names if p]
        if len(path) == 2:
            full = (catalog, *path)
        elif len(path) == 1 and path[0].lower() not in ctes:
            if len(namespace) != 1:  # left as it is, DuckDB would look in the view's own namespace
                shown = ".".join(namespace) or "(none)"
                raise QueryError(
                    f"view {view.ident}: {path[0]} has no namespace, and default-namespace {shown} "
                    "cannot be named in SQL"
                )
            full = (catalog, namespace[0], path[0])
        else:
            continue  # three-part or a CTE: left to the usual checks
        location = node.get("query_location")
        start = len(encoded[:location].decode()) if isinstance(location, int) else -1
        first = starts.get(start)
        if first is None:
            raise QueryError(f"view {view.ident}: cannot find the table name {'.'.join(path)} in its SQL")
        end = _name_end(sql, tokens, first, len(path))
        edits.append((start, end, quote_qualified(*full)))
    for start, end, name in sorted(edits, reverse=True):
        sql = sql[:start] + name + sql[end:]
    return sql


def _name_end(sql: str, tokens: list[tuple[int, str]], first: int, parts: int) -> int:
    """Where a name of ``parts`` parts whose first token is ``tokens[first]`` ends. A comment between its
    parts is no part (it goes with the name); one after it stays."""
    remaining = 2 * parts - 1  # identifiers and the dots between them
    index = first
    while index < len(tokens) and remaining > 0:
        remaining -= tokens[index][1] != "comment"
        index += 1
    end = tokens[index][0] if index < len(tokens) else len(sql)
    return tokens[index - 1][0] + len(sql[tokens[index - 1][0] : end].rstrip())


def _base_tables(tree: Node) -> Iterator[tuple[Node, frozenset[str]]]:
    """Every base-table node with the lower-case CTE names in scope where it stands, as DuckDB binds them: a
    WITH's names are seen by its query and by the CTEs after each one; a CTE's own body sees its name only in a
    recursive CTE's recursive part (elsewhere that name is a table)."""
    stack: list[tuple[Any, frozenset[str]]] = [(tree, frozenset())]
    while stack:
        item, ctes = stack.pop()
        if isinstance(item, list):
            stack.extend((child, ctes) for child in item)
            continue
        if not isinstance(item, dict):
            continue
        if item.get("type") == "BASE_TABLE" and "class" not in item:
            yield item, ctes
        cte_map = item.get("cte_map")
        if isinstance(cte_map, dict):
            for entry in cte_map.get("map") or []:
                stack.append((entry.get("value"), ctes))
                ctes = ctes | {str(entry.get("key", "")).lower()}
        recursive = str(item.get("cte_name", "")).lower() if item.get("type") == "RECURSIVE_CTE_NODE" else None
        for key, child in item.items():
            if key == "cte_map":
                continue
            stack.append((child, ctes | {recursive} if recursive is not None and key == "right" else ctes))


_LISTING = pa.schema(
    [("warehouse", pa.string()), ("namespace", pa.string()), ("table", pa.string()), ("kind", pa.string())]
)


def relation_listing(tables: Sequence[TableIdent], views: Sequence[TableIdent]) -> pa.Table:
    """SHOW TABLES: tables and views together, each marked by ``kind`` (``TABLE`` or ``VIEW``)."""
    entries = [(ident, "TABLE") for ident in tables] + [(ident, "VIEW") for ident in views]
    rows = [
        {"warehouse": i.warehouse, "namespace": ".".join(i.namespace), "table": i.name, "kind": kind}
        for i, kind in sorted(entries, key=lambda entry: (str(entry[0]), entry[1]))
    ]
    return pa.Table.from_pylist(rows, schema=_LISTING)


def view_listing(views: Sequence[TableIdent]) -> pa.Table:
    """SHOW VIEWS: the views this user may see."""
    schema = pa.schema([("warehouse", pa.string()), ("namespace", pa.string()), ("view", pa.string())])
    rows = [
        {"warehouse": i.warehouse, "namespace": ".".join(i.namespace), "view": i.name} for i in sorted(views, key=str)
    ]
    return pa.Table.from_pylist(rows, schema=schema)
