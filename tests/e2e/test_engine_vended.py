"""SQE sessions against real moto (IAM auth on) + sqe-catalog processes: where the S3 credentials come from.

Every test runs with bogus ``AWS_*`` variables in the environment, which moto rejects: a read or write that
succeeds can only have used credentials the catalog vended (or, in static mode, the ``[storage]`` pair).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError
from pyiceberg.exceptions import BadRequestError

import sqe.api
from sqe.catalog.base import LoadedTable
from sqe.catalog.lazy import LazyRestTableProvider
from sqe.credentials import ScopedFileIO, StoragePolicy
from sqe.errors import NoVendedCredentialsError
from sqe.session import Session
from sqe.vocabulary import S3_ACCESS_KEY_ID, S3_ENDPOINT
from tests.conftest import BOGUS_AWS_ENV, catalog_variant, pyiceberg_catalog, raw_load_table, write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


@pytest.fixture(scope="module")
def writer(engine_writer: CatalogPrincipal) -> CatalogPrincipal:
    return engine_writer


@pytest.fixture(scope="module")
def namespace(catalog_server: CatalogServer, writer: CatalogPrincipal) -> str:
    name = f"vended_{uuid.uuid4().hex[:6]}"
    pyiceberg_catalog(catalog_server, writer).create_namespace(name)
    return name


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-vended")


def connect(path: Path, server: CatalogServer, principal: CatalogPrincipal, **sections: dict[str, Any]) -> Session:
    return sqe.api.connect(write_sqe_config(path, server.url, principal, server.moto, **sections))


def explain_rows(session: Session, sql: str) -> list[dict[str, Any]]:
    return list(session.explain_tables(sql).to_pylist())


def loaded_of(session: Session) -> LoadedTable:
    """The table the session's latest query scanned."""
    assert len(session.last_streams) == 1
    return session.last_streams[0].plan.loaded


def first_data_file(loaded: LoadedTable) -> str:
    return str(next(iter(loaded.table.scan().plan_files())).file.file_path)


def test_bogus_ambient_keys_are_rejected_by_the_store(moto_server: MotoServer) -> None:
    """The premise of this module: the environment's keys do not work on moto."""
    s3 = boto3.client("s3", endpoint_url=moto_server.url, region_name=moto_server.region)
    with pytest.raises(ClientError) as caught:
        s3.list_objects_v2(Bucket=moto_server.bucket)
    assert caught.value.response["Error"]["Code"] in ("InvalidAccessKeyId", "AccessDenied", "403")


def test_ctas_insert_select_succeed_only_through_vended_credentials(
    catalog_server: CatalogServer, writer: CatalogPrincipal, namespace: str, tmp_path: Path
) -> None:
    with connect(tmp_path / "sqe.toml", catalog_server, writer) as session:
        assert session.config is not None and session.config.static_key_pair() is None
        created = session.sql(
            f"CREATE TABLE {namespace}.orders AS SELECT * FROM (VALUES (1, 'ada'), (2, 'grace')) v(id, name)"
        ).arrow()
        assert created.column("count").to_pylist() == [2]
        inserted = session.sql(f"INSERT INTO {namespace}.orders VALUES (3, 'linus')").arrow()
        assert inserted.column("count").to_pylist() == [1]
        rows = session.sql(f"SELECT id, name FROM {namespace}.orders ORDER BY id").fetchall()
        assert rows == [(1, "ada"), (2, "grace"), (3, "linus")]
        loaded = loaded_of(session)
        resolved = loaded.io.resolve(first_data_file(loaded))  # type: ignore[attr-defined]
        assert (
            resolved.source == "vended" and resolved.properties[S3_ACCESS_KEY_ID] != BOGUS_AWS_ENV["AWS_ACCESS_KEY_ID"]
        )
        [explained] = explain_rows(session, f"SELECT count(*) FROM {namespace}.orders")
    assert explained["credential_source"] == "vended"
    assert explained["credential_expires_at"] and explained["files_planned"] == 2


def test_require_vended_against_a_non_vending_catalog_fails_before_any_read(
    moto_server: MotoServer, module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = module_dir / "novend"
    workdir.mkdir()
    with catalog_variant(workdir, moto_server, vend_credentials=False, location="s3://warehouse/novend") as novend:
        owner = novend.admin  # holds every privilege (saves slow admin calls)
        pyiceberg_catalog(novend, owner).create_namespace("ns")
        static = {"access_key_id": moto_server.access_key_id, "secret_access_key": moto_server.secret_access_key}
        static_mode = {"access_delegation": "none", "require_vended_credentials": False}
        # Static mode: SQE's own [storage] pair (the catalog's key) writes and reads, and EXPLAIN says so.
        with connect(workdir / "static.toml", novend, owner, catalog=static_mode, storage=static) as session:
            session.sql("CREATE TABLE ns.plain AS SELECT * FROM (VALUES (1, 'x'), (2, 'y')) v(id, name)")
            assert session.sql("SELECT sum(id) FROM ns.plain").fetchall() == [(3,)]
            [explained] = explain_rows(session, "SELECT * FROM ns.plain")
            assert explained["credential_source"] == "static"
            assert explained["credential_expires_at"] == ""
        # Even a *working* ambient key (the catalog's own, in the environment) must not be used.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_server.access_key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_server.secret_access_key)
        monkeypatch.delenv("AWS_SESSION_TOKEN")
        with connect(workdir / "vended.toml", novend, owner) as session:
            with pytest.raises(NoVendedCredentialsError) as caught:
                session.sql("SELECT * FROM ns.plain").arrow()
            assert session.last_streams == []  # failed at load time: no scan was ever bound
            with pytest.raises(NoVendedCredentialsError):
                session.sql("EXPLAIN SELECT * FROM ns.plain")
    message = str(caught.value)
    assert "no vended credentials for s3://warehouse/novend/ns/plain" in message
    assert "require_vended_credentials" in message and "\n" not in message
    assert moto_server.secret_access_key not in message


def test_longest_prefix_on_segment_boundaries(
    catalog_server: CatalogServer, writer: CatalogPrincipal, namespace: str, tmp_path: Path
) -> None:
    with connect(tmp_path / "sqe.toml", catalog_server, writer) as session:
        for name, value in (("t1", 1), ("t10", 10)):
            session.sql(f"CREATE TABLE {namespace}.{name} AS SELECT {value} AS v")
        assert session.sql(f"SELECT v FROM {namespace}.t1").fetchall() == [(1,)]
        t1 = loaded_of(session)
        assert session.sql(f"SELECT v FROM {namespace}.t10").fetchall() == [(10,)]
        t10 = loaded_of(session)
    t1_file, t10_file = first_data_file(t1), first_data_file(t10)
    assert t10_file.startswith(t1.table.location())  # the trap: a raw startswith would match t1's prefix
    # One FileIO holding both tables' vended entries, as a catalog covering two locations would send them.
    raw1 = raw_load_table(catalog_server, writer, namespace, "t1")
    raw10 = raw_load_table(catalog_server, writer, namespace, "t10")
    both = ScopedFileIO.from_response(
        {"config": raw1["config"], "storage-credentials": raw1["storage-credentials"] + raw10["storage-credentials"]},
        StoragePolicy.from_config(session.config),  # type: ignore[arg-type]
    )
    for path, raw, loaded in ((t10_file, raw10, t10), (t1_file, raw1, t1)):
        resolved = both.resolve(path)
        entry = raw["storage-credentials"][0]
        assert resolved.prefix == entry["prefix"] == loaded.table.location()
        assert resolved.properties[S3_ACCESS_KEY_ID] == entry["config"][S3_ACCESS_KEY_ID]
        with both.new_input(path).open() as stream:  # and the chosen key really reads the file
            assert pq.read_table(stream).num_rows == 1
    assert (
        raw1["storage-credentials"][0]["config"][S3_ACCESS_KEY_ID]
        != raw10["storage-credentials"][0]["config"][S3_ACCESS_KEY_ID]
    )


def test_table_properties_cannot_choose_endpoint_or_fileio(
    catalog_server: CatalogServer, writer: CatalogPrincipal, namespace: str, tmp_path: Path
) -> None:
    with connect(tmp_path / "sqe.toml", catalog_server, writer) as session:
        session.sql(f"CREATE TABLE {namespace}.hostile AS SELECT 7 AS v")
    evil = {
        "s3.endpoint": "http://127.0.0.1:9",
        "s3.proxy-uri": "http://127.0.0.1:9",
        "s3.retry-strategy-impl": "sqe_no_such_module.EvilRetryStrategy",
        "s3.access-key-id": "AKIAFROMTABLEPROPS00",
    }
    table = pyiceberg_catalog(catalog_server, writer).load_table(f"{namespace}.hostile")
    with table.transaction() as transaction:
        transaction.set_properties(evil)
    # py-io-impl is refused by sqe-catalog itself; test_engine_retries has a proxy that injects it anyway.
    with pytest.raises(BadRequestError, match="py-io-impl"), table.transaction() as transaction:
        transaction.set_properties({"py-io-impl": "sqe_no_such_module.EvilFileIO"})
    with connect(tmp_path / "sqe.toml", catalog_server, writer) as session:
        assert session.sql(f"SELECT v FROM {namespace}.hostile").fetchall() == [(7,)]
        loaded = loaded_of(session)
        [explained] = explain_rows(session, f"SELECT v FROM {namespace}.hostile")
    assert {k: loaded.table.properties.get(k) for k in evil} == evil  # the properties are really there
    resolved = loaded.io.resolve(first_data_file(loaded))  # type: ignore[attr-defined]
    assert resolved.properties[S3_ENDPOINT] == catalog_server.moto.url
    assert resolved.properties[S3_ACCESS_KEY_ID] != evil["s3.access-key-id"]
    assert not set(resolved.properties) & {"py-io-impl", "s3.proxy-uri", "s3.retry-strategy-impl"}
    assert "127.0.0.1:9" not in str(explained) and explained["credential_source"] == "vended"


def test_static_pair_never_mixes_with_vended_credentials(
    catalog_server: CatalogServer, writer: CatalogPrincipal, namespace: str, tmp_path: Path
) -> None:
    bogus_static = {"access_key_id": "AKIASTATICBOGUS00000", "secret_access_key": "bogus-static-secret"}
    loose = {"require_vended_credentials": False}
    with connect(tmp_path / "sqe.toml", catalog_server, writer, catalog=loose, storage=bogus_static) as session:
        assert session.config is not None and session.config.static_key_pair() is not None
        session.sql(f"CREATE TABLE {namespace}.mixed AS SELECT * FROM (VALUES (1), (2), (3)) v(n)")
        session.sql(f"INSERT INTO {namespace}.mixed VALUES (4)")
        assert session.sql(f"SELECT sum(n) FROM {namespace}.mixed").fetchall() == [(10,)]
        loaded = loaded_of(session)
        [explained] = explain_rows(session, f"SELECT n FROM {namespace}.mixed")
    assert explained["credential_source"] == "vended"
    for task in loaded.table.scan().plan_files():
        resolved = loaded.io.resolve(task.file.file_path)  # type: ignore[attr-defined]
        assert resolved.source == "vended"
        assert bogus_static["access_key_id"] not in resolved.properties.values()
        assert bogus_static["secret_access_key"] not in resolved.properties.values()


def test_the_embedded_provider_serves_the_credentials_endpoint_the_coordinator_refreshes_from(
    catalog_server: CatalogServer, writer: CatalogPrincipal, namespace: str, module_dir: Path
) -> None:
    """``sqe.api.connect`` gives a lazily built provider; its ``load_table_credentials`` (what the distributed
    coordinator calls before a push) is the catalog's ``/credentials`` for this user, a vended set per prefix."""
    from sqe.catalog.base import TableIdent
    from sqe.catalog.lazy import LazyRestTableProvider

    with connect(module_dir / "credentials.toml", catalog_server, writer) as session:
        session.sql(f"CREATE TABLE {namespace}.creds AS SELECT 1 AS a")
        provider = session._provider
        assert isinstance(provider, LazyRestTableProvider)
        found = provider.load_table_credentials(TableIdent(catalog_server.warehouse, (namespace,), "creds"))
        assert found is not None and found.sets, "the catalog advertises /credentials and vends a set"
        assert all(s.source == "vended" and not s.missing_parts() and s.covers_object_store() for s in found.sets)
        assert all(catalog_server.moto.secret_access_key not in repr(s) for s in found.sets)


def test_a_connected_session_closes_its_catalog_client_with_it(
    catalog_server: CatalogServer, writer: CatalogPrincipal, namespace: str, module_dir: Path
) -> None:
    """``sqe.api.connect`` makes the catalog client, so closing the session closes it (its HTTP pools go at once,
    not when the garbage collector gets to them)."""
    session = connect(module_dir / "closing.toml", catalog_server, writer)
    provider = session._provider
    assert isinstance(provider, LazyRestTableProvider)
    session.sql("SELECT 1").fetchall()
    assert not provider.built  # a statement without tables never builds it
    session.sql(f"CREATE TABLE {namespace}.closing AS SELECT 1 AS v")
    assert provider.built
    session.close()
    assert not provider.built
