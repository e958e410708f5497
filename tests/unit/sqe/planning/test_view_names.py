"""Names in a view's SQL written out in full from the view's defaults (``sqe.planning.views.qualified_sql``)."""

from __future__ import annotations

import pytest

from sqe.catalog.base import TableIdent, ViewDefinition
from sqe.duckdb_connection import connect_locked_down
from sqe.planning.views import qualified_sql

VIEW = TableIdent("wh2", ("sales",), "v")


@pytest.mark.parametrize(
    ("default_catalog", "sql", "expected"),
    [
        (None, "SELECT * FROM ns.t", 'SELECT * FROM "wh2"."ns"."t"'),
        ("wh3", "SELECT * FROM ns.t x", 'SELECT * FROM "wh3"."ns"."t" x'),
        (None, "SELECT * FROM t", 'SELECT * FROM "wh2"."sales"."t"'),
        (None, "SELECT * FROM wh.ns.t", "SELECT * FROM wh.ns.t"),  # three parts: as written
        # a CTE's name is no table; comments, spacing and quoted non-ASCII names keep their places
        (
            None,
            'WITH c AS (SELECT 1 AS a) SELECT * FROM c, "né" . "t" /* x */ JOIN ns.u ON true',
            'WITH c AS (SELECT 1 AS a) SELECT * FROM c, "wh2"."né"."t" /* x */ JOIN "wh2"."ns"."u" ON true',
        ),
    ],
)
def test_names_take_the_views_defaults(default_catalog: str | None, sql: str, expected: str) -> None:
    view = ViewDefinition(VIEW, (), ("sales",), 1, default_catalog)
    assert qualified_sql(view, sql, connect_locked_down()) == expected
