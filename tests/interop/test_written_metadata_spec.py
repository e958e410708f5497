"""What SQE and its catalog write is valid Iceberg that other engines read: every writer (INSERT, CREATE TABLE AS,
DELETE, UPDATE, MERGE, ALTER TABLE, OPTIMIZE; snapshots expired through pyiceberg) leaves metadata that meets the
table spec's required fields and invariants (``spec_check``), and pyiceberg and DuckDB's iceberg extension read
exactly the rows SQE reads, at every snapshot."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyiceberg.io import load_file_io
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import IdentityTransform, MonthTransform
from pyiceberg.types import DateType, LongType, NestedField, StringType

import sqe.api
from sqe.errors import QueryError
from sqe.session import Session
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.helpers.orphans import data_objects
from tests.interop.duckdb_client import DuckPeer, catalog_attach, offline_duckdb
from tests.interop.spec_check import metadata_problems

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e


@pytest.fixture()
def sqe_session(tmp_path: Path, catalog_server: CatalogServer, engine_writer: CatalogPrincipal) -> Iterator[Session]:
    with sqe.api.connect(
        write_sqe_config(tmp_path / "sqe.toml", catalog_server.url, engine_writer, catalog_server.moto)
    ) as s:
        yield s


@pytest.fixture()
def duck(tmp_path: Path, catalog_server: CatalogServer, engine_writer: CatalogPrincipal) -> Iterator[DuckPeer]:
    with offline_duckdb(tmp_path / "extensions", (catalog_attach(catalog_server, engine_writer),)) as con:
        yield con


@pytest.fixture()
def namespace(sqe_session: Session) -> str:
    name = f"spec_{uuid.uuid4().hex[:8]}"
    sqe_session.sql(f"CREATE SCHEMA {name}")
    return name


@dataclass(frozen=True)
class Env:
    """One test's writer session, DuckDB peer, namespace, catalog and principal."""

    sqe: Session
    duck: DuckPeer
    namespace: str
    server: CatalogServer
    principal: CatalogPrincipal

    def check(self, name: str) -> Any:
        return assert_valid_and_read_alike(self.server, self.principal, self.sqe, self.duck, name)

    def catalog(self) -> Any:
        return pyiceberg_catalog(self.server, self.principal)


@pytest.fixture()
def env(
    sqe_session: Session, duck: DuckPeer, namespace: str, catalog_server: CatalogServer, engine_writer: CatalogPrincipal
) -> Env:
    return Env(sqe_session, duck, namespace, catalog_server, engine_writer)


def storage_io(server: CatalogServer) -> Any:
    moto = server.moto
    return load_file_io(
        {
            "s3.endpoint": moto.url,
            "s3.region": moto.region,
            "s3.access-key-id": moto.access_key_id,
            "s3.secret-access-key": moto.secret_access_key,
        }
    )


def assert_valid_and_read_alike(
    server: CatalogServer, principal: CatalogPrincipal, session: Session, duck: DuckPeer, name: str
) -> Any:
    """The table's metadata meets the spec, and pyiceberg and DuckDB read SQE's rows at every snapshot."""
    table = pyiceberg_catalog(server, principal).load_table(name)
    assert metadata_problems(storage_io(server), table.metadata_location) == []
    order = "id"  # unique in every table here; other columns differ between snapshots' schemas
    for snapshot in table.snapshots():
        sid = snapshot.snapshot_id
        ours = session.sql(f"SELECT * FROM {name} FOR VERSION AS OF {sid} ORDER BY {order}").arrow().to_pylist()
        theirs = duck.rows(f"SELECT * FROM lake.{name} AT (VERSION => {sid}) ORDER BY {order}")
        arrow = table.scan(snapshot_id=sid).to_arrow()
        pyice = arrow.sort_by(order).to_pylist()
        assert (ours, theirs) == (pyice, pyice), f"snapshot {sid}"
    current = session.sql(f"SELECT * FROM {name} ORDER BY {order}").arrow().to_pylist()
    assert duck.rows(f"SELECT * FROM lake.{name} ORDER BY {order}") == current
    return table


def test_every_sql_writer_leaves_spec_valid_metadata_other_engines_read(
    env: Env,
) -> None:
    s, name = env.sqe, f"{env.namespace}.t"
    s.sql(f"CREATE TABLE {name} (id BIGINT NOT NULL, name VARCHAR)")
    s.sql(f"INSERT INTO {name} SELECT range, 'n' || range FROM range(10)")
    s.sql(f"INSERT INTO {name} VALUES (100, 'x'), (101, 'y')")
    s.sql(f"DELETE FROM {name} WHERE id % 3 = 0")
    s.sql(f"UPDATE {name} SET name = 'u' WHERE id > 5")
    s.sql(
        f"MERGE INTO {name} AS t USING (SELECT 1::BIGINT AS id UNION ALL SELECT 200) AS src ON t.id = src.id "
        "WHEN MATCHED THEN UPDATE SET name = 'm' WHEN NOT MATCHED THEN INSERT VALUES (src.id, 'new')"
    )
    s.sql(f"ALTER TABLE {name} ADD COLUMN extra BIGINT")
    s.sql(f"INSERT INTO {name} VALUES (300, 'z', 7)")
    s.sql(f"ALTER TABLE {name} RENAME COLUMN extra TO more")
    s.sql(f"OPTIMIZE {name}")
    s.sql(f"CREATE TABLE {env.namespace}.copy AS SELECT * FROM {name} WHERE id < 100")
    table = env.check(name)
    operations = [snap.summary.operation.value for snap in table.snapshots() if snap.summary]
    assert operations == ["append", "append", "overwrite", "overwrite", "overwrite", "append", "replace"]
    env.check(f"{env.namespace}.copy")


def test_partitioned_writes_and_expired_snapshots_stay_valid(
    env: Env,
) -> None:
    name = f"{env.namespace}.parted"
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "region", StringType(), required=False)
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"))
    catalog = env.catalog()
    catalog.create_table(name, schema, partition_spec=spec)
    s = env.sqe
    s.sql(f"INSERT INTO {name} SELECT range, CASE WHEN range % 2 = 0 THEN 'eu' ELSE 'us' END FROM range(20)")
    s.sql(f"INSERT INTO {name} VALUES (50, 'eu'), (51, 'ap')")
    s.sql(f"DELETE FROM {name} WHERE region = 'us' AND id < 10")
    s.sql(f"UPDATE {name} SET id = id + 1000 WHERE region = 'ap'")
    s.sql(f"OPTIMIZE {name}")
    env.check(name)

    table = catalog.load_table(name)
    oldest = [snap.snapshot_id for snap in table.snapshots()][:2]
    table.maintenance.expire_snapshots().by_ids(oldest).commit()
    s.sql(f"INSERT INTO {name} VALUES (60, 'eu')")
    table = env.check(name)
    assert not {snap.snapshot_id for snap in table.snapshots()} & set(oldest)


def test_evolved_partitioning_and_format_v1_stay_valid(
    env: Env,
) -> None:
    catalog = env.catalog()
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "day", DateType(), required=False))
    s, evolved = env.sqe, f"{env.namespace}.evolved"
    table = catalog.create_table(evolved, schema)
    s.sql(f"INSERT INTO {evolved} SELECT range, DATE '2024-01-01' + range::INTEGER FROM range(6)")
    with table.update_spec() as spec:
        spec.add_field("day", MonthTransform(), "day_month")
    s.sql(f"INSERT INTO {evolved} SELECT range, DATE '2024-03-01' + range::INTEGER * 20 FROM range(10, 16)")
    s.sql(f"DELETE FROM {evolved} WHERE id IN (2, 12)")  # rewrites one file of each spec
    s.sql(f"OPTIMIZE {evolved}")
    table = env.check(evolved)
    assert {spec.spec_id for spec in table.specs().values()} == {0, 1}

    merged = f"{env.namespace}.merged"  # INSERT's merge-append: manifests merged as snapshots are added
    merge = {"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"}
    catalog.create_table(merged, schema, properties=merge)
    for start in range(0, 40, 10):
        s.sql(f"INSERT INTO {merged} SELECT range, NULL FROM range({start}, {start + 10})")
    s.sql(f"DELETE FROM {merged} WHERE id < 5")
    s.sql(f"INSERT INTO {merged} VALUES (100, DATE '2024-01-01')")
    table = env.check(merged)
    assert len(table.current_snapshot().manifests(table.io)) < 6

    v1 = f"{env.namespace}.v1"
    catalog.create_table(v1, schema, properties={"format-version": "1"})
    s.sql(f"INSERT INTO {v1} VALUES (1, DATE '2024-01-01'), (2, NULL)")
    s.sql(f"UPDATE {v1} SET day = DATE '2025-01-01' WHERE id = 2")
    table = env.check(v1)
    assert table.metadata.format_version == 1


def test_a_format_v3_table_is_refused_before_any_file_is_written(
    env: Env,
) -> None:
    # pyiceberg 0.12 (SQE's writer) writes v1/v2 manifests only: a v3 write is refused up front, the table unchanged
    name = f"{env.namespace}.v3"
    env.duck.execute(f"CREATE TABLE lake.{name} (id BIGINT, name VARCHAR) WITH ('format-version' = '3')")
    env.duck.execute(f"INSERT INTO lake.{name} VALUES (1, 'a')")
    env.duck.execute(f"INSERT INTO lake.{name} VALUES (3, 'c')")  # two files: OPTIMIZE has something to compact
    before = env.catalog().load_table(name)
    files_before = data_objects(env.server, before)
    for statement in (
        f"INSERT INTO {name} VALUES (2, 'b')",
        f"DELETE FROM {name} WHERE id = 1",
        f"OPTIMIZE {name}",
    ):
        with pytest.raises(QueryError, match="format-version 3"):
            env.sqe.sql(statement)
    after = env.catalog().load_table(name)
    assert after.metadata_location == before.metadata_location
    assert data_objects(env.server, after) == files_before
    rows = env.sqe.sql(f"SELECT * FROM {name} ORDER BY id").arrow().to_pylist()
    assert rows == [{"id": 1, "name": "a"}, {"id": 3, "name": "c"}]
    env.sqe.sql(f"ALTER TABLE {name} ADD COLUMN extra BIGINT")  # metadata only: works on v3
    assert env.duck.rows(f"SELECT * FROM lake.{name} ORDER BY id")[0] == {"id": 1, "name": "a", "extra": None}
    metadata = env.catalog().load_table(name)
    assert metadata_problems(storage_io(env.server), metadata.metadata_location) == []


def test_sqe_rewrites_over_duckdb_delete_files_stay_valid(
    env: Env,
) -> None:
    name = f"{env.namespace}.mixed"
    env.duck.execute(f"CREATE TABLE lake.{name} (id BIGINT, name VARCHAR)")
    env.duck.execute(f"INSERT INTO lake.{name} SELECT range, 'n' || range FROM range(30)")
    env.duck.execute(f"INSERT INTO lake.{name} SELECT range, 'm' || range FROM range(30, 40)")
    env.duck.execute(f"DELETE FROM lake.{name} WHERE id % 4 = 0")  # merge-on-read: position delete files
    s = env.sqe
    s.sql(f"UPDATE {name} SET name = 'u' WHERE id = 5")
    s.sql(f"INSERT INTO {name} VALUES (100, 'x')")
    s.sql(f"OPTIMIZE {name}")
    env.duck.execute(f"DELETE FROM lake.{name} WHERE id = 7")
    table = env.check(name)
    assert len(s.sql(f"SELECT * FROM {name}").arrow()) == 40 - 10 + 1 - 1
    assert table.current_snapshot() is not None
