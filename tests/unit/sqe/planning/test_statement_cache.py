"""classify keeps the classification of a text that classified cleanly; refusals and long texts are not kept."""

from __future__ import annotations

import uuid

import duckdb
import pytest

from sqe.errors import QueryError
from sqe.planning import statements
from sqe.planning.statements import classify


def _unique(sql: str) -> str:
    return sql.replace("{id}", uuid.uuid4().hex)


def test_a_repeat_text_is_classified_without_duckdb() -> None:
    sql = _unique("INSERT INTO ns.t_{id} SELECT * FROM ns.src FOR VERSION AS OF 7")
    con = duckdb.connect()
    first = classify(con, sql)
    con.close()  # a closed connection fails any parse: the repeat must not reach DuckDB
    again = classify(con, sql)
    assert again == first
    assert (again.kind, again.target, [t.parts for t in again.travels]) == (
        "insert",
        ("ns", first.target[1]),
        [("ns", "src")],
    )


def test_a_refused_text_is_refused_again() -> None:
    sql = _unique("SELEC broken_{id}")
    con = duckdb.connect()
    with pytest.raises(QueryError, match="syntax error"):
        classify(con, sql)
    con.close()
    with pytest.raises(QueryError, match="closed"):  # parsed again (the closed connection refused), not from memory
        classify(con, sql)


def test_the_kept_texts_are_bounded_and_a_long_text_is_never_kept() -> None:
    con = duckdb.connect()
    oldest = _unique("SELECT 1 AS c_{id}")
    classify(con, oldest)
    for _ in range(statements._CLASSIFIED_ENTRIES):
        classify(con, _unique("SELECT 1 AS c_{id}"))
    long_sql = _unique("SELECT 1 AS c_{id} WHERE ") + " AND ".join(
        ["true"] * (statements._CLASSIFIED_MAX_SQL_CHARS // 8)
    )
    classify(con, long_sql)
    assert len(statements._CLASSIFIED) == statements._CLASSIFIED_ENTRIES
    con.close()
    for evicted in (oldest, long_sql):
        with pytest.raises(QueryError, match="closed"):
            classify(con, evicted)
