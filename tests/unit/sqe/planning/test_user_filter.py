"""The simple WHERE outside DuckDB keeps exactly DuckDB's rows: recognised from DuckDB's own parse tree, compiled
to a pyarrow expression (pass-through, plain worker fragments) and to the partial aggregate's parameterised SQL
(worker fragments that aggregate), on data full of NULLs (no servers: DuckDB in memory)."""

from __future__ import annotations

import datetime
import math

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import assign_fresh_schema_ids

from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.errors import InvalidTicketError
from sqe.distributed.protocol.filters import filter_from_proto, filter_to_proto
from sqe.distributed.protocol.partial import PartialAggregate
from sqe.planning.sql_analysis import parse_select
from sqe.planning.user_filter import (
    MAX_DEPTH,
    MAX_LIKE_PATTERN,
    AnyOf,
    Condition,
    NotSimple,
    UserFilter,
    UserFilterMismatch,
    simple_where,
)

N = 60
TABLE = pa.table(
    {
        "i": pa.array([None if k % 7 == 0 else k % 11 - 3 for k in range(N)], pa.int32()),
        "s": pa.array([None if k % 5 == 0 else ("a", "b", "B", "", "ä")[k % 4] for k in range(N)], pa.large_string()),
        "b": pa.array([None if k % 6 == 0 else k % 2 == 0 for k in range(N)], pa.bool_()),
        "d": pa.array(
            [None if k % 9 == 0 else datetime.date(2024, 1, 1) + datetime.timedelta(days=k % 13) for k in range(N)],
            pa.date32(),
        ),
        "k": pa.array(range(N), pa.int64()),
        # doubles DuckDB orders its own way: NaN above every number (even infinity), -0.0 equal to 0.0
        "x": pa.array(
            [
                (None, math.nan, -0.0, 0.0, 0.1 + 0.2, 0.3, 1.5, -1.5, math.inf, -math.inf, 1e308, 2.0)[k % 12]
                for k in range(N)
            ],
            pa.float64(),
        ),
        "f": pa.array([k / 4 for k in range(N)], pa.float32()),
        "l": pa.array(
            [None if k % 9 == 0 else ("x_ä1", "_", "%_%", "xyä", "ä", "x%ä", "", "x\nä")[k % 8] for k in range(N)]
        ),
    }
)
READ_SCHEMA = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(TABLE.schema))

WHERES = [
    "i > 2",
    "i IN (1, 2, 5) OR s = 'b'",  # an IN leaf: false for a NULL in pyarrow, NULL in DuckDB
    "i IN (1, 2) OR s IN ('a', 'ä')",
    "(i < 0 OR b = true) AND (s <> 'a' OR d >= '2024-01-05')",
    "i IS NULL OR (s IS NOT NULL AND i BETWEEN -2 AND 2)",
    "b = false OR d IN ('2024-01-02', '2024-01-09') OR (k >= 50 AND (i = 4 OR s = ''))",
    "s < 'b' OR s > 'B'",  # byte order: 'B' < 'a' < 'b' < 'ä'
    "(i = 1 OR i = 2) AND (i = 2 OR i = 3)",
    # NOT: NULL under it stays NULL (is_in alone would say false, and NOT would keep the row)
    "NOT (i > 2)",
    "i NOT IN (1, 2)",
    "s NOT IN ('a', 'ä') OR b = true",
    "i NOT BETWEEN 1 AND 2",
    "NOT (i IN (1, 2, 5) OR s = 'b')",
    "NOT (i IS NULL) AND NOT (d NOT IN ('2024-01-02', '2024-01-03'))",
    "NOT NOT (b = false)",
    "NOT (i < 0 AND (s IS NULL OR NOT (k IN (3, 4, 5))))",
    # doubles: NaN and -0.0 as DuckDB compares them; integer, decimal and exponent constants
    "x > 1",
    "x >= 1e308 OR x < -1.5",
    "x <= 0.3",
    "x = 0.3 OR x = 0",
    "x <> -0.0",
    "x IN (0.0, 1.5, 2)",
    "x NOT IN (-0.0, 0.3)",
    "x NOT IN (0.3, 1.5)",
    "x BETWEEN -0.0 AND 1.5",
    "NOT (x > 1.5) AND x NOT BETWEEN 0.1 AND 0.2",
    "x > 12345678901234567890.123",
    # LIKE: '%' and '_' (one character, not one byte) over non-ASCII strings, as DuckDB matches them
    "s LIKE 'a%'",
    "s LIKE '_' OR s LIKE ''",
    "s NOT LIKE '%ä%'",
    "NOT (s LIKE 'B' OR s NOT LIKE '_%')",
    "l LIKE '_%_' OR l LIKE 'x_ä%'",
    "l LIKE 'x_ä' OR l LIKE '%\n%'",  # '_' and '%' match a newline too
]


def _where(sql: str) -> UserFilter:
    tree = parse_select(duckdb.connect(), f"SELECT * FROM t WHERE {sql}")
    names = set(TABLE.schema.names)

    def column_of(node: object) -> str | None:
        parts = node.get("column_names") if isinstance(node, dict) and node.get("class") == "COLUMN_REF" else None
        return parts[-1] if parts and parts[-1] in names else None

    where = simple_where(tree.get("where_clause"), column_of, READ_SCHEMA.find_field)
    assert where is not None
    return where


def _duckdb(sql: str) -> list[int]:
    con = duckdb.connect()
    con.register("t", TABLE)
    return sorted(k for (k,) in con.sql(f"SELECT k FROM t WHERE {sql}").fetchall())


@pytest.mark.parametrize("sql", WHERES)
def test_the_arrow_mask_keeps_duckdbs_rows(sql: str) -> None:
    kept = TABLE.filter(_where(sql).mask(TABLE.schema)(TABLE))
    assert sorted(kept.column("k").to_pylist()) == _duckdb(sql)


@pytest.mark.parametrize("sql", WHERES)
def test_the_partial_aggregates_sql_keeps_duckdbs_rows(sql: str) -> None:
    spec = PartialAggregate(("k",), (("count_star", ""),))
    text, parameters = spec.sql(source="t", where=_where(sql))
    con = duckdb.connect()
    con.register("t", TABLE)
    assert sorted(k for k, _ in con.sql(text, params=parameters or None).fetchall()) == _duckdb(sql)


@pytest.mark.parametrize("sql", WHERES)
def test_the_wire_form_is_the_same_filter(sql: str) -> None:
    where = _where(sql)
    assert filter_from_proto(pb.UserFilter.FromString(filter_to_proto(where).SerializeToString())) == where


@pytest.mark.parametrize(
    "sql",
    [
        "NOT b",  # a bare column is not a condition, negated or not
        "s LIKE 'a\\%'",  # a backslash escapes in pyarrow, and differently in DuckDB
        "s ILIKE 'a%'",
        "s LIKE 'a!%' ESCAPE '!'",
        "s GLOB 'a*'",
        "'a%' LIKE s",
        "i LIKE '1%'",
        "f > 1.1",  # a 32-bit float: DuckDB rounds the constant to 32 bits its own way
        "x > 1e309",  # no finite double
        "x > 9007199254740993",  # an integer a double cannot hold exactly
        "x > 'nan'::DOUBLE",
        "i > 2.5",  # a decimal against an integer column
        "NOT (i + 1 > 3)",
        "i > 2 OR TRUE",
        "i > 2 OR i + 1 > 3",
        "i > 2 OR s = 1",
        "i > 2 OR b",  # a bare column is not a condition
    ],
)
def test_other_shapes_stay_with_duckdb(sql: str) -> None:
    with pytest.raises(NotSimple):
        _where(sql)


def test_ors_nested_deeper_than_a_ticket_carries_stay_with_duckdb() -> None:
    def nested(depth: int) -> str:  # i = 0 OR (k = 0 AND (i = 1 OR (k = 1 AND ...)))
        text = "i = 99"
        for level in range(depth):
            text = f"i = {level} OR (k = {level} AND ({text}))" if level % 2 else f"(i = {level} OR ({text}))"
        return text

    assert _where(nested(8)).depth() <= MAX_DEPTH
    with pytest.raises(NotSimple):
        _where(nested(40))


def test_nots_nested_deeper_than_a_ticket_carries_stay_with_duckdb() -> None:
    assert _where("NOT " * MAX_DEPTH + "(i = 1)").depth() == MAX_DEPTH
    with pytest.raises(NotSimple):
        _where("NOT " * (MAX_DEPTH + 1) + "(i = 1)")


def _clause(**fields: object) -> pb.FilterClause:
    return pb.FilterClause(**fields)  # type: ignore[arg-type]


EQ_ONE = _clause(
    condition=pb.FilterCondition(column="i", operator=pb.FILTER_OPERATOR_EQ, values=[pb.FilterValue(integer=1)])
)


@pytest.mark.parametrize(
    ("clause", "error"),
    [
        (_clause(), "a clause is empty"),
        (_clause(any=pb.FilterClauses(clauses=[EQ_ONE])), "an OR needs at least two clauses"),
        (_clause(all=pb.FilterClauses()), "an AND needs at least two clauses"),
        (_clause(negated=_clause()), "a clause is empty"),
    ],
)
def test_malformed_clauses_are_invalid_tickets(clause: pb.FilterClause, error: str) -> None:
    with pytest.raises(InvalidTicketError, match=error):
        filter_from_proto(pb.UserFilter(conditions=[clause]))


def test_a_wire_filter_nested_too_deep_or_too_large_is_an_invalid_ticket() -> None:
    deep = EQ_ONE
    for _ in range(MAX_DEPTH + 1):
        deep = _clause(any=pb.FilterClauses(clauses=[deep, EQ_ONE]))
    with pytest.raises(InvalidTicketError, match="more than 16 deep"):
        filter_from_proto(pb.UserFilter(conditions=[deep]))
    negated = EQ_ONE
    for _ in range(MAX_DEPTH + 1):
        negated = _clause(negated=negated)
    with pytest.raises(InvalidTicketError, match="more than 16 deep"):
        filter_from_proto(pb.UserFilter(conditions=[negated]))
    wide = _clause(any=pb.FilterClauses(clauses=[EQ_ONE] * 1001))
    with pytest.raises(InvalidTicketError, match="more than 1000 conditions"):
        filter_from_proto(pb.UserFilter(conditions=[wide]))
    assert filter_from_proto(pb.UserFilter(conditions=[_clause(any=pb.FilterClauses(clauses=[EQ_ONE] * 1000))]))


def test_an_or_of_one_clause_does_not_compile() -> None:
    with pytest.raises(ValueError, match="at least two clauses"):
        UserFilter((AnyOf((Condition("i", "eq", (1,)),)),)).mask(TABLE.schema)


@pytest.mark.parametrize("condition", [Condition("s", "like", ("a\\%",)), Condition("i", "like", ("1%",))])
def test_a_like_pyarrow_would_not_match_as_duckdb_does_is_a_mismatch(condition: Condition) -> None:
    """What a worker refuses (invalid-ticket): a backslash in the pattern, or LIKE on a column that is no string."""
    with pytest.raises(UserFilterMismatch, match="LIKE"):
        UserFilter((condition,)).mask(TABLE.schema)


def test_a_like_pattern_longer_than_pyarrow_compiles_stays_with_duckdb() -> None:
    """pyarrow turns a LIKE pattern into an RE2 regex: about 70,000 '_' exceed RE2's size limit (the filter fails
    while DuckDB answers), and a few thousand '%a' make it search for a minute where DuckDB takes milliseconds."""
    long = "_" * 70_000
    assert _duckdb(f"s LIKE '{long}'") == []
    with pytest.raises(NotSimple):
        _where(f"s LIKE '{long}'")
    with pytest.raises(NotSimple):
        _where(f"s NOT LIKE '{'%a' * (MAX_LIKE_PATTERN // 2 + 1)}'")
    assert _where(f"s LIKE '{'%a' * (MAX_LIKE_PATTERN // 2)}'")
    with pytest.raises(UserFilterMismatch, match="LIKE pattern on 's' is longer than"):
        UserFilter((Condition("s", "like", (long,)),)).mask(TABLE.schema)
