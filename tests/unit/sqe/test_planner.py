"""Planner, SQL analysis and local executor against a real local Iceberg catalog."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, In, StartsWith
from pyiceberg.expressions.parser import parse
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from sqe.catalog.base import TableIdent
from sqe.duckdb_connection import connect_locked_down
from sqe.errors import QueryError, RestrictionError
from sqe.execution import LocalExecutor, QueryCancelledError, ScanMetrics
from sqe.planning import plan_scan
from sqe.planning.planner import _safe_pushdown, format_filter
from sqe.planning.sql_analysis import (
    column_usage,
    columns_to_read,
    find_table_refs,
    parse_select,
    pushdown_predicates,
)
from sqe.planning.statements import classify
from tests.unit.sqe.iceberg_local import DELETED_POSITIONS, EVENT_GROUPS, NUMBER_FILES, ROWS_PER_FILE, LocalProvider

NUMBERS = TableIdent("wh", ("ns",), "numbers")
EVENTS = TableIdent("wh", ("ns",), "events")
DELETED = TableIdent("wh", ("ns",), "deleted")
MANY = TableIdent("wh", ("ns",), "many_batches")


def ids_of(batches: list[pa.RecordBatch]) -> list[int]:
    return sorted(pa.Table.from_batches(batches).column("id").to_pylist()) if batches else []


# ---------------------------------------------------------------------------------------------- planning


def test_plan_counts_files_bytes_and_records(provider: LocalProvider) -> None:
    loaded = provider.load_table(NUMBERS)
    plan = plan_scan(loaded, columns=None)
    assert plan.files_planned == NUMBER_FILES
    assert plan.records_planned == NUMBER_FILES * ROWS_PER_FILE
    assert plan.bytes_planned == sum(t.file.file_size_in_bytes for t in plan.tasks) > 0
    assert plan.delete_files == 0
    assert plan.columns == ("id", "name", "grp")
    assert plan.read.io is loaded.io


def test_partition_predicate_prunes_files(provider: LocalProvider) -> None:
    loaded = provider.load_table(EVENTS)
    assert plan_scan(loaded, columns=None).files_planned == EVENT_GROUPS
    assert plan_scan(loaded, columns=None, pushdown=parse("grp = 2")).files_planned == 1
    assert plan_scan(loaded, columns=None, pushdown=parse("grp IN (1, 3)")).files_planned == 2


def test_statistics_prune_files_of_an_unpartitioned_table(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=["id"], pushdown=parse("id >= 3500"))
    assert plan.files_planned == 1
    rows = ids_of(list(LocalExecutor().record_batches(plan)))
    assert rows == list(range(3500, 4000))  # the filter also runs on rows inside the surviving file


def test_projection_is_case_insensitive_and_unknown_columns_fail(provider: LocalProvider) -> None:
    loaded = provider.load_table(NUMBERS)
    plan = plan_scan(loaded, columns=["NAME"])
    assert plan.columns == ("name",)
    assert plan.arrow_schema.names == ["name"]
    with pytest.raises(QueryError, match="'nope' does not exist"):
        plan_scan(loaded, columns=["nope"])


def test_unbindable_pushdown_is_dropped_not_fatal(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=None, pushdown=parse("nope = 1 AND id = 5"))
    assert plan.row_filter == parse("id = 5")


GRP_IS_1 = {"type": "eq", "left": {"type": "reference", "id": 3}, "right": 1}  # numbers: id=1 name=2 grp=3
MASK_NAME = [{"field-id": 2, "action": "mask-alphanum"}]


def test_restrictions_filter_raw_rows_then_mask_and_drop_filter_only_columns(provider: LocalProvider) -> None:
    provider.restrictions[str(NUMBERS)] = {"required-row-filter": GRP_IS_1, "required-column-projections": MASK_NAME}
    plan = plan_scan(provider.load_table(NUMBERS), columns=["id", "name"])
    assert plan.columns == ("id", "name") and plan.arrow_schema.names == ["id", "name"]
    assert "grp" in plan.read.projected_schema.column_names  # read for the filter, never output
    transform = plan.batch_transform(b"s" * 16)
    assert transform is not None
    table = pa.Table.from_batches(list(LocalExecutor().record_batches(plan, transform=transform)))
    assert table.column_names == ["id", "name"]
    assert table.num_rows == NUMBER_FILES * ROWS_PER_FILE // 5
    assert all(i % 5 == 1 for i in table.column("id").to_pylist())
    assert all(set(name) <= {"x", "n"} for name in table.column("name").to_pylist())


def test_pushdown_on_a_masked_column_never_reaches_pyiceberg(provider: LocalProvider) -> None:
    provider.restrictions[str(NUMBERS)] = {"required-column-projections": MASK_NAME}
    plan = plan_scan(provider.load_table(NUMBERS), columns=None, pushdown=parse("name = 'n6' AND id < 10"))
    assert plan.row_filter == parse("id < 10")
    assert plan.files_planned == 1


def test_invalid_restrictions_fail_closed(provider: LocalProvider) -> None:
    provider.restrictions[str(NUMBERS)] = {"required-column-projections": [{"field-id": 2, "action": "reveal"}]}
    with pytest.raises(RestrictionError, match="unknown action"):
        plan_scan(provider.load_table(NUMBERS), columns=None)
    provider.restrictions[str(NUMBERS)] = {"required-column-projections": [{"field-id": 99, "action": "mask-alphanum"}]}
    with pytest.raises(RestrictionError, match="99"):
        plan_scan(provider.load_table(NUMBERS), columns=None)


def test_false_row_filter_plans_nothing(provider: LocalProvider) -> None:
    provider.restrictions[str(NUMBERS)] = {"required-row-filter": False}
    plan = plan_scan(provider.load_table(NUMBERS), columns=None)
    assert plan.files_planned == 0
    assert plan.describe()["row_filter"] == "always false (no rows)"
    provider.restrictions[str(NUMBERS)] = {}  # an empty object means no restriction
    plan = plan_scan(provider.load_table(NUMBERS), columns=None)
    assert plan.files_planned == NUMBER_FILES and plan.batch_transform(b"s" * 16) is None


def test_describe_shows_masks_and_that_a_filter_applies_but_not_its_values(provider: LocalProvider) -> None:
    provider.restrictions[str(NUMBERS)] = {"required-row-filter": GRP_IS_1, "required-column-projections": MASK_NAME}
    row = plan_scan(provider.load_table(NUMBERS), columns=None, pushdown=parse("id < 7")).describe()
    assert row["masked_columns"] == "name (mask-alphanum)"
    assert row["row_filter"] == "applied"
    assert row["pushed_filter"] == "id < 7"  # the user's part only
    assert "grp" not in repr(row).replace("id, name, grp", "")


def test_describe_has_credentials_and_cache_but_no_secret(provider: LocalProvider) -> None:
    loaded = provider.load_table(EVENTS)
    loaded.io.properties["s3.secret-access-key"] = "SECRETKEY-do-not-show"
    row = plan_scan(loaded, columns=["id"], pushdown=parse("grp = 1")).describe()
    assert row["table"] == "wh.ns.events"
    assert row["files_planned"] == 1 and row["bytes_planned"] > 0
    assert row["credential_source"] == "static" and row["cache"] == "reload"
    assert datetime.fromisoformat(row["credential_expires_at"]).timestamp() == pytest.approx(loaded.expires_at)
    assert row["pushed_filter"] == "grp = 1"
    assert "SECRETKEY" not in repr(row)


def test_a_conjunct_not_pushed_down_is_logged_by_its_shape_without_literals(caplog: pytest.LogCaptureFixture) -> None:
    """Found by review: the debug line named the conjunct and pyiceberg's error, both quoting the WHERE's literal."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False), NestedField(2, "email", StringType(), required=False)
    )
    where = And(EqualTo("id", "alice@corp.example"), In("nosuch", {"x9secret", "y8secret"}))
    with caplog.at_level(logging.DEBUG, logger="sqe.planning.planner"):
        assert _safe_pushdown(schema, where, masked_field_ids=frozenset()) == AlwaysTrue()
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["not pushing id = ?: ValueError", "not pushing nosuch IN (?, ?): ValueError"]
    assert format_filter(StartsWith("email", "alice"), values=False) == "email starts-with ?"


def test_format_filter_renders_sql_like_text() -> None:
    expr: BooleanExpression = parse("s = 'it''s' AND g IN (2, 1) AND q IS NULL")
    assert format_filter(expr) == "s = 'it''s' AND g IN (1, 2) AND q IS NULL"
    assert format_filter(AlwaysTrue()) == ""


# ---------------------------------------------------------------------------------------------- executor


def test_executor_streams_every_row(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=None)
    assert ids_of(list(LocalExecutor().record_batches(plan))) == list(range(NUMBER_FILES * ROWS_PER_FILE))


def test_positional_deletes_are_applied(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(DELETED), columns=["id"])
    assert plan.delete_files == 1
    target = next(iter(plan.tasks[0].delete_files))
    deleted_file = pq.read_table(target.file_path.removeprefix("file://")).column("file_path")[0].as_py()
    file_ids = pq.read_table(deleted_file.removeprefix("file://")).column("id").to_pylist()
    expected_missing = {file_ids[p] for p in DELETED_POSITIONS}
    rows = set(ids_of(list(LocalExecutor().record_batches(plan))))
    assert set(range(NUMBER_FILES * ROWS_PER_FILE)) - rows == expected_missing
    assert len(rows) == NUMBER_FILES * ROWS_PER_FILE - len(DELETED_POSITIONS)


def test_memory_stays_bounded_by_queue_and_files_in_flight(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(MANY), columns=None)
    executor = LocalExecutor(max_files_in_flight=2, max_queued_batches=3)
    metrics = ScanMetrics()
    count = 0
    for _ in executor.record_batches(plan, metrics=metrics):
        time.sleep(0.002)  # a slow consumer lets the readers run ahead as far as they can
        count += 1
    assert count == 40 > executor.max_queued_batches + executor.max_files_in_flight
    assert metrics.max_batches_in_flight <= executor.max_queued_batches + executor.max_files_in_flight
    assert metrics.max_batches_in_flight >= executor.max_queued_batches  # the bound was actually reached
    assert metrics.max_files_in_flight <= 2
    assert metrics.batches_in_flight == 0 and metrics.files_done == plan.files_planned


def test_transform_runs_on_every_batch(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=["id"])
    calls = []

    def shift(batch: pa.RecordBatch) -> pa.RecordBatch:
        calls.append(batch.num_rows)
        return pa.record_batch([pc.add(batch.column(0), 1)], names=["id"])

    rows = ids_of(list(LocalExecutor().record_batches(plan, transform=shift)))
    assert rows == list(range(1, NUMBER_FILES * ROWS_PER_FILE + 1))
    assert sum(calls) == NUMBER_FILES * ROWS_PER_FILE


def test_cancel_stops_a_scan_whose_producer_is_slow(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(MANY), columns=None)
    cancel = threading.Event()

    def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(0.15)
        return batch

    stream = LocalExecutor(max_files_in_flight=1, max_queued_batches=1).record_batches(
        plan, cancel=cancel, transform=slow
    )
    next(stream)
    readers = [t for t in threading.enumerate() if t.name.startswith("sqe-scan-")]
    assert readers
    cancel.set()
    started = time.monotonic()
    with pytest.raises(QueryCancelledError):
        next(stream)
    assert time.monotonic() - started < 0.2  # the consumer does not wait for the slow producer
    for reader in readers:
        reader.join(1.0)
        assert not reader.is_alive()  # the reader thread noticed and left


def test_reader_error_reaches_the_consumer(provider: LocalProvider) -> None:
    plan = plan_scan(provider.load_table(NUMBERS), columns=None)

    def boom(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise RestrictionError("mask failed")

    with pytest.raises(RestrictionError, match="mask failed"):
        list(LocalExecutor().record_batches(plan, transform=boom))


# ---------------------------------------------------------------------------------------------- SQL analysis


@pytest.fixture(scope="module")
def parser() -> Iterator[duckdb.DuckDBPyConnection]:
    con = connect_locked_down()
    yield con
    con.close()


def refs(parser: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[str, ...]]:
    return [r.parts for r in find_table_refs(parse_select(parser, sql))]


def test_table_refs_ignore_ctes_and_single_part_names(parser: duckdb.DuckDBPyConnection) -> None:
    sql = 'WITH numbers AS (SELECT 1 AS id) SELECT * FROM numbers, ns.t JOIN wh."N s".u ON true, x'
    assert refs(parser, sql) == [("ns", "t"), ("wh", "N s", "u")]
    assert refs(parser, "SELECT (SELECT max(a) FROM ns.t) FROM (SELECT 1) s WHERE 1 IN (SELECT b FROM ns.u)") == [
        ("ns", "t"),
        ("ns", "u"),
    ]


def read_columns(parser: duckdb.DuckDBPyConnection, sql: str, provider: LocalProvider) -> list[str] | None:
    tree = parse_select(parser, sql)
    table_refs = find_table_refs(tree)
    return columns_to_read(column_usage(tree), table_refs, provider.load_table(NUMBERS).table.schema())


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT name FROM ns.numbers WHERE id > 3", ["id", "name"]),
        ("SELECT count(*) FROM ns.numbers", ["grp"]),  # the narrowest column carries the row count
        ("SELECT * FROM ns.numbers", None),
        ("SELECT n.* FROM ns.numbers n", None),
        ("SELECT #1 FROM ns.numbers", None),
        ("SELECT n FROM ns.numbers n", None),  # whole-row struct
        ("SELECT c1 FROM ns.numbers AS x(c1, c2)", None),  # positional renames
        ("SELECT 1 FROM ns.numbers NATURAL JOIN ns.other", None),
        ("SELECT COLUMNS('n.*') FROM ns.numbers", None),
        ("DESCRIBE ns.numbers", None),
        ("SELECT x.NAME FROM ns.numbers x JOIN ns.other USING (grp)", ["name", "grp"]),
    ],
)
def test_columns_to_read(
    parser: duckdb.DuckDBPyConnection, provider: LocalProvider, sql: str, expected: object
) -> None:
    assert read_columns(parser, sql, provider) == expected


def pushed(parser: duckdb.DuckDBPyConnection, sql: str, provider: LocalProvider) -> list[str]:
    tree = parse_select(parser, sql)
    schemas: dict[tuple[str, ...], Schema] = {("ns", "events"): provider.load_table(EVENTS).table.schema()}
    found = pushdown_predicates(tree, lambda ref: ref.parts, schemas)
    return [format_filter(e) for e in found.get(("ns", "events"), [])]


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM ns.events WHERE grp = 2 AND 3 > id", ["grp = 2", "id < 3"]),
        (
            "SELECT * FROM ns.events e WHERE e.grp IN (1, 2) AND label IS NOT NULL",
            ["grp IN (1, 2)", "label IS NOT NULL"],
        ),
        (
            "SELECT * FROM ns.events WHERE day = DATE '2024-01-02' AND day >= '2024-01-01'",
            ["day = '2024-01-02'", "day >= '2024-01-01'"],
        ),
        ("SELECT * FROM ns.events WHERE id BETWEEN 5 AND 9", ["id >= 5", "id <= 9"]),
        ("SELECT * FROM ns.events WHERE grp = 2 OR grp = 3", []),  # not a conjunct
        ("SELECT * FROM ns.events WHERE grp = '2'", []),  # DuckDB would cast; types must match exactly
        ("SELECT * FROM ns.events WHERE grp = 1.5", []),
        ("SELECT * FROM ns.events WHERE grp + 0 = 2", []),
        ("SELECT * FROM ns.events WHERE grp = $1", []),
        ("SELECT * FROM ns.events WHERE label COLLATE nocase = 'x'", []),
        ("SELECT * FROM ns.events WHERE NOT grp = 2", []),
        ("SELECT * FROM ns.other o LEFT JOIN ns.events e ON true WHERE e.grp = 2", []),  # outer join
        ("SELECT * FROM ns.events, (SELECT 1 AS grp) s WHERE grp = 2", []),  # unqualified, subquery in FROM
        ("SELECT * FROM ns.events e, (SELECT 1 AS grp) s WHERE e.grp = 2", ["grp = 2"]),
        ("SELECT id AS grp FROM ns.events WHERE grp = 2", []),  # select-list alias shadows
        ("SELECT * FROM ns.events TABLESAMPLE 5 ROWS WHERE grp = 2", []),  # the sample comes first
        ("SELECT * FROM ns.events WHERE grp = 2 USING SAMPLE 5 ROWS", []),
    ],
)
def test_pushdown_predicates(
    parser: duckdb.DuckDBPyConnection, provider: LocalProvider, sql: str, expected: list[str]
) -> None:
    assert pushed(parser, sql, provider) == expected


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELECT 1;", "select"),
        ("FROM ns.t", "select"),
        ("EXPLAIN SELECT 1", "explain"),
        ("INSERT INTO ns.t SELECT 1", "insert"),
        ("CREATE TABLE IF NOT EXISTS ns.t AS SELECT 1", "ctas"),
        ("PREPARE p AS SELECT $1", "prepare"),
        ("EXECUTE p(1)", "execute"),
        ("DEALLOCATE p", "deallocate"),
        ("EXPLAIN ANALYZE SELECT 1", "explain"),
        ("CREATE TABLE ns.t (a INT)", "create_table"),
        ("CREATE SCHEMA IF NOT EXISTS wh.ns", "create_schema"),
        ("DROP SCHEMA ns", "drop_schema"),
        ("DROP TABLE IF EXISTS ns.t", "drop_table"),
        ("ALTER TABLE ns.t ADD COLUMN c DECIMAL(10, 2)", "alter_table"),
        ("SHOW SCHEMAS", "show_schemas"),
        ("SHOW TABLES FROM ns", "show_tables"),
        ("SHOW CREATE TABLE ns.t", "show_create_table"),
        ("DESCRIBE ns.t", "describe"),
        ("DELETE FROM ns.t WHERE a = 1", "delete"),
        ("UPDATE ns.t SET a = 1", "update"),
        ("MERGE INTO ns.t USING ns.s ON t.a = s.a WHEN MATCHED THEN DELETE", "merge"),
        ("SELECT * FROM ns.t FOR VERSION AS OF 1", "select"),
        ("CREATE VIEW ns.v AS SELECT 1", "create_view"),
        ("CREATE OR REPLACE VIEW wh.ns.v AS SELECT * FROM ns.t", "create_view"),
        ("DROP VIEW IF EXISTS ns.v", "drop_view"),
        ("SHOW VIEWS FROM ns", "show_views"),
    ],
)
def test_classify_accepts(parser: duckdb.DuckDBPyConnection, sql: str, kind: str) -> None:
    assert classify(parser, sql).kind == kind


@pytest.mark.parametrize(
    "sql",
    [
        "SET threads = 1",
        "ATTACH ':memory:' AS x",
        "COPY (SELECT 1) TO '/tmp/x.csv'",
        "INSTALL httpfs",
        "CREATE TEMP VIEW ns.v AS SELECT 1",
        "CREATE VIEW ns.v (a) AS SELECT 1",
        "CREATE OR REPLACE VIEW IF NOT EXISTS ns.v AS SELECT 1",
        "CREATE VIEW ns.v",
        "INSERT OR REPLACE INTO ns.t VALUES (1)",
        "INSERT INTO ns.t VALUES (1) RETURNING *",
        "WITH c AS (SELECT 1) INSERT INTO ns.t SELECT * FROM c",
        "DROP VIEW ns.v CASCADE",
        "ALTER TABLE ns.t ALTER COLUMN a SET DATA TYPE BIGINT",
        "DELETE FROM ns.t WHERE a = 1 RETURNING *",
        "SELECT * FROM ns.t FOR VERSION AS OF",
        "SELECT 1; SELECT 2",
        "PRAGMA version",
        "CALL pragma_version()",
    ],
)
def test_classify_refuses(parser: duckdb.DuckDBPyConnection, sql: str) -> None:
    with pytest.raises(QueryError):
        classify(parser, sql)


def test_insert_parts(parser: duckdb.DuckDBPyConnection) -> None:
    sql = 'INSERT INTO wh."my ns".t (a, b) SELECT * FROM ns.u JOIN ns.v ON true'
    statement = classify(parser, sql)
    assert statement.target == ("wh", "my ns", "t")
    assert statement.target_span is not None
    assert sql[slice(*statement.target_span)] == 'wh."my ns".t'
    assert statement.body == "SELECT * FROM ns.u JOIN ns.v ON true"
    assert classify(parser, "INSERT INTO ns.t BY NAME (SELECT 1 AS a)").body == "(SELECT 1 AS a)"
    assert classify(parser, "INSERT INTO ns.t DEFAULT VALUES").body is None


def test_non_ascii_names_and_literals_never_shift_a_cut(parser: duckdb.DuckDBPyConnection) -> None:
    # DuckDB's tokenizer counts UTF-8 bytes; the statement parts are cut by character.
    insert = classify(parser, 'INSERT INTO "tä" SELECT \'日本\' AS "naïve" -- ü comment\n')
    assert insert.target == ("tä",) and insert.text[slice(*insert.target_span)] == '"tä"'  # type: ignore[misc]
    assert insert.body == "SELECT '日本' AS \"naïve\" -- ü comment"
    ctas = classify(parser, "CREATE TABLE ns.\"größe\" AS SELECT '€' AS x")
    assert ctas.target == ("ns", "größe") and ctas.body == "SELECT '€' AS x"
    travel = classify(parser, "SELECT 'é' FROM ns.\"tä\" FOR VERSION AS OF 5 x")
    assert travel.text == "SELECT 'é' FROM \"__sqe_tt_0\" x"
    assert [(t.parts, t.value) for t in travel.travels] == [(("ns", "tä"), "5")]


@pytest.mark.parametrize(
    "metadata",
    [
        {"properties": {"encryption.key-id": "K1"}},
        {"properties": {}, "encryption-keys": [{"key-id": "k", "encrypted-key-metadata": "AA=="}]},
    ],
    ids=["key-id", "encryption-keys"],
)
def test_encrypted_tables_fail_typed_before_any_file_is_read(provider: LocalProvider, metadata: dict[str, Any]) -> None:
    import dataclasses

    from sqe.errors import EncryptedTableError

    loaded = provider.load_table(NUMBERS)
    # The check reads only the inline metadata of the catalog's response, never metadata-location from storage:
    # a metadata-location that does not exist proves nothing is reread.
    raw = {**loaded.raw, "metadata": metadata, "metadata-location": "file:///nonexistent/v9.metadata.json"}
    with pytest.raises(EncryptedTableError, match="encrypted Iceberg tables are not readable by SQE yet"):
        plan_scan(dataclasses.replace(loaded, raw=raw), columns=None)


def test_time_travel_is_rewritten_to_placeholders(parser: duckdb.DuckDBPyConnection) -> None:
    statement = classify(
        parser, "SELECT * FROM ns.t FOR VERSION AS OF 5 JOIN wh.ns.t AT (TIMESTAMP => now()) b ON true"
    )
    assert statement.text == 'SELECT * FROM "__sqe_tt_0" AS "t" JOIN "__sqe_tt_1" b ON true'
    assert [(t.parts, t.kind, t.value) for t in statement.travels] == [
        (("ns", "t"), "version", "5"),
        (("wh", "ns", "t"), "timestamp", "now()"),
    ]
    tagged = classify(parser, "SELECT 1 FROM ns.t FOR TIMESTAMP AS OF TIMESTAMP '2024-01-01 00:00:00' x")
    assert tagged.travels[0].value == "TIMESTAMP '2024-01-01 00:00:00'" and tagged.text.endswith('"__sqe_tt_0" x')


def test_dml_and_ddl_statements_carry_their_parts(parser: duckdb.DuckDBPyConnection) -> None:
    merge = classify(
        parser, "MERGE INTO ns.t AS x USING (SELECT * FROM wh.ns.s) s ON x.a = s.a WHEN MATCHED THEN DELETE"
    )
    assert merge.target == ("ns", "t") and not merge.alias_missing and merge.sources == (("wh", "ns", "s"),)
    delete = classify(parser, "DELETE FROM ns.t WHERE a IN (SELECT a FROM ns.o)")
    assert delete.alias_missing and delete.sources == (("ns", "o"),)
    assert delete.text[slice(*delete.target_span)] == "ns.t"  # type: ignore[misc]
    alter = classify(parser, 'ALTER TABLE ns.t RENAME COLUMN "a b" TO c')
    assert alter.alter is not None and (alter.alter.action, alter.alter.column, alter.alter.new_name) == (
        "rename",
        "a b",
        "c",
    )
    added = classify(parser, "ALTER TABLE ns.t ADD COLUMN d DECIMAL(10, 2)")
    assert added.alter is not None and added.alter.type_text == "DECIMAL(10, 2)"
    assert classify(parser, "SHOW TABLES FROM wh.ns").target == ("wh", "ns")
    assert classify(parser, "CREATE SCHEMA IF NOT EXISTS wh.ns").if_not_exists
    assert classify(parser, "DROP TABLE IF EXISTS ns.t").if_exists
    assert classify(parser, "EXPLAIN ANALYZE SELECT 1").analyze


def test_view_statement_parts(parser: duckdb.DuckDBPyConnection) -> None:
    replaced = classify(parser, "CREATE OR REPLACE VIEW wh.ns.v AS WITH c AS (SELECT 1 AS a) SELECT a FROM c;")
    assert (replaced.target, replaced.or_replace, replaced.if_not_exists) == (("wh", "ns", "v"), True, False)
    assert replaced.body == "WITH c AS (SELECT 1 AS a) SELECT a FROM c"
    guarded = classify(parser, 'CREATE VIEW IF NOT EXISTS ns."my view" AS SELECT 1')
    assert (guarded.target, guarded.or_replace, guarded.if_not_exists) == (("ns", "my view"), False, True)
    dropped = classify(parser, "DROP VIEW IF EXISTS ns.v")
    assert (dropped.target, dropped.if_exists) == (("ns", "v"), True)
    assert classify(parser, "SHOW VIEWS").target is None
