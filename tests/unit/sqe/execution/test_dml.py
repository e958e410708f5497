"""DELETE / UPDATE / MERGE (copy-on-write) through a session, on a local catalog: what each one writes."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from sqe.errors import QueryError
from sqe.session import Session
from tests.unit.sqe.iceberg_local import LocalProvider

MakeSession = Callable[..., Session]
EPOCH = date(1970, 1, 1)


@pytest.fixture()
def writer(write_provider: LocalProvider, session_factory: MakeSession) -> Session:
    return session_factory(write_provider)


def rows(session: Session, sql: str) -> list[tuple[Any, ...]]:
    return sorted(session.sql(sql).fetchall(), key=repr)


def snapshots(provider: LocalProvider, name: str) -> int:
    return len(provider.catalogs["wh"].load_table(("ns", name)).metadata.snapshots)


@pytest.mark.parametrize(
    ("merge", "params"),
    [
        ("MERGE INTO ns.t USING ns.src ON t.id = src.id WHEN MATCHED THEN UPDATE SET x = src.x", None),
        ("MERGE INTO ns.t AS o USING ns.src s ON o.id = s.id WHEN MATCHED THEN DELETE", None),
        (
            "MERGE INTO ns.t USING (SELECT * FROM ns.src WHERE x > $1) s USING (id) "
            "WHEN MATCHED AND s.x > $2 THEN UPDATE SET x = s.x WHEN NOT MATCHED THEN INSERT VALUES (s.id, $3)",
            [0, 0, 7],
        ),
        (
            "MERGE INTO ns.t USING (SELECT * FROM ns.src WHERE x > ?) s ON t.id = s.id "
            "WHEN MATCHED AND s.x > ? THEN UPDATE SET x = s.x",
            [0, 0],
        ),
    ],
)
def test_a_merge_whose_target_row_matches_several_source_rows_is_refused(
    writer: Session, write_provider: LocalProvider, merge: str, params: list[Any] | None
) -> None:
    # Found by review: DuckDB applied every match in turn (the row kept whichever came last, an arbitrary pick);
    # SQL (and Spark, Trino, Iceberg's own MERGE) make it an error.
    writer.sql("CREATE TABLE ns.t AS SELECT * FROM (VALUES (1, 1), (2, 2)) v(id, x)")
    writer.sql("CREATE TABLE ns.src AS SELECT * FROM (VALUES (1, 10), (1, 20), (3, 30)) v(id, x)")
    with pytest.raises(QueryError, match="matched more than one source row"):
        writer.sql(merge, params)
    assert rows(writer, "SELECT * FROM ns.t") == [(1, 1), (2, 2)]
    assert snapshots(write_provider, "t") == 1


def test_a_merge_with_repeated_source_keys_that_match_nothing_or_only_inserts_runs(writer: Session) -> None:
    writer.sql("CREATE TABLE ns.t AS SELECT * FROM (VALUES (1, 1), (2, 2)) v(id, x)")
    writer.sql("CREATE TABLE ns.src AS SELECT * FROM (VALUES (2, 20), (3, 30), (3, 31)) v(id, x)")
    merged = writer.sql(
        "MERGE INTO ns.t USING ns.src ON t.id = src.id "
        "WHEN MATCHED THEN UPDATE SET x = src.x WHEN NOT MATCHED THEN INSERT VALUES (src.id, src.x)"
    ).fetchall()
    assert merged == [(3,)]
    assert rows(writer, "SELECT * FROM ns.t") == [(1, 1), (2, 20), (3, 30), (3, 31)]
    # no WHEN MATCHED clause: several source rows per target row change nothing twice
    writer.sql("CREATE TABLE ns.dup AS SELECT * FROM (VALUES (1, 5), (1, 6)) v(id, x)")
    assert writer.sql(
        "MERGE INTO ns.t USING ns.dup ON t.id = dup.id WHEN NOT MATCHED THEN INSERT VALUES (dup.id, dup.x)"
    ).fetchall() == [(0,)]


def test_insert_update_and_delete_on_a_table_with_an_iceberg_uuid_column(
    writer: Session, write_provider: LocalProvider
) -> None:
    # Found by review: DuckDB hands UUIDs back as strings, which Arrow cannot cast to Iceberg's uuid type, so every
    # write to a table another engine made with a uuid column failed ("cannot write column 'u'").
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, UUIDType

    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "u", UUIDType(), required=False))
    write_provider.catalogs["wh"].create_table(("ns", "ids"), schema=schema)
    first, second = "00000000-0000-0000-0000-000000003039", "c9b35c7e-3856-4d5a-ab16-ca1b6c42213e"
    writer.sql(f"INSERT INTO ns.ids VALUES (1, '{first}'), (2, '{second}'), (3, NULL)")
    assert writer.sql("UPDATE ns.ids SET id = id + 10 WHERE id = 1").fetchall() == [(1,)]
    assert writer.sql("DELETE FROM ns.ids WHERE id = 2").fetchall() == [(1,)]
    assert writer.sql("SELECT id, u::VARCHAR FROM ns.ids ORDER BY id").fetchall() == [(3, None), (11, first)]
    read = write_provider.catalogs["wh"].load_table(("ns", "ids")).scan().to_arrow().sort_by("id")
    assert [str(u) if u else None for u in read.column("u").to_pylist()] == [None, first]


def test_writes_to_a_table_partitioned_by_bucket_truncate_and_day(
    writer: Session, write_provider: LocalProvider
) -> None:
    # Found by review: pyiceberg computes these transforms with pyiceberg-core, which SQE did not depend on, so every
    # INSERT / DELETE / UPDATE / MERGE into such a table failed ("pyiceberg_core needs to be installed").
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform, DayTransform, TruncateTransform
    from pyiceberg.types import LongType, NestedField, StringType, TimestampType

    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "ts", TimestampType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(1, 1000, BucketTransform(4), "id_bucket"),
        PartitionField(2, 1001, TruncateTransform(2), "name_trunc"),
        PartitionField(3, 1002, DayTransform(), "ts_day"),
    )
    write_provider.catalogs["wh"].create_table(("ns", "parts"), schema=schema, partition_spec=spec)
    writer.sql(
        "INSERT INTO ns.parts SELECT range, 'n' || range, TIMESTAMP '2024-01-01' + range * INTERVAL 7 HOUR "
        "FROM range(12)"
    )
    assert writer.sql("DELETE FROM ns.parts WHERE id % 3 = 0").fetchall() == [(4,)]
    assert writer.sql("UPDATE ns.parts SET name = 'zz' WHERE id = 1").fetchall() == [(1,)]
    table = write_provider.catalogs["wh"].load_table(("ns", "parts"))
    files = table.inspect.files().to_pylist()
    by_partition: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for row in table.scan().to_arrow().to_pylist():
        key = (
            BucketTransform(4).transform(LongType())(row["id"]),
            TruncateTransform(2).transform(StringType())(row["name"]),
            DayTransform().transform(TimestampType())(row["ts"]),
        )
        by_partition.setdefault(key, []).append(row["id"])
    written = {
        (f["partition"]["id_bucket"], f["partition"]["name_trunc"], (f["partition"]["ts_day"] - EPOCH).days): (
            f["record_count"]
        )
        for f in files
    }
    assert written == {key: len(ids) for key, ids in by_partition.items()}  # every row in its own partition
    assert sorted(i for ids in by_partition.values() for i in ids) == [1, 2, 4, 5, 7, 8, 10, 11]


def test_a_dml_commit_that_conflicts_deletes_the_data_files_it_wrote(
    writer: Session, write_provider: LocalProvider
) -> None:
    # Found by review: pyiceberg deletes the manifests of a commit that failed, never the data files SQE wrote for
    # it, so every conflicting DELETE / UPDATE / MERGE left its new files behind, referenced by nothing.
    import pyarrow as pa

    from sqe.catalog.base import TableIdent
    from sqe.errors import CommitConflictError
    from sqe.execution import dml
    from sqe.planning.planner import plan_scan

    writer.sql("CREATE TABLE ns.c AS SELECT * FROM (VALUES (1), (2)) v(x)")
    catalog = write_provider.catalogs["wh"]
    stale = write_provider.load_table(TableIdent("wh", ("ns",), "c"), bypass_cache=True)
    data = Path(stale.table.metadata.location.removeprefix("file://")) / "data"
    before = set(data.rglob("*.parquet"))
    catalog.load_table(("ns", "c")).append(pa.table({"x": pa.array([3], pa.int32())}))  # someone else commits
    appended = set(data.rglob("*.parquet")) - before
    plan = plan_scan(stale, columns=None)
    rewrite = dml.Rewrite((0,), pa.table({"x": pa.array([2], pa.int32())}))
    with pytest.raises(CommitConflictError):
        dml.commit_rewrite(stale, plan, rewrite, rewrite.rows, "delete")
    assert set(data.rglob("*.parquet")) == before | appended
    assert rows(writer, "SELECT x FROM ns.c") == [(1,), (2,), (3,)]
