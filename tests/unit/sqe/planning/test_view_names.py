"""Names in a view's SQL written out in full from the view's defaults (``sqe.planning.views.qualified_sql``)."""

from __future__ import annotations

import pytest

from sqe.catalog.base import TableIdent, ViewDefinition
from sqe.duckdb_connection import connect_locked_down
from sqe.errors import QueryError
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


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # a CTE of a subquery is no name outside it: the outer t is the table
        (
            "SELECT * FROM t WHERE id IN (WITH t AS (SELECT 1 AS id) SELECT id FROM t)",
            'SELECT * FROM "wh2"."sales"."t" WHERE id IN (WITH t AS (SELECT 1 AS id) SELECT id FROM t)',
        ),
        # a CTE's own body reads the table of its name; the query reads the CTE
        (
            "WITH t AS (SELECT * FROM t) SELECT * FROM t",
            'WITH t AS (SELECT * FROM "wh2"."sales"."t") SELECT * FROM t',
        ),
        # a CTE sees the ones before it, not the ones after
        (
            "WITH a AS (SELECT * FROM b), b AS (SELECT * FROM a) SELECT * FROM b",
            'WITH a AS (SELECT * FROM "wh2"."sales"."b"), b AS (SELECT * FROM a) SELECT * FROM b',
        ),
        # a recursive CTE's anchor reads the table; its recursive part reads the CTE
        (
            "WITH RECURSIVE t AS (SELECT n FROM t UNION ALL SELECT n + 1 FROM t WHERE n < 3) SELECT * FROM t",
            'WITH RECURSIVE t AS (SELECT n FROM "wh2"."sales"."t" UNION ALL SELECT n + 1 FROM t WHERE n < 3) '
            "SELECT * FROM t",
        ),
        # a comment between a name's parts goes with the name; one after it stays
        ("SELECT * FROM ns /* c */ . t AS x", 'SELECT * FROM "wh2"."ns"."t" AS x'),
        ("SELECT * FROM ns . -- c\n t /* d */ x", 'SELECT * FROM "wh2"."ns"."t" /* d */ x'),
    ],
)
def test_names_follow_duckdbs_scoping(sql: str, expected: str) -> None:
    view = ViewDefinition(VIEW, (), ("sales",), 1, None)
    assert qualified_sql(view, sql, connect_locked_down()) == expected


@pytest.mark.parametrize("namespace", [("a", "b"), ()])
def test_a_one_part_name_without_a_nameable_default_namespace_is_refused(namespace: tuple[str, ...]) -> None:
    """Left one-part, DuckDB would read the table of that name in the view's own namespace: another table."""
    view = ViewDefinition(VIEW, (), namespace, 1, None)
    with pytest.raises(QueryError, match=r"view wh2\.sales\.v: t has no namespace"):
        qualified_sql(view, "SELECT * FROM t", connect_locked_down())
    assert qualified_sql(view, "SELECT * FROM ns.t", connect_locked_down()) == 'SELECT * FROM "wh2"."ns"."t"'


@pytest.mark.parametrize(
    ("default_catalog", "warehouse"),
    [("wh", "wh"), ("demo", "wh2"), (None, "wh2")],  # a known one; another engine's catalog name; unset
)
def test_a_default_catalog_naming_no_known_warehouse_means_the_views_own(
    default_catalog: str | None, warehouse: str
) -> None:
    view = ViewDefinition(VIEW, (), ("sales",), 1, default_catalog)
    assert qualified_sql(view, "SELECT * FROM t", connect_locked_down(), ("wh", "wh2")) == (
        f'SELECT * FROM "{warehouse}"."sales"."t"'
    )
