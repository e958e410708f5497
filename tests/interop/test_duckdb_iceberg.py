"""DuckDB's iceberg extension (1.5.5, loaded offline) as a third-party client of ``sqe-catalog``.

DuckDB runs as a peer process in its own environment (``make duckdb-peer``, see ``duckdb_client.py``): the engine
keeps its own DuckDB. Without that environment every test here fails, naming the make step.

DuckDB creates, inserts, deletes (merge-on-read position deletes) and updates through the real catalog with
vended credentials only; SQE and pyiceberg then read exactly the rows DuckDB reads. What the extension itself
cannot do is listed in ``known_gaps.json`` and runs as a strict xfail.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update import AddPartitionSpecUpdate, SetDefaultSpecUpdate
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.types import ListType, LongType, MapType, NestedField, StringType, StructType
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

import sqe.api
from tests.conftest import pyiceberg_catalog, write_sqe_config
from tests.interop.duckdb_client import (
    EXTENSIONS,
    MAKE_STEP,
    PEER_DIR_VARIABLE,
    DuckDBError,
    DuckPeer,
    DuckPeerError,
    PeerEnvironmentMissing,
    catalog_attach,
    offline_duckdb,
    peer_dir,
)

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer

pytestmark = pytest.mark.e2e

KNOWN_GAPS: dict[str, Any] = json.loads((Path(__file__).parent / "known_gaps.json").read_text(encoding="utf-8"))


def known_gap(test: Callable[..., None]) -> Callable[..., None]:
    """Strict xfail when ``known_gaps.json`` lists the test: it must fail, and with a DuckDB error."""
    gap = KNOWN_GAPS.get(test.__name__)
    if gap is None:
        return test
    return pytest.mark.xfail(strict=True, raises=DuckDBError, reason=f"{gap['client']}: {gap['reason']}")(test)


DUCK_WRITER_GRANTS: list[tuple[str, str | None, str | None]] = [
    ("NAMESPACE_FULL_METADATA", None, None),
    ("TABLE_CREATE", None, None),
    ("TABLE_WRITE_DATA", None, None),
    ("TABLE_DROP", None, None),
]


@pytest.fixture(scope="module")
def duck_writer(catalog_server: CatalogServer) -> CatalogPrincipal:
    """The principal DuckDB attaches as: creates namespaces and tables, writes and drops them; no admin."""
    return catalog_server.principal_with_grants(f"duck_writer_{uuid.uuid4().hex[:6]}", DUCK_WRITER_GRANTS)


@contextmanager
def setup_step(what: str) -> Iterator[None]:
    """A DuckDB error while setting up is a plain failure: a known gap's strict xfail counts test bodies only."""
    try:
        yield
    except DuckPeerError as error:
        pytest.fail(f"{what}: {error}", pytrace=False)


@pytest.fixture()
def duck(tmp_path: Path, catalog_server: CatalogServer, duck_writer: CatalogPrincipal) -> Iterator[DuckPeer]:
    with setup_step("starting the DuckDB peer"):
        con = offline_duckdb(tmp_path / "extensions", (catalog_attach(catalog_server, duck_writer),))
    with con:
        yield con


@pytest.fixture()
def namespace(duck: DuckPeer) -> str:
    name = f"duck_{uuid.uuid4().hex[:8]}"
    with setup_step("creating the test schema"):
        duck.execute(f"CREATE SCHEMA lake.{name}")
    return name


def duck_rows(con: DuckPeer, query: str) -> list[dict[str, Any]]:
    return con.rows(query)


def sqe_rows(tmp_path: Path, server: CatalogServer, principal: CatalogPrincipal, query: str) -> list[dict[str, Any]]:
    config = write_sqe_config(tmp_path / "sqe.toml", server.url, principal, server.moto)
    with sqe.api.connect(config) as session:
        return list(session.sql(query).arrow().to_pylist())


def pyiceberg_rows(server: CatalogServer, principal: CatalogPrincipal, name: str, **scan: Any) -> list[dict[str, Any]]:
    table = pyiceberg_catalog(server, principal).load_table(name)
    return list(table.scan(**scan).to_arrow().sort_by("id").to_pylist())


def test_extensions_load_from_the_wheels_without_downloading(tmp_path: Path) -> None:
    with offline_duckdb(tmp_path / "extensions") as con:
        rows = con.rows("SELECT extension_name, install_mode FROM duckdb_extensions() WHERE loaded")
        info = con.info
    loaded = {row["extension_name"]: row["install_mode"] for row in rows}
    # CUSTOM_PATH = installed from the wheel's file, not from an extension repository
    assert {name: loaded.get(name) for name in EXTENSIONS} == dict.fromkeys(EXTENSIONS, "CUSTOM_PATH")
    assert all(Path(info["extensions"][name]).is_file() for name in EXTENSIONS)
    # the peer's own DuckDB, from the peer directory: the engine's DuckDB (site-packages) never loaded there
    assert Path(info["duckdb_file"]).is_relative_to(peer_dir().resolve())
    assert all(Path(info["extensions"][name]).is_relative_to(peer_dir()) for name in EXTENSIONS)
    assert sorted(p.name for p in (tmp_path / "extensions").rglob("*.duckdb_extension")) == sorted(
        f"{name}.duckdb_extension" for name in EXTENSIONS
    )


def test_duckdb_writes_deletes_and_updates_and_every_reader_agrees(
    duck: DuckPeer, namespace: str, catalog_server: CatalogServer, duck_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    name = f"{namespace}.events"
    duck.execute(f"CREATE TABLE lake.{name} (id BIGINT, name VARCHAR, amount DOUBLE)")
    duck.execute(f"INSERT INTO lake.{name} SELECT range, 'n' || range, range * 1.5 FROM range(20)")
    assert duck.one(f"DELETE FROM lake.{name} WHERE id % 3 = 0") == (7,)
    assert duck.one(f"UPDATE lake.{name} SET name = 'updated' WHERE id > 15") == (3,)

    expected = [{"id": i, "name": "updated" if i > 15 else f"n{i}", "amount": i * 1.5} for i in range(20) if i % 3]
    assert duck_rows(duck, f"SELECT * FROM lake.{name} ORDER BY id") == expected
    assert pyiceberg_rows(catalog_server, duck_writer, name) == expected
    assert sqe_rows(tmp_path, catalog_server, duck_writer, f"SELECT * FROM {name} ORDER BY id") == expected

    table = pyiceberg_catalog(catalog_server, duck_writer).load_table(name)
    operations = [s.summary.operation for s in table.snapshots() if s.summary is not None]
    assert operations[0] == Operation.APPEND and len(operations) == 3
    # merge-on-read: DuckDB's DELETE and UPDATE left position delete files that SQE and pyiceberg applied
    assert any(task.delete_files for task in table.scan().plan_files())


def test_scalar_types_written_by_duckdb_read_back_identically(
    duck: DuckPeer, namespace: str, catalog_server: CatalogServer, duck_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    name = f"{namespace}.typed"
    duck.execute(
        f"CREATE TABLE lake.{name} (id BIGINT, i INTEGER, f DOUBLE, r REAL, d DECIMAL(10, 2), dt DATE, "
        "ts TIMESTAMP, s VARCHAR, b BOOLEAN, bl BLOB)"
    )
    duck.execute(
        f"INSERT INTO lake.{name} VALUES "
        "(1, 7, 1.5, 2.5, 3.25, DATE '2024-01-02', TIMESTAMP '2024-01-02 03:04:05.123456', 'é', true, '\\x01\\xff'), "
        "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    expected = duck_rows(duck, f"SELECT * FROM lake.{name} ORDER BY id")
    assert expected[0]["s"] == "é" and expected[1]["i"] is None
    assert pyiceberg_rows(catalog_server, duck_writer, name) == expected
    assert sqe_rows(tmp_path, catalog_server, duck_writer, f"SELECT * FROM {name} ORDER BY id") == expected


def test_duckdb_creates_a_format_v3_table(
    duck: DuckPeer, namespace: str, catalog_server: CatalogServer, duck_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    # DuckDB stages the create and commits it with ``upgrade-format-version: 3`` (a catalog fix: it was a 400)
    name = f"{namespace}.v3"
    duck.execute(f"CREATE TABLE lake.{name} (id BIGINT, name VARCHAR) WITH ('format-version' = '3')")
    duck.execute(f"INSERT INTO lake.{name} VALUES (1, 'a'), (2, 'b')")
    table = pyiceberg_catalog(catalog_server, duck_writer).load_table(name)
    assert table.metadata.format_version == 3
    expected = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert duck_rows(duck, f"SELECT * FROM lake.{name} ORDER BY id") == expected
    assert pyiceberg_rows(catalog_server, duck_writer, name) == expected
    assert sqe_rows(tmp_path, catalog_server, duck_writer, f"SELECT * FROM {name} ORDER BY id") == expected


SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
)


def test_duckdb_reads_what_pyiceberg_wrote_including_history(
    duck: DuckPeer, namespace: str, catalog_server: CatalogServer, duck_writer: CatalogPrincipal
) -> None:
    catalog = pyiceberg_catalog(catalog_server, duck_writer)
    table = catalog.create_table(f"{namespace}.from_pyiceberg", SCHEMA)
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]}))
    first = table.current_snapshot()
    assert first is not None
    table.delete("id = 2")  # copy-on-write
    name = f"lake.{namespace}.from_pyiceberg"
    assert duck_rows(duck, f"SELECT * FROM {name} ORDER BY id") == pyiceberg_rows(
        catalog_server, duck_writer, f"{namespace}.from_pyiceberg"
    )
    before = duck_rows(duck, f"SELECT * FROM {name} AT (VERSION => {first.snapshot_id}) ORDER BY id")
    assert before == pyiceberg_rows(
        catalog_server, duck_writer, f"{namespace}.from_pyiceberg", snapshot_id=first.snapshot_id
    )
    assert [r["id"] for r in before] == [1, 2, 3]


def _commit_spec(catalog: Any, name: str, *fields: PartitionField) -> PartitionSpec:
    """Make a spec with the field ids a careless client chose the default; the spec the catalog stored."""
    table = catalog.load_table(name)
    catalog.commit_table(table, (), (AddPartitionSpecUpdate(spec=PartitionSpec(*fields)), SetDefaultSpecUpdate()))
    return catalog.load_table(name).spec()


def _append(catalog: Any, name: str, ids: list[int], names: list[str]) -> None:
    catalog.load_table(name).append(pa.table({"id": pa.array(ids, pa.int64()), "name": names}))


def test_every_reader_reads_a_table_after_partition_evolution(
    duck: DuckPeer, namespace: str, catalog_server: CatalogServer, duck_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    """Data files under three specs, the later ones sent with field ids that clash with earlier fields: the catalog
    gives each field its own id, and DuckDB, pyiceberg and SQE read (and prune) every file alike."""
    catalog = pyiceberg_catalog(catalog_server, duck_writer)
    name = f"{namespace}.evolved"
    by_name = PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="name")
    catalog.create_table(name, SCHEMA, partition_spec=PartitionSpec(by_name))
    _append(catalog, name, [1, 2], ["a", "b"])
    # 1000 is identity(name)'s: identity(id) gets a fresh id
    by_id = _commit_spec(catalog, name, PartitionField(1, 1000, IdentityTransform(), "id"))
    assert [(f.name, f.field_id) for f in by_id.fields] == [("id", 1001)]
    _append(catalog, name, [3, 4], ["a", "c"])
    # identity(name) comes back under its own id, bucket(id) is new: the ids sent are swapped and taken
    both = _commit_spec(
        catalog,
        name,
        PartitionField(2, 1001, IdentityTransform(), "name"),
        PartitionField(1, 1000, BucketTransform(4), "b"),
    )
    assert [(f.name, f.field_id) for f in both.fields] == [("name", 1000), ("b", 1002)]
    assert catalog.load_table(name).metadata.last_partition_id == 1002
    _append(catalog, name, [5, 6], ["a", "d"])

    every = [{"id": i, "name": n} for i, n in zip(range(1, 7), "abacad", strict=True)]
    assert duck_rows(duck, f"SELECT * FROM lake.{name} ORDER BY id") == every
    assert pyiceberg_rows(catalog_server, duck_writer, name) == every
    assert sqe_rows(tmp_path, catalog_server, duck_writer, f"SELECT * FROM {name} ORDER BY id") == every
    named_a = [row for row in every if row["name"] == "a"]
    assert duck_rows(duck, f"SELECT * FROM lake.{name} WHERE name = 'a' ORDER BY id") == named_a
    assert pyiceberg_rows(catalog_server, duck_writer, name, row_filter="name = 'a'") == named_a
    assert duck_rows(duck, f"SELECT * FROM lake.{name} WHERE id = 3") == [every[2]]
    assert pyiceberg_rows(catalog_server, duck_writer, name, row_filter="id = 3") == [every[2]]


def test_nested_nulls_sqe_writes_read_back_by_duckdb(
    duck: DuckPeer, namespace: str, catalog_server: CatalogServer, duck_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    """A NULL struct whose fields are required, and a NULL list or map of structs, as SQE writes them: DuckDB's own
    reader (another process, no pyiceberg) reads them NULL, as SQE does (an empty list or map stays empty)."""
    item = StructType(NestedField(10, "k", StringType()))
    point = StructType(
        NestedField(3, "x", LongType(), required=True),
        NestedField(4, "l", ListType(5, LongType(), element_required=True), required=True),
        NestedField(6, "m", MapType(7, StringType(), 8, item, value_required=True)),
    )
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "p", point),
        NestedField(11, "tags", ListType(12, item)),
    )
    name = f"{namespace}.nested_nulls"
    pyiceberg_catalog(catalog_server, duck_writer).create_table(name, schema)
    config = write_sqe_config(tmp_path / "sqe.toml", catalog_server.url, duck_writer, catalog_server.moto)
    with sqe.api.connect(config) as session:
        session.sql(
            f"INSERT INTO {name} VALUES (1, {{'x': 5, 'l': [1, 2], 'm': MAP {{'a': {{'k': 'b'}}}}}}, [{{'k': 'c'}}]), "
            "(2, NULL, NULL), (3, {'x': 6, 'l': [], 'm': NULL}, []), (4, {'x': 7, 'l': [3], 'm': MAP {}}, NULL)"
        )
        written = session.sql(f"SELECT * FROM {name} ORDER BY id").arrow().to_pylist()
    assert [(r["p"], r["tags"]) for r in written] == [
        ({"x": 5, "l": [1, 2], "m": [("a", {"k": "b"})]}, [{"k": "c"}]),
        (None, None),
        ({"x": 6, "l": [], "m": None}, []),
        ({"x": 7, "l": [3], "m": []}, None),
    ]
    assert duck_rows(duck, f"SELECT * FROM lake.{name} ORDER BY id") == written
    assert duck_rows(duck, f"SELECT id FROM lake.{name} WHERE p.x IS NULL") == [{"id": 2}]


def test_nested_namespaces_and_drops_through_duckdb(
    duck: DuckPeer, namespace: str, catalog_server: CatalogServer, duck_writer: CatalogPrincipal
) -> None:
    catalog = pyiceberg_catalog(catalog_server, duck_writer)
    catalog.create_namespace((namespace, "inner"))
    catalog.create_table((namespace, "inner", "t"), SCHEMA)
    duck.execute(f"INSERT INTO lake.\"{namespace}.inner\".t VALUES (1, 'x')")
    assert pyiceberg_rows(catalog_server, duck_writer, f"{namespace}.inner.t") == [{"id": 1, "name": "x"}]
    duck.execute(f'DROP TABLE lake."{namespace}.inner".t')
    assert not catalog.table_exists((namespace, "inner", "t"))


def test_a_read_only_principal_cannot_write_through_duckdb(
    tmp_path: Path, namespace: str, duck: DuckPeer, catalog_server: CatalogServer, capfd: pytest.CaptureFixture[str]
) -> None:
    duck.execute(f"CREATE TABLE lake.{namespace}.guarded AS SELECT 1::BIGINT AS id")
    reader = catalog_server.principal_with_grants(
        f"duck_reader_{uuid.uuid4().hex[:6]}",
        [("NAMESPACE_FULL_METADATA", namespace, None), ("TABLE_READ_DATA", namespace, None)],
    )
    with offline_duckdb(tmp_path / "reader-extensions", (catalog_attach(catalog_server, reader, alias="ro"),)) as con:
        assert duck_rows(con, f"SELECT * FROM ro.{namespace}.guarded") == [{"id": 1}]
        with pytest.raises(DuckDBError) as refused:
            con.execute(f"INSERT INTO ro.{namespace}.guarded VALUES (2)")
    message = str(refused.value)
    assert "403" in message or "Forbidden" in message or "AccessDenied" in message
    assert reader.client_secret not in message
    # nor anywhere the peer process printed (its stderr is this test's)
    captured = capfd.readouterr()
    assert reader.client_secret not in captured.out + captured.err
    assert duck_rows(duck, f"SELECT * FROM lake.{namespace}.guarded") == [{"id": 1}]
    log = catalog_server.log_text()
    assert not [secret for secret in catalog_server.secrets if secret and secret in log]


def _pyiceberg_view(server: CatalogServer, principal: CatalogPrincipal, namespace: str) -> None:
    catalog = pyiceberg_catalog(server, principal)
    catalog.create_table(f"{namespace}.base", SCHEMA).append(pa.table({"id": pa.array([1], pa.int64()), "name": ["a"]}))
    version = ViewVersion(
        version_id=1,
        schema_id=0,
        representations=[SQLViewRepresentation(type="sql", sql="SELECT id, name FROM base", dialect="duckdb")],
        default_namespace=(namespace,),
    )
    catalog.create_view(f"{namespace}.v", SCHEMA, version)


@known_gap
def test_duckdb_reads_a_view_pyiceberg_created(duck: DuckPeer, namespace: str, catalog_server: CatalogServer) -> None:
    _pyiceberg_view(catalog_server, catalog_server.admin, namespace)
    assert duck_rows(duck, f"SELECT * FROM lake.{namespace}.v") == [{"id": 1, "name": "a"}]


@known_gap
def test_duckdb_creates_a_view_pyiceberg_reads(duck: DuckPeer, namespace: str, catalog_server: CatalogServer) -> None:
    duck.execute(f"CREATE VIEW lake.{namespace}.dv AS SELECT 1 AS id")
    assert pyiceberg_catalog(catalog_server, catalog_server.admin).view_exists(f"{namespace}.dv")


def test_a_missing_peer_environment_fails_naming_the_make_step(tmp_path: Path) -> None:
    unbuilt = tmp_path / "never-built"
    with pytest.raises(PeerEnvironmentMissing) as missing:
        peer_dir({PEER_DIR_VARIABLE: str(unbuilt)})
    assert (
        str(missing.value)
        == f"the DuckDB peer environment {unbuilt} is not built: run `{MAKE_STEP}` (part of `make test`)"
    )
    # a directory without the make step's stamp (an interrupted install) counts as missing too
    unbuilt.mkdir()
    with pytest.raises(PeerEnvironmentMissing, match=f"run `{MAKE_STEP}`"):
        peer_dir({PEER_DIR_VARIABLE: str(unbuilt)})
