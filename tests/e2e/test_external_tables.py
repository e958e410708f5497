"""Hive-style external tables against real moto (IAM auth on): partition discovery and pruning, a mount's own
keys versus the ``[storage]`` pair, and keys never in clear in SHOW, EXPLAIN, logs or the definitions file."""

from __future__ import annotations

import io
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.fernet import Fernet

import sqe.api
from sqe.errors import CredentialError, ExternalAccessError, NoSuchTableError, QueryError
from sqe.session import Session
from tests.conftest import write_sqe_config

if TYPE_CHECKING:
    from tests.conftest import CatalogPrincipal, CatalogServer, MotoServer

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("bogus_aws_env")]


# This module's own catalog: a TVF or mount fails closed on any governed table it cannot load, and other modules
# leave such tables (tampered, policy-conflicted) in the shared session catalog.
@pytest.fixture(scope="module")
def catalog_server(own_catalog: CatalogServer) -> CatalogServer:
    return own_catalog


@pytest.fixture(scope="module")
def engine_writer(own_writer: CatalogPrincipal) -> CatalogPrincipal:
    return own_writer


KEY_ENV = "SQE_EXTERNAL_TABLES_KEY"


@pytest.fixture(scope="module")
def sales(moto_server: MotoServer) -> str:
    """``s3://bucket/hive_<id>/sales`` partitioned by region (eu: 2 rows, us: 1 row)."""
    base = f"hive_{uuid.uuid4().hex[:6]}/sales"
    s3 = moto_server.client("s3")
    for region, ids in (("eu", [1, 2]), ("us", [3])):
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": ids, "amount": [float(i) * 10 for i in ids]}), buffer)
        s3.put_object(Bucket=moto_server.bucket, Key=f"{base}/region={region}/part-0.parquet", Body=buffer.getvalue())
    return f"s3://{moto_server.bucket}/{base}"


@pytest.fixture()
def sealing_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = Fernet.generate_key().decode()
    monkeypatch.setenv(KEY_ENV, key)
    return key


def connect(tmp_path: Path, server: CatalogServer, principal: CatalogPrincipal, *, static: bool) -> Session:
    moto = server.moto
    storage: dict[str, Any] = {}
    if static:
        storage = {"access_key_id": moto.access_key_id, "secret_access_key": moto.secret_access_key}
    path = write_sqe_config(
        tmp_path / "sqe.toml",
        server.url,
        principal,
        moto,
        catalog={"require_vended_credentials": False},
        storage=storage,
    )
    return sqe.api.connect(path)


def create_sql(sales: str, name: str = "ext.sales", with_keys: str = "") -> str:
    return (
        f"CREATE EXTERNAL TABLE {name} (id BIGINT, amount DOUBLE) STORED AS PARQUET "
        f"LOCATION '{sales}' PARTITIONED BY (region VARCHAR){with_keys}"
    )


def test_partitioned_mount_with_the_storage_pair_prunes_partitions(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, sales: str, tmp_path: Path
) -> None:
    with connect(tmp_path, catalog_server, engine_writer, static=True) as s:
        s.sql(create_sql(sales))
        got = s.sql("SELECT id, amount, region FROM ext.sales WHERE region = 'eu' ORDER BY id").arrow().to_pylist()
        assert got == [{"id": 1, "amount": 10.0, "region": "eu"}, {"id": 2, "amount": 20.0, "region": "eu"}]
        assert s.sql("SELECT count(*) AS n FROM ext.sales").arrow().to_pylist() == [{"n": 3}]
        label = f"{catalog_server.warehouse}.ext.sales"
        pruned = _explained(s, "EXPLAIN SELECT * FROM ext.sales WHERE region = 'eu'", label)
        assert (pruned["files_listed"], pruned["files_scanned"]) == ("2", "1")
        assert "region" in pruned["partition_filter"] and pruned["credential_source"] == "static"
        whole = _explained(s, "EXPLAIN SELECT * FROM ext.sales WHERE amount > 0", label)
        assert (whole["files_listed"], whole["files_scanned"]) == ("2", "2")
        shown = s.sql("SHOW EXTERNAL TABLES").arrow().to_pylist()
        assert [(r["table"], r["partitioned_by"], r["credentials"]) for r in shown] == [
            (f"{catalog_server.warehouse}.ext.sales", "region VARCHAR", "[storage] pair")
        ]
        s.sql("DROP EXTERNAL TABLE ext.sales")
        assert s.sql("SHOW EXTERNAL TABLES").arrow().num_rows == 0
        with pytest.raises(NoSuchTableError, match="no external table"):
            s.sql("DROP EXTERNAL TABLE ext.sales")


def test_own_keys_are_sealed_and_used_without_a_storage_pair(
    catalog_server: CatalogServer,
    engine_writer: CatalogPrincipal,
    sales: str,
    tmp_path: Path,
    sealing_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    moto = catalog_server.moto
    keys = f" WITH (access_key_id = '{moto.access_key_id}', secret_access_key = '{moto.secret_access_key}')"
    caplog.set_level(logging.DEBUG)
    with connect(tmp_path, catalog_server, engine_writer, static=False) as s:
        s.sql(create_sql(sales, "ext.own", keys))
        s.sql(create_sql(sales, "ext.nokeys"))
        assert s.sql("SELECT sum(id) AS total FROM ext.own").arrow().to_pylist() == [{"total": 6}]
        with pytest.raises(CredentialError, match=r"no \[storage\] access_key_id/secret_access_key"):
            s.sql("SELECT * FROM ext.nokeys").arrow()
        shown = s.sql("SHOW EXTERNAL TABLES").arrow()
        explained = s.sql("EXPLAIN SELECT * FROM ext.own WHERE region = 'us'").arrow()
    definitions = (tmp_path / "sqe-external-tables.db").read_bytes()
    assert moto.secret_access_key.encode() not in definitions
    assert moto.access_key_id.encode() not in definitions
    for text in (str(shown.to_pydict()), str(explained.to_pydict()), caplog.text):
        assert moto.secret_access_key not in text
    assert "own (encrypted)" in str(shown.to_pydict())
    # a different sealing key cannot open them
    with connect(tmp_path, catalog_server, engine_writer, static=False) as s:
        import os

        os.environ[KEY_ENV] = Fernet.generate_key().decode()
        with pytest.raises(QueryError, match="cannot be decrypted") as caught:
            s.sql("SELECT * FROM ext.own").arrow()
        assert moto.secret_access_key not in str(caught.value)


def test_own_keys_without_a_sealing_key_are_refused(
    catalog_server: CatalogServer,
    engine_writer: CatalogPrincipal,
    sales: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    moto = catalog_server.moto
    keys = f" WITH (access_key_id = '{moto.access_key_id}', secret_access_key = '{moto.secret_access_key}')"
    with connect(tmp_path, catalog_server, engine_writer, static=False) as s:
        with pytest.raises(QueryError) as caught:
            s.sql(create_sql(sales, "ext.plain", keys))
        assert str(caught.value).startswith(f"a mount's own keys are stored encrypted: set ${KEY_ENV}")
        assert moto.secret_access_key not in str(caught.value)
        # by reference: only the variable names are stored
        monkeypatch.setenv("MOUNT_KEY_ID", moto.access_key_id)
        monkeypatch.setenv("MOUNT_SECRET", moto.secret_access_key)
        ref = " WITH (access_key_id_env = 'MOUNT_KEY_ID', secret_access_key_env = 'MOUNT_SECRET')"
        s.sql(create_sql(sales, "ext.byref", ref))
        assert s.sql("SELECT count(*) AS n FROM ext.byref WHERE region = 'us'").arrow().to_pylist() == [{"n": 1}]
    assert moto.secret_access_key.encode() not in (tmp_path / "sqe-external-tables.db").read_bytes()


def _governed_namespace(catalog_server: CatalogServer, writer: CatalogPrincipal) -> str:
    """The location of a fresh namespace holding one Iceberg table ``t``."""
    from tests.conftest import pyiceberg_catalog

    namespace = f"extgov_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(catalog_server, writer)
    catalog.create_namespace(namespace)
    catalog.create_table(f"{namespace}.t", pa.schema([("id", pa.int64())]))
    return f"{catalog_server.warehouse_location}/{namespace}"


def test_a_static_mount_on_a_governed_location_is_refused(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    with connect(tmp_path, catalog_server, engine_writer, static=True) as s:
        location = _governed_namespace(catalog_server, engine_writer)
        with pytest.raises(ExternalAccessError, match=f"overlaps the location {location}/t"):
            s.sql(f"CREATE EXTERNAL TABLE ext.gov (id BIGINT) STORED AS PARQUET LOCATION '{location}'")


def test_an_environment_keyed_mount_on_a_governed_location_is_refused(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys named by environment variables are the engine's, not ones the user showed: like the [storage] pair,
    they never open a governed table's files (at creation, and again at every read)."""
    moto = catalog_server.moto
    monkeypatch.setenv("MOUNT_KEY_ID", moto.access_key_id)
    monkeypatch.setenv("MOUNT_SECRET", moto.secret_access_key)
    with connect(tmp_path, catalog_server, engine_writer, static=False) as s:
        location = _governed_namespace(catalog_server, engine_writer)
        by_env = " WITH (access_key_id_env = 'MOUNT_KEY_ID', secret_access_key_env = 'MOUNT_SECRET')"
        with pytest.raises(ExternalAccessError, match=f"overlaps the location {location}/t"):
            s.sql(f"CREATE EXTERNAL TABLE ext.gov_env (id BIGINT) STORED AS PARQUET LOCATION '{location}'{by_env}")


def _explained(session: Any, sql: str, section: str) -> dict[str, str]:
    """EXPLAIN's (vertical) section of one source, as property -> value."""
    rows = session.sql(sql).arrow().to_pylist()
    found = {r["property"]: r["value"] for r in rows if r["section"] == section}
    assert found, f"no EXPLAIN section {section!r}"
    return found


def test_writes_into_an_external_table_are_refused(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, sales: str, tmp_path: Path
) -> None:
    with connect(tmp_path, catalog_server, engine_writer, static=True) as s:
        s.sql(create_sql(sales, "ext.readonly"))
        label = f"{catalog_server.warehouse}.ext.readonly"
        for sql in (
            "INSERT INTO ext.readonly VALUES (9, 1.0, 'eu')",
            "INSERT INTO ext.readonly SELECT * FROM ext.readonly",
            "DELETE FROM ext.readonly WHERE id = 1",
            "UPDATE ext.readonly SET amount = 0",
        ):
            with pytest.raises(ExternalAccessError) as caught:
                s.sql(sql)
            assert str(caught.value) == f"{label} is an external table: SQE reads mounts only and never writes to them"
        assert s.sql("SELECT count(*) AS n FROM ext.readonly").arrow().to_pylist() == [{"n": 3}]
