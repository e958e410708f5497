"""The partial-aggregate recognizer and the final merge query (no servers: DuckDB's parse and in-memory tables)."""

from __future__ import annotations

import datetime

import duckdb
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import assign_fresh_schema_ids

from sqe.catalog.base import TableIdent
from sqe.distributed.coordinator.aggregate import AggregateShape, ScanShape, prepare, recognise
from sqe.distributed.protocol.filters import filter_from_proto, filter_to_proto
from sqe.distributed.protocol.partial import PartialAggregate, partial_types
from sqe.planning.sql_analysis import TableRef, parse_select
from sqe.planning.user_filter import AllOf, AnyOf, Condition, UserFilter

IDENT = TableIdent("wh", ("ns",), "t")
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("grp", pa.large_string()),
        ("amount", pa.int32()),
        ("price", pa.float64()),
        ("tags", pa.list_(pa.string())),
    ]
)


def _scan(schema: pa.Schema) -> ScanShape:
    """The scan of ``schema`` (its Iceberg read schema converted from Arrow, as CREATE TABLE would)."""
    return ScanShape(IDENT, schema, assign_fresh_schema_ids(Catalog._convert_schema_if_needed(schema)))


def _resolve(ref: TableRef) -> TableIdent:
    return TableIdent("wh", tuple(p.lower() for p in ref.parts[:-1]), ref.parts[-1].lower())


@pytest.fixture(scope="module")
def parser() -> duckdb.DuckDBPyConnection:
    return duckdb.connect()


def _recognised(parser: duckdb.DuckDBPyConnection, sql: str) -> AggregateShape | None:
    return recognise(parse_select(parser, sql), _scan(SCHEMA), _resolve)


def _shape(parser: duckdb.DuckDBPyConnection, sql: str) -> PartialAggregate | None:
    shape = _recognised(parser, sql)
    return None if shape is None else shape.spec


@pytest.mark.parametrize(
    ("sql", "group_by", "aggregates"),
    [
        ("SELECT count(*) FROM ns.t", (), (("count_star", ""),)),
        (
            "SELECT grp, count(*) AS n, sum(amount), min(id), max(x.grp), count(price) FROM ns.t AS x GROUP BY grp",
            ("grp",),
            (("count_star", ""), ("sum", "amount"), ("min", "id"), ("max", "grp"), ("count", "price")),
        ),
        ("SELECT sum(price) FROM ns.t", (), (("sum", "price"),)),
        ("SELECT GRP, ID FROM ns.t GROUP BY grp, t.id", ("grp", "id"), ()),
        ("SELECT count(*) FROM ns.t GROUP BY grp", ("grp",), (("count_star", ""),)),
        ("SELECT count(*) FROM ns.t WHERE price > 1.5 OR price IN (0, -0.25)", (), (("count_star", ""),)),
    ],
)
def test_eligible_shapes(
    parser: duckdb.DuckDBPyConnection, sql: str, group_by: tuple[str, ...], aggregates: tuple[tuple[str, str], ...]
) -> None:
    assert _shape(parser, sql) == PartialAggregate(group_by, aggregates)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) FROM ns.t WHERE id % 3 = 0",
        "SELECT count(*) FROM ns.t WHERE NOT (id % 3 = 0)",
        "SELECT count(*) FROM ns.t WHERE NOT id",
        "SELECT count(*) FROM ns.t WHERE id > 3 OR FALSE",
        "SELECT count(*) FROM ns.t WHERE id > 3 OR lower(grp) = 'a'",
        "SELECT count(*) FROM ns.t WHERE price > 9007199254740993",  # no double holds it exactly
        "SELECT count(*) FROM ns.t WHERE grp = 1",  # a constant of another family: DuckDB's cast rules
        "SELECT count(*) FROM ns.t WHERE id = 'x'",
        "SELECT count(*) FROM ns.t WHERE lower(grp) = 'a'",
        "SELECT count(*) FROM ns.t WHERE nope = 1",
        "SELECT count(*) FROM ns.t WHERE amount IN (1, 2, 99999999999)",  # out of the int32 column's range
        "SELECT count(*) FROM ns.t WHERE id IN (SELECT 1)",
        "SELECT count(DISTINCT id) FROM ns.t",
        "SELECT avg(amount) FROM ns.t",
        "SELECT sum(amount + 1) FROM ns.t",
        "SELECT sum(amount) * 2 FROM ns.t",
        "SELECT sum(amount) FILTER (WHERE id > 1) FROM ns.t",
        "SELECT string_agg(grp ORDER BY id) FROM ns.t",
        "SELECT max(grp ORDER BY id) FROM ns.t",
        "SELECT count(*) FROM ns.t a JOIN ns.t b ON a.id = b.id",
        "SELECT count(*) FROM ns.t LIMIT 1",
        "SELECT grp, count(*) FROM ns.t GROUP BY grp ORDER BY grp",
        "SELECT DISTINCT grp FROM ns.t",
        "SELECT grp, count(*) FROM ns.t GROUP BY grp HAVING count(*) > 1",
        "SELECT grp, count(*) FROM ns.t GROUP BY ALL",
        "SELECT grp, count(*) FROM ns.t GROUP BY ROLLUP (grp)",
        "SELECT grp, count(*) FROM ns.t GROUP BY 1",
        "SELECT grp AS id, count(*) FROM ns.t GROUP BY id",
        "SELECT price, count(*) FROM ns.t GROUP BY price",
        "SELECT count(tags) FROM ns.t",
        "SELECT sum(grp) FROM ns.t",
        "SELECT id, count(*) FROM ns.t",
        "SELECT grp FROM ns.t",
        "SELECT count(*) FROM ns.other",
        "SELECT count(*) FROM ns.t TABLESAMPLE 10%",
        "WITH c AS (SELECT * FROM ns.t) SELECT count(*) FROM c",
        "SELECT count(*) FROM (SELECT * FROM ns.t)",
        "SELECT count(*), row_number() OVER () FROM ns.t",
        "SELECT main.sum(amount) FROM ns.t",
        "SELECT grp, count(*) FROM ns.t GROUP BY grp QUALIFY count(*) > 1",
        "SELECT count(*) FROM ns.t OFFSET 1",
        "SELECT count(nope) FROM ns.t",
        "SELECT count(other.id) FROM ns.t",
    ],
)
def test_ineligible_shapes_run_as_before(parser: duckdb.DuckDBPyConnection, sql: str) -> None:
    assert _shape(parser, sql) is None


def _merged(parser: duckdb.DuckDBPyConnection, sql: str, parts: list[pa.Table], table: pa.Table) -> pa.Table:
    """Run ``sql`` over ``table`` in DuckDB directly, and through partial rows of ``parts`` plus the final query."""
    con = duckdb.connect()
    con.execute("CREATE SCHEMA ns")
    con.register("t_arrow", table)
    con.execute("CREATE VIEW ns.t AS SELECT * FROM t_arrow")
    original = con.sql(sql)
    prepared = prepare(
        parse_select(parser, sql), _scan(table.schema), _resolve, lambda: (original.columns, original.types)
    )
    assert prepared is not None
    partial_rows = []
    for part in parts:  # what each worker runs (its WHERE included) over its fragment's rows
        worker = duckdb.connect()
        worker.register("__sqe_fragment", part)
        text, parameters = prepared.shape.spec.sql(where=prepared.partial.where)
        partial_rows.append(worker.sql(text, params=parameters or None).to_arrow_table().cast(prepared.partial.schema))
    con.register("partials", pa.concat_tables(partial_rows) if partial_rows else prepared.partial.schema.empty_table())
    return con.sql(prepared.final_sql("partials")).to_arrow_table()


def _direct(sql: str, table: pa.Table) -> pa.Table:
    con = duckdb.connect()
    con.register("data", table)
    return con.sql(sql.replace("ns.t", "data")).to_arrow_table()


def _data() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(10), pa.int64()),
            "grp": pa.array(["a", "b", None, "a", "b", "a", None, "c", "a", "b"], pa.large_string()),
            "amount": pa.array([1, None, 3, 4, 5, None, 7, 8, 9, 10], pa.int32()),
        }
    )


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT grp, count(*) AS n, count(amount), sum(amount) AS s, min(amount), max(grp) FROM ns.t GROUP BY grp",
        "SELECT count(*), sum(id), min(grp), max(grp) FROM ns.t",
        "SELECT sum(amount), grp FROM ns.t GROUP BY grp",
        # With a WHERE, which each worker's partial query runs over its fragment's rows:
        "SELECT grp, count(*) AS n, sum(amount) AS s FROM ns.t WHERE amount >= 4 GROUP BY grp",
        "SELECT count(*), min(grp) FROM ns.t WHERE grp <> 'a' AND id < 8",
        "SELECT count(*), sum(amount) FROM ns.t WHERE amount IS NULL",
        "SELECT count(*) AS n, sum(amount) AS s FROM ns.t WHERE id > 100",  # no row kept: 0 and NULL
        "SELECT grp, count(*) FROM ns.t WHERE grp IN ('a', 'c') GROUP BY grp",
        "SELECT grp, count(*), sum(amount) FROM ns.t WHERE amount > 8 OR grp IS NULL OR (id < 3 AND grp = 'a') "
        "GROUP BY grp",
    ],
)
def test_the_final_query_gives_duckdbs_own_names_types_and_values(parser: duckdb.DuckDBPyConnection, sql: str) -> None:
    table = _data()
    expected = _direct(sql, table)
    got = _merged(parser, sql, [table.slice(0, 3), table.slice(3, 0), table.slice(3)], table)
    assert got.schema == expected.schema
    assert sorted(map(str, got.to_pylist())) == sorted(map(str, expected.to_pylist()))


@pytest.mark.parametrize(
    ("sql", "conditions"),
    [
        ("SELECT count(*) FROM ns.t WHERE id > 3", (Condition("id", "gt", (3,)),)),
        ("SELECT count(*) FROM ns.t WHERE 3 < id", (Condition("id", "gt", (3,)),)),  # flipped
        (
            "SELECT grp, sum(amount) FROM ns.t WHERE grp IN ('a', 'b') AND amount BETWEEN 2 AND 9 "
            "AND t.id IS NOT NULL GROUP BY grp",
            (
                Condition("grp", "in", ("a", "b")),
                Condition("amount", "ge", (2,)),
                Condition("amount", "le", (9,)),
                Condition("id", "is_not_null"),
            ),
        ),
        ("SELECT count(*) FROM ns.t WHERE price IS NULL", (Condition("price", "is_null"),)),
        (
            "SELECT count(*) FROM ns.t WHERE (id > 3 OR grp = 'a' OR (amount BETWEEN 1 AND 2 AND id < 0)) AND id <> 9",
            (
                AnyOf(
                    (
                        Condition("id", "gt", (3,)),
                        Condition("grp", "eq", ("a",)),
                        AllOf(
                            (
                                Condition("amount", "ge", (1,)),
                                Condition("amount", "le", (2,)),
                                Condition("id", "lt", (0,)),
                            )
                        ),
                    )
                ),
                Condition("id", "ne", (9,)),
            ),
        ),
    ],
)
def test_a_simple_where_goes_with_the_spec(
    parser: duckdb.DuckDBPyConnection, sql: str, conditions: tuple[Condition, ...]
) -> None:
    shape = _recognised(parser, sql)
    assert shape is not None and shape.where == UserFilter(conditions)
    assert "the WHERE keeps" in shape.describe()


def test_a_where_larger_than_a_ticket_carries_stays_with_duckdb(parser: duckdb.DuckDBPyConnection) -> None:
    """Every WHERE the coordinator accepts is one a worker decodes: more conditions, or a longer IN list, than a
    ticket's user_filter may carry would fail the query as an invalid ticket; such a statement runs as before."""
    at_limit = "SELECT count(*) FROM ns.t WHERE " + " AND ".join(f"id <> {i}" for i in range(1000))
    shape = _recognised(parser, at_limit)
    assert shape is not None and shape.where is not None
    assert filter_from_proto(filter_to_proto(shape.where)) == shape.where
    assert _recognised(parser, at_limit + " AND id <> 1000") is None
    long_in = "SELECT count(*) FROM ns.t WHERE id IN (" + ", ".join(str(i) for i in range(100_001)) + ")"
    assert _recognised(parser, long_in) is None
    text = "x" * 1000

    def strings(count: int) -> str:  # about 1 kB of string constant each
        return "SELECT count(*) FROM ns.t WHERE grp IN (" + ", ".join(f"'{text}{i}'" for i in range(count)) + ")"

    assert _recognised(parser, strings(1000)) is not None  # 1,003,890 bytes: inside MAX_TEXT_BYTES (1 MiB)
    assert _recognised(parser, strings(1100)) is None


def test_a_date_constant_is_a_date() -> None:
    schema = pa.schema([("day", pa.date32()), ("n", pa.int64())])
    con = duckdb.connect()
    shape = recognise(parse_select(con, "SELECT sum(n) FROM ns.t WHERE day >= '2024-02-01'"), _scan(schema), _resolve)
    assert shape is not None and shape.where == UserFilter((Condition("day", "ge", (datetime.date(2024, 2, 1),)),))
    not_a_day = "SELECT sum(n) FROM ns.t WHERE day >= '2024-02-30'"  # DuckDB runs it and reports the bad date
    assert recognise(parse_select(con, not_a_day), _scan(schema), _resolve) is None


def test_count_over_no_partial_rows_is_zero_and_sums_stay_hugeint(parser: duckdb.DuckDBPyConnection) -> None:
    table = _data().slice(0, 0)
    sql = "SELECT count(*) AS n, count(amount) AS c, sum(id) AS s, min(grp) AS m FROM ns.t"
    got = _merged(parser, sql, [], table)
    expected = _direct(sql, table)
    assert got.schema == expected.schema and got.to_pylist() == [{"n": 0, "c": 0, "s": None, "m": None}]
    assert partial_types(PartialAggregate((), (("sum", "id"),)), table.schema)[1] == ["HUGEINT"]


def test_every_accepted_type_comes_back_as_duckdbs_own_type(parser: duckdb.DuckDBPyConnection) -> None:
    """Decimals, dates, zoned timestamps, booleans, narrow integers and floats survive the partial round trip
    (Arrow out of one DuckDB, into another) with the type DuckDB gives the original statement."""
    import datetime as dt
    from decimal import Decimal

    n = 12
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "grp": pa.array(["a", "b", "c"] * 4, pa.string()),
            "d": pa.array([Decimal(f"{i}.25") for i in range(n)], pa.decimal128(10, 2)),
            "day": pa.array([dt.date(2024, 1, 1 + i) for i in range(n)], pa.date32()),
            "ts": pa.array([dt.datetime(2024, 1, 1, i, tzinfo=dt.UTC) for i in range(n)], pa.timestamp("us", "UTC")),
            "flag": pa.array([i % 2 == 0 for i in range(n)], pa.bool_()),
            "tiny": pa.array([i - 6 for i in range(n)], pa.int8()),
            "f": pa.array([i / 3 for i in range(n)], pa.float32()),
        }
    )
    sql = (
        "SELECT grp, day, sum(d), min(d), max(day), min(ts), max(ts), min(flag), max(flag), sum(tiny), "
        "min(tiny), sum(f), count(ts) FROM ns.t GROUP BY grp, day"
    )
    expected = _direct(sql, table)
    got = _merged(parser, sql, [table.slice(0, 5), table.slice(5)], table)
    assert got.schema == expected.schema
    assert sorted(map(str, got.to_pylist())) == sorted(map(str, expected.to_pylist()))
