"""Parsing of file table function calls and SQE's own external-table / OPTIMIZE statements."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sqe.duckdb_connection import connect_locked_down
from sqe.errors import QueryError
from sqe.planning.external_sql import (
    CreateExternal,
    DropExternal,
    Optimize,
    ShowExternal,
    find_file_calls,
    find_named_refs,
    parse_external_statement,
)
from sqe.planning.sql_analysis import parse_select


def test_calls_and_names_are_located_in_non_ascii_text() -> None:
    con = connect_locked_down()
    sql = "SELECT 'é', * FROM read_csv(['s3://b/x/*.csv'], delim=';', header=true) t JOIN ns.tab q ON true"
    tree = parse_select(con, sql)
    (call,) = find_file_calls(con, tree, sql)
    assert sql[call.start : call.end] == "read_csv(['s3://b/x/*.csv'], delim=';', header=true)"
    assert call.paths == ("s3://b/x/*.csv",) and call.options == {"delim": ";", "header": True} and call.has_alias
    (ref,) = find_named_refs(tree, sql)
    assert sql[ref.start : ref.end] == "ns.tab" and ref.alias == "q"


def test_create_external_table() -> None:
    con = connect_locked_down()
    parsed = parse_external_statement(
        con,
        "CREATE EXTERNAL TABLE ns.t (a INT, dt DATE) STORED AS CSV LOCATION 's3://b/x' "
        "PARTITIONED BY (dt, region VARCHAR) WITH (access_key_id = 'AK', secret_access_key = 'SK')",
    )
    assert isinstance(parsed, CreateExternal)
    assert [c.name for c in parsed.columns] == ["a"] and [p.type for p in parsed.partitions] == [
        pa.date32(),
        pa.string(),
    ]
    assert "SK" not in repr(parsed)


def test_other_statements() -> None:
    con = connect_locked_down()
    assert parse_external_statement(con, "show external tables") == ShowExternal()
    assert parse_external_statement(con, 'DROP EXTERNAL TABLE IF EXISTS ns."x y"') == DropExternal(("ns", "x y"), True)
    optimize = parse_external_statement(con, "OPTIMIZE ns.t WHERE p = 1 WITH (target_file_size = 2 * 1024)")
    assert optimize == Optimize(("ns", "t"), "p = 1", {"target_file_size": 2048})
    assert parse_external_statement(con, "SELECT 1") is None


def test_bad_forms() -> None:
    con = connect_locked_down()
    with pytest.raises(QueryError, match="STORED AS"):
        parse_external_statement(con, "CREATE EXTERNAL TABLE ns.t (a INT) LOCATION 's3://b/x'")
    with pytest.raises(QueryError, match="unsupported column type"):
        parse_external_statement(con, "CREATE EXTERNAL TABLE ns.t (a WEIRD) STORED AS CSV LOCATION 's3://b/x'")
