"""Iceberg views in SQE: which SQL of a catalog view SQE runs, and how views are listed.

A view is stored in the catalog (the REST view endpoints) with one SQL representation per dialect. SQE writes
``duckdb``; it runs ``duckdb`` first, then ``spark`` or ``trino`` SQL when DuckDB parses it as one query, and
otherwise fails with a typed error naming the dialects the view has. The SQL is expanded in the invoker's
session (``sqe.session``): every table it reads is loaded with the invoker's own credentials and
read-restrictions, never the definer's, so a view is never a way around a row filter or a mask.

Table names in a view's SQL are two- or three-part (``ns.t``, ``wh.ns.t``), like every SQE query.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import pyarrow as pa

from sqe.catalog.base import TableIdent, ViewDefinition
from sqe.errors import QueryError, UnsupportedViewDialectError
from sqe.planning.statements import classify

__all__ = ["MAX_VIEW_DEPTH", "RUNNABLE_DIALECTS", "SQE_DIALECT", "relation_listing", "runnable_sql", "view_listing"]

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
