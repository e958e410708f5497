"""The SQL a Trino / Spark / DuckDB user expects, against the real stack (sqe-catalog + moto, vended credentials).

DDL and discovery answer from the catalog; DELETE / UPDATE / MERGE rewrite files copy-on-write and pyiceberg, a
third-party client, reads back exactly what SQE reads; time travel by snapshot id, timestamp, branch and tag;
metadata tables; EXPLAIN [ANALYZE] in its vertical layout.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import ListType, LongType, MapType, NestedField, StringType, StructType

import sqe.api
from sqe.catalog.base import LoadedTable, TableIdent
from sqe.errors import CommitConflictError, NoSuchNamespaceError, NoSuchTableError, QueryError, SQEError
from sqe.execution import dml
from sqe.execution.commit import append_rows
from sqe.planning.planner import plan_scan
from sqe.session import Session, explain_sections
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.helpers.fault_proxy import running_proxy
from tests.helpers.orphans import data_objects, parquet_rows, referenced
from tests.unit.sqe.iceberg_local import add_positional_deletes

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


@pytest.fixture(scope="module")
def owner(catalog_server: CatalogServer) -> CatalogPrincipal:
    """Creates, writes, alters and drops (the shared engine_writer may not drop)."""
    grants = [(g, None, None) for g in ("NAMESPACE_FULL_METADATA", "TABLE_CREATE", "TABLE_WRITE_DATA", "TABLE_DROP")]
    return catalog_server.principal_with_grants(f"sql_owner_{uuid.uuid4().hex[:6]}", grants)


@pytest.fixture(scope="module")
def config(catalog_server: CatalogServer, owner: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("engine-sql") / "sqe.toml"
    return write_sqe_config(path, catalog_server.url, owner, catalog_server.moto)


@pytest.fixture()
def namespace(config: Path) -> str:
    name = f"sql_{uuid.uuid4().hex[:6]}"
    with sqe.api.connect(config) as session:
        session.sql(f"CREATE SCHEMA {name}")
    return name


def rows(session: Session, sql: str) -> list[tuple[Any, ...]]:
    return sorted(session.sql(sql).fetchall(), key=repr)


def pyiceberg_rows(server: CatalogServer, principal: CatalogPrincipal, name: str) -> list[tuple[Any, ...]]:
    table = pyiceberg_catalog(server, principal).load_table(name).scan().to_arrow()
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def test_schemas_tables_and_schema_evolution_through_sql(config: Path) -> None:
    name = f"ddl_{uuid.uuid4().hex[:6]}"
    with sqe.api.connect(config) as session:
        session.sql(f"CREATE SCHEMA IF NOT EXISTS {name}")
        session.sql(f"CREATE SCHEMA IF NOT EXISTS {name}")  # exists: no error
        with pytest.raises(CommitConflictError):
            session.sql(f"CREATE SCHEMA {name}")
        assert name in session.sql("SHOW SCHEMAS").arrow().column("schema").to_pylist()
        session.sql(f"CREATE TABLE {name}.t (id BIGINT NOT NULL, label VARCHAR, price DECIMAL(10, 2))")
        session.sql(f"CREATE TABLE {name}.u AS SELECT 1 AS x")
        listed = session.sql(f"SHOW TABLES FROM {name}").arrow().to_pylist()
        assert [r["table"] for r in listed] == ["t", "u"]
        assert {"namespace": name, "table": "t"}.items() <= listed[0].items()
        every = session.sql("SHOW TABLES").arrow().to_pylist()
        assert {(r["namespace"], r["table"]) for r in every} >= {(name, "t"), (name, "u")}
        described = session.sql(f"DESCRIBE {name}.t").arrow().to_pylist()
        assert [(r["column_name"], r["column_type"], r["required"]) for r in described] == [
            ("id", "BIGINT", True),
            ("label", "VARCHAR", False),
            ("price", "DECIMAL(10, 2)", False),
        ]
        session.sql(f"INSERT INTO {name}.t VALUES (1, 'a', 1.50)")
        session.sql(f"ALTER TABLE {name}.t ADD COLUMN qty INTEGER")
        session.sql(f"ALTER TABLE {name}.t RENAME COLUMN label TO title")
        session.sql(f"ALTER TABLE {name}.t DROP COLUMN price")
        session.sql(f"INSERT INTO {name}.t VALUES (2, 'b', 7)")
        assert rows(session, f"SELECT id, title, qty FROM {name}.t") == [(1, "a", None), (2, "b", 7)]
        [[created]] = session.sql(f"SHOW CREATE TABLE {name}.t").fetchall()
        assert '"id" BIGINT NOT NULL' in created and '"title" VARCHAR' in created and "price" not in created
        with pytest.raises(QueryError, match="cannot change the schema"):
            session.sql(f"ALTER TABLE {name}.t DROP COLUMN nope")
        session.sql(f"DROP TABLE {name}.u")
        session.sql(f"DROP TABLE IF EXISTS {name}.u")
        with pytest.raises(NoSuchTableError):
            session.sql(f"DROP TABLE {name}.u")
        assert [r["table"] for r in session.list_tables(name).to_pylist()] == ["t"]  # the shell's \dt
        session.sql(f"DROP TABLE {name}.t")
        session.sql(f"DROP SCHEMA {name}")
        session.sql(f"DROP SCHEMA IF EXISTS {name}")
        with pytest.raises(NoSuchNamespaceError):
            session.sql(f"DROP SCHEMA {name}")


def test_delete_update_merge_copy_on_write_read_back_by_pyiceberg(
    config: Path, namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal
) -> None:
    table = f"{namespace}.orders"
    with sqe.api.connect(config) as session:
        session.sql(f"CREATE TABLE {table} AS SELECT * FROM (VALUES (1, 'ada', 10), (2, 'bob', 20)) v(id, who, n)")
        session.sql(f"INSERT INTO {table} VALUES (3, 'cy', 30), (4, 'di', 40)")  # a second file
        assert session.sql(f"DELETE FROM {table} WHERE n > 35").fetchall() == [(1,)]
        files = session.sql(f'SELECT file_path FROM {namespace}."orders$files"').fetchall()
        assert len(files) == 2  # only the second file was rewritten; the first stayed as it was
        assert session.sql(f"UPDATE {table} SET n = n + 1 WHERE who IN ('ada', 'cy')").fetchall() == [(2,)]
        session.sql(
            f"CREATE TABLE {namespace}.changes AS SELECT * FROM (VALUES (2, 'bob', 0), (5, 'ed', 50)) c(id, who, n)"
        )
        merged = session.sql(
            f"MERGE INTO {table} o USING {namespace}.changes c ON o.id = c.id "
            "WHEN MATCHED THEN UPDATE SET n = c.n WHEN NOT MATCHED THEN INSERT VALUES (c.id, c.who, c.n)"
        ).fetchall()
        assert merged == [(2,)]
        expected = [(1, "ada", 11), (2, "bob", 0), (3, "cy", 31), (5, "ed", 50)]
        assert rows(session, f"SELECT * FROM {table}") == expected
        snapshots = session.sql(
            f'SELECT operation FROM {namespace}."orders$snapshots" ORDER BY committed_at'
        ).fetchall()
        assert [op for (op,) in snapshots] == ["append", "append", "overwrite", "overwrite", "overwrite"]
        assert session.sql(f"DELETE FROM {table} WHERE id = 999").fetchall() == [(0,)]  # no commit for nothing
        assert len(session.sql(f'SELECT * FROM {namespace}."orders$snapshots"').fetchall()) == 5
    assert pyiceberg_rows(catalog_server, owner, table) == expected


def test_a_null_struct_with_a_required_child_is_written_and_rewritten(
    config: Path, namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal
) -> None:
    """Iceberg allows a required field inside an optional struct: a NULL struct is a row like any other."""
    point = StructType(NestedField(3, "x", LongType(), required=True), NestedField(4, "y", StringType()))
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "p", point, required=False))
    table = f"{namespace}.points"
    pyiceberg_catalog(catalog_server, owner).create_table(table, schema)
    with sqe.api.connect(config) as session:
        session.sql(f"INSERT INTO {table} VALUES (1, {{'x': 5, 'y': 'a'}}), (2, NULL)")
        session.sql(f"INSERT INTO {table} SELECT 3, CASE WHEN false THEN {{'x': 1, 'y': 'b'}} END")
        with pytest.raises(QueryError, match=rf"NULL value in required field 'p\.x' of wh\.{namespace}\.points"):
            session.sql(f"INSERT INTO {table} VALUES (4, {{'x': NULL, 'y': 'c'}})")
        # the file holding the NULL struct is rewritten by an UPDATE of another of its rows
        assert session.sql(f"UPDATE {table} SET p = {{'x': 6, 'y': 'a'}} WHERE id = 1").fetchall() == [(1,)]
        expected = [(1, {"x": 6, "y": "a"}), (2, None), (3, None)]
        assert sorted(session.sql(f"SELECT * FROM {table}").fetchall()) == expected
    assert sorted(pyiceberg_rows(catalog_server, owner, table)) == expected


def test_a_null_list_or_map_of_structs_stays_null_when_written_rewritten_and_read(
    config: Path, namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal
) -> None:
    """pyiceberg's Arrow projection rebuilt a list or map of structs from its offsets alone: a NULL one was written
    into the file (and read from any file) as an empty one."""
    item = StructType(NestedField(10, "k", StringType()))
    point = StructType(NestedField(8, "x", LongType(), required=True), NestedField(9, "l", ListType(11, item)))
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "tags", ListType(3, item, element_required=False)),
        NestedField(4, "attrs", MapType(5, StringType(), 6, item, value_required=False)),
        NestedField(7, "p", point),
    )
    table = f"{namespace}.nested_nulls"
    pyiceberg_catalog(catalog_server, owner).create_table(table, schema)
    with sqe.api.connect(config) as session:
        session.sql(
            f"INSERT INTO {table} VALUES (1, [{{'k': 'a'}}], MAP {{'m': {{'k': 'b'}}}}, "
            "{'x': 1, 'l': [{'k': 'c'}]}), (2, NULL, NULL, {'x': 2, 'l': NULL}), (3, [], MAP {}, NULL)"
        )
        expected = [
            {"id": 1, "tags": [{"k": "a"}], "attrs": [("m", {"k": "b"})], "p": {"x": 1, "l": [{"k": "c"}]}},
            {"id": 2, "tags": None, "attrs": None, "p": {"x": 2, "l": None}},
            {"id": 3, "tags": [], "attrs": [], "p": None},
        ]
        assert sorted(parquet_rows(catalog_server, _loaded(catalog_server, owner, table)), key=_by_id) == expected
        assert session.sql(f"SELECT * FROM {table} ORDER BY id").arrow().to_pylist() == expected
        # DML reads the file back through the same projection and writes the rows it keeps again
        assert session.sql(f"UPDATE {table} SET tags = [{{'k': 'z'}}] WHERE id = 1").fetchall() == [(1,)]
        expected[0]["tags"] = [{"k": "z"}]
        assert session.sql(f"SELECT * FROM {table} ORDER BY id").arrow().to_pylist() == expected
    assert sorted(parquet_rows(catalog_server, _loaded(catalog_server, owner, table)), key=_by_id) == expected


def _loaded(server: CatalogServer, principal: CatalogPrincipal, name: str) -> Any:
    return pyiceberg_catalog(server, principal).load_table(name)


def _by_id(row: dict[str, Any]) -> Any:
    return row["id"]


def _created_then_loaded_twice(
    session: Session, server: CatalogServer, owner: CatalogPrincipal, name: str, columns: str
) -> tuple[TableIdent, LoadedTable, Any]:
    """A table made by CREATE TABLE AS SELECT ``columns``: its name, SQE's loaded copy (soon stale) and pyiceberg's."""
    session.sql(f"CREATE TABLE {name} AS SELECT {columns}")
    namespace, table = name.split(".")
    ident = TableIdent(server.warehouse, (namespace,), table)
    return (
        ident,
        session._provider.load_table(ident, bypass_cache=True),
        pyiceberg_catalog(server, owner).load_table(name),
    )


def test_a_concurrent_commit_is_a_conflict_that_leaves_nothing_behind(
    config: Path, namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal
) -> None:
    """Nothing half-applied, and no data file left: pyiceberg deletes a refused commit's manifests, SQE its files."""
    with sqe.api.connect(config) as session:
        ident, stale, other = _created_then_loaded_twice(session, catalog_server, owner, f"{namespace}.o", "1 AS x")
        other.append(pa.table({"x": pa.array([2], pa.int32())}))  # someone else commits in between
        plan = plan_scan(stale, columns=None)
        rewrite = dml.Rewrite((0,), pa.table({"x": pa.array([7, 8], pa.int32())}))
        with pytest.raises(CommitConflictError):
            dml.commit_rewrite(stale, plan, rewrite, rewrite.rows, "update")
        with other.transaction() as change:  # an append is retried on a conflict unless the table says not to
            change.set_properties({"commit.retry.num-retries": "0"})
        stale = session._provider.load_table(ident, bypass_cache=True)
        other.append(pa.table({"x": pa.array([3], pa.int32())}))
        with pytest.raises(CommitConflictError):
            append_rows(stale, pa.table({"x": pa.array([9], pa.int32())}))
        assert rows(session, f"SELECT x FROM {namespace}.o") == [(1,), (2,), (3,)]
    objects = data_objects(catalog_server, other)
    assert len(objects) == 3 and objects == referenced(other), sorted(objects - referenced(other))


@pytest.mark.parametrize("retries", ["0", "4"])
def test_a_commit_whose_answer_was_lost_keeps_its_files_when_the_resend_gets_a_409(
    namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal, tmp_path: Path, retries: str
) -> None:
    """The commit lands and a proxy loses its answer (a 503 with Retry-After): the resent commit is refused (409),
    the table has the statement's snapshot, so it landed. Deleting its files then would break the table. (With
    retries pyiceberg finds the snapshot itself; without, only the table's own check does.)"""
    commit = rf"/namespaces/{namespace}/tables/lost$"
    with running_proxy(catalog_server.url) as proxy:
        config = write_sqe_config(tmp_path / "sqe.toml", proxy.url, owner, catalog_server.moto)
        with sqe.api.connect(config) as session:
            session.sql(f"CREATE TABLE {namespace}.lost (x BIGINT)")
            with pyiceberg_catalog(catalog_server, owner).load_table(f"{namespace}.lost").transaction() as change:
                change.set_properties({"commit.retry.num-retries": retries})
            proxy.inject("POST", commit, 503, 1, retry_after="0", lose_answer=True)
            assert session.sql(f"INSERT INTO {namespace}.lost VALUES (1), (2)").fetchall() == [(2,)]
            proxy.inject("POST", commit, 503, 1, retry_after="0", lose_answer=True)
            assert session.sql(f"UPDATE {namespace}.lost SET x = 3 WHERE x = 2").fetchall() == [(1,)]
            assert rows(session, f"SELECT x FROM {namespace}.lost") == [(1,), (3,)]
        assert proxy.count("POST", commit) == 4  # each commit sent twice: its answer lost, then the 409
    table = pyiceberg_catalog(catalog_server, owner).load_table(f"{namespace}.lost")
    assert len(table.snapshots()) == 2
    assert sorted(table.scan().to_arrow().column("x").to_pylist()) == [1, 3]
    objects = data_objects(catalog_server, table)
    assert objects == referenced(table) and len(objects) == 2


def test_a_commit_whose_answer_was_lost_to_a_5xx_succeeds_when_the_table_has_it(
    namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal, tmp_path: Path
) -> None:
    """A gateway's 502 after the catalog committed: the table has the statement's snapshot, so the statement
    succeeded (reported failed, it would be run again and write its rows twice). A 502 that never reached the
    catalog still fails the statement."""
    commit = rf"/namespaces/{namespace}/tables/gateway$"
    with running_proxy(catalog_server.url) as proxy:
        config = write_sqe_config(tmp_path / "sqe.toml", proxy.url, owner, catalog_server.moto)
        with sqe.api.connect(config) as session:
            session.sql(f"CREATE TABLE {namespace}.gateway (x BIGINT)")
            proxy.inject("POST", commit, 502, 1)
            with pytest.raises(SQEError, match="502"):
                session.sql(f"INSERT INTO {namespace}.gateway VALUES (0)")
            proxy.inject("POST", commit, 502, 1, lose_answer=True)
            assert session.sql(f"INSERT INTO {namespace}.gateway VALUES (1), (2)").fetchall() == [(2,)]
            proxy.inject("POST", commit, 502, 1, lose_answer=True)
            assert session.sql(f"DELETE FROM {namespace}.gateway WHERE x = 2").fetchall() == [(1,)]
            assert rows(session, f"SELECT x FROM {namespace}.gateway") == [(1,)]
    table = pyiceberg_catalog(catalog_server, owner).load_table(f"{namespace}.gateway")
    assert len(table.snapshots()) == 2
    # the refused 502's file stays (its commit's outcome was unknown); the landed ones are referenced
    assert referenced(table) < data_objects(catalog_server, table)


def test_a_conflicting_delete_is_reported_without_the_file_statistics(
    config: Path, namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal
) -> None:
    # Found by review: pyiceberg's validation message, passed through, listed the conflicting data file with its
    # column bounds (raw values).
    with sqe.api.connect(config) as session:
        columns = "1 AS x, 'bound-value-7f3a' AS s"
        ident, stale, other = _created_then_loaded_twice(session, catalog_server, owner, f"{namespace}.cd", columns)
        add_positional_deletes(other, (0,))
        plan = plan_scan(stale, columns=None)
        rewrite = dml.Rewrite((0,), pa.table({"x": pa.array([], pa.int32()), "s": pa.array([], pa.string())}))
        with pytest.raises(CommitConflictError) as raised:
            dml.commit_rewrite(stale, plan, rewrite, rewrite.rows, "delete")
        assert str(raised.value) == (
            f"conflict on commit to {ident}: a concurrent commit changed rows this statement rewrites"
        )


def test_time_travel_by_id_timestamp_branch_and_tag(
    config: Path, namespace: str, catalog_server: CatalogServer, owner: CatalogPrincipal
) -> None:
    table = f"{namespace}.tt"
    with sqe.api.connect(config) as session:
        session.sql(f"CREATE TABLE {table} AS SELECT 1 AS x")
        session.sql(f"INSERT INTO {table} VALUES (2)")
        history = session.sql(
            f'SELECT snapshot_id, made_current_at FROM {namespace}."tt$history" ORDER BY made_current_at'
        ).fetchall()
        (first, first_at), (second, _) = history
        pyiceberg_catalog(catalog_server, owner).load_table(table).manage_snapshots().create_tag(
            first, "v1"
        ).create_branch(second, "audit").commit()
        assert rows(session, f"SELECT x FROM {table} FOR VERSION AS OF {first}") == [(1,)]
        assert rows(session, f"SELECT x FROM {table} AT (VERSION => {second})") == [(1,), (2,)]
        assert rows(session, f"SELECT x FROM {table} FOR VERSION AS OF 'v1'") == [(1,)]
        assert rows(session, f"SELECT x FROM {table} FOR VERSION AS OF 'audit'") == [(1,), (2,)]
        stamp = first_at.isoformat()
        assert rows(session, f"SELECT x FROM {table} FOR TIMESTAMP AS OF TIMESTAMPTZ '{stamp}'") == [(1,)]
        both = f"SELECT a.x AS old, b.x AS new FROM {table} FOR VERSION AS OF {first} a JOIN {table} b ON a.x = b.x"
        assert rows(session, both) == [(1, 1)]
        refs = session.sql(f'SELECT name FROM {namespace}."tt$refs"').fetchall()
        assert {name for (name,) in refs} >= {"main", "v1", "audit"}
        with pytest.raises(QueryError, match="no snapshot 12345"):
            session.sql(f"SELECT * FROM {table} FOR VERSION AS OF 12345")
        with pytest.raises(QueryError, match="no branch or tag"):
            session.sql(f"SELECT * FROM {table} FOR VERSION AS OF 'nope'")
        with pytest.raises(QueryError, match="no snapshot at or before"):
            session.sql(f"SELECT * FROM {table} FOR TIMESTAMP AS OF TIMESTAMPTZ '2001-01-01 00:00:00+00'")


def test_explain_and_explain_analyze_are_vertical_with_the_duckdb_plan(config: Path, namespace: str) -> None:
    with sqe.api.connect(config) as session:
        session.sql(f"CREATE TABLE {namespace}.e AS SELECT range AS x FROM range(100)")
        query = f"SELECT count(*) FROM {namespace}.e WHERE x > 10"
        explained = session.sql("EXPLAIN " + query).arrow()
        assert explained.column_names == ["section", "property", "value"]
        plan_text = "\n".join(r["value"] for r in explained.to_pylist() if r["section"] == "duckdb plan")
        assert "FILTER" in plan_text.upper() or "SCAN" in plan_text.upper()
        section = explain_sections(explained)[f"{session.config.catalog.warehouse}.{namespace}.e"]  # type: ignore[union-attr]
        assert section["files_planned"] == "1" and section["credential_source"] == "vended"
        assert section["pushed_filter"] == "x > 10" and "scan_rows" not in section
        analyzed = session.sql("EXPLAIN ANALYZE " + query).arrow()
        sections = explain_sections(analyzed)
        scan = sections[f"{session.config.catalog.warehouse}.{namespace}.e"]  # type: ignore[union-attr]
        assert scan["scan_rows"] == "89" and float(scan["scan_time_ms"]) >= 0  # pyiceberg filtered rows too
        assert int(scan["scan_arrow_bytes"]) >= 89 * 8
        assert float(sections["query"]["total_time_ms"]) > 0
        analyzed_plan = "\n".join(r["value"] for r in analyzed.to_pylist() if r["section"] == "duckdb plan")
        assert "Total Time" in analyzed_plan
