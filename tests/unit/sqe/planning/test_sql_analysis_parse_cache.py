"""parse_select keeps DuckDB's parse of a text that parsed cleanly, and hands out a fresh tree every time."""

from __future__ import annotations

import uuid

import duckdb
import pytest

from sqe.errors import QueryError
from sqe.planning import sql_analysis
from sqe.planning.sql_analysis import find_table_refs, parse_select


def _unique_sql() -> str:
    return f"SELECT count(*) AS c_{uuid.uuid4().hex} FROM ns.t WHERE true"


def test_a_repeat_text_is_answered_without_duckdb_and_each_tree_is_fresh() -> None:
    sql = _unique_sql()
    con = duckdb.connect()
    first = parse_select(con, sql)
    con.close()  # a closed connection fails any execute: the repeat must not reach DuckDB
    first.clear()  # a caller changing its tree changes nothing kept
    second = parse_select(con, sql)
    assert [ref.parts for ref in find_table_refs(second)] == [("ns", "t")]
    assert second is not parse_select(con, sql)


def test_a_text_that_fails_to_parse_is_not_kept() -> None:
    sql = f"SELEC broken_{uuid.uuid4().hex}"
    con = duckdb.connect()
    with pytest.raises(QueryError):
        parse_select(con, sql)
    con.close()
    with pytest.raises(duckdb.Error):  # asked DuckDB again (and the closed connection refused)
        parse_select(con, sql)


def test_the_kept_texts_are_bounded_and_a_long_text_is_never_kept() -> None:
    con = duckdb.connect()
    oldest = _unique_sql()
    parse_select(con, oldest)
    for _ in range(sql_analysis._PARSED_ENTRIES):
        parse_select(con, _unique_sql())
    long_sql = _unique_sql() + " AND " + " AND ".join(["true"] * (sql_analysis._PARSED_MAX_SQL_CHARS // 8))
    parse_select(con, long_sql)
    assert len(sql_analysis._PARSED) == sql_analysis._PARSED_ENTRIES
    con.close()
    for evicted in (oldest, long_sql):
        with pytest.raises(duckdb.Error):
            parse_select(con, evicted)
    assert "SELECT" not in repr(sql_analysis._PARSED)
