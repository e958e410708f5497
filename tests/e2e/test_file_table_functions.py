"""File table functions against real moto (IAM auth on) + sqe-catalog: read with the ``[storage]`` pair only
under allowed prefixes, every refused form with its exact error, never a governed table's files.

Bogus ``AWS_*`` variables are in the environment: a read that works used the configured static pair.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import sqe.api
from sqe.errors import ExternalAccessError, QueryError
from sqe.session import Session
from tests.conftest import pyiceberg_catalog, write_sqe_config

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


@pytest.fixture(scope="module")
def zone(moto_server: MotoServer) -> str:
    """``s3://bucket/tvf_<id>``: exports (allowed), private (not), and files in both."""
    base = f"tvf_{uuid.uuid4().hex[:6]}"
    s3 = moto_server.client("s3")
    for part, rows in ((1, [1, 2]), (2, [3])):
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": rows, "name": [f"n{r}" for r in rows]}), buffer)
        s3.put_object(Bucket=moto_server.bucket, Key=f"{base}/exports/part={part}/data.parquet", Body=buffer.getvalue())
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [9], "extra": ["x"]}), buffer)
    s3.put_object(Bucket=moto_server.bucket, Key=f"{base}/exports/wide/data.parquet", Body=buffer.getvalue())
    s3.put_object(Bucket=moto_server.bucket, Key=f"{base}/exports/a.csv", Body=b"k;v\n1;one\n2;two\n")
    body = "\n".join(json.dumps({"k": i, "v": f"j{i}"}) for i in range(3)).encode()
    s3.put_object(Bucket=moto_server.bucket, Key=f"{base}/exports/a.json", Body=body)
    s3.put_object(Bucket=moto_server.bucket, Key=f"{base}/exports_private/s.csv", Body=b"k\nsecret\n")
    s3.put_object(Bucket=moto_server.bucket, Key=f"{base}/private/s.csv", Body=b"k\nsecret\n")
    return f"s3://{moto_server.bucket}/{base}"


def connect(tmp_path: Path, server: CatalogServer, principal: CatalogPrincipal, **overrides: Any) -> Session:
    moto = server.moto
    path = write_sqe_config(
        tmp_path / "sqe.toml",
        server.url,
        principal,
        moto,
        catalog={"require_vended_credentials": False},
        storage={"access_key_id": moto.access_key_id, "secret_access_key": moto.secret_access_key},
    )
    return sqe.api.connect(path, **overrides)


def rows(session: Session, sql: str) -> list[dict[str, Any]]:
    return list(session.sql(sql).arrow().to_pylist())


def test_allowed_prefix_reads_parquet_glob_with_hive_partitions(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, zone: str, tmp_path: Path
) -> None:
    allowed = [f"{zone}/exports"]
    with connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_object_store_prefixes=allowed) as s:
        got = rows(s, f"SELECT id, name, part FROM read_parquet('{zone}/exports/part=*/*.parquet') ORDER BY id")
        assert got == [
            {"id": 1, "name": "n1", "part": 1},
            {"id": 2, "name": "n2", "part": 1},
            {"id": 3, "name": "n3", "part": 2},
        ]
        explained = s.sql(f"EXPLAIN SELECT * FROM read_parquet('{zone}/exports/part=*/*.parquet')").arrow()
        section = {r["property"]: r["value"] for r in explained.to_pylist() if r["section"] == "read_parquet"}
        assert section["files_scanned"] == "2" and section["credential_source"] == "static"
        assert catalog_server.moto.secret_access_key not in str(explained.to_pydict())
        # s3a:// inside the allowed prefix is the same object and reads the same
        assert rows(
            s, f"SELECT count(*) AS n FROM read_parquet('{zone.replace('s3://', 's3a://')}/exports/part=1/*')"
        ) == [{"n": 2}]


def test_union_by_name_csv_dialect_and_json(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, zone: str, tmp_path: Path
) -> None:
    allowed = [f"{zone}/exports"]
    with connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_object_store_prefixes=allowed) as s:
        union = rows(
            s,
            f"SELECT id, name, extra FROM read_parquet(['{zone}/exports/part=1/data.parquet', "
            f"'{zone}/exports/wide/data.parquet'], union_by_name = true, hive_partitioning = false) ORDER BY id",
        )
        assert union == [
            {"id": 1, "name": "n1", "extra": None},
            {"id": 2, "name": "n2", "extra": None},
            {"id": 9, "name": None, "extra": "x"},
        ]
        csv = rows(s, f"SELECT k, v FROM read_csv('{zone}/exports/a.csv', delim = ';', header = true) ORDER BY k")
        assert csv == [{"k": 1, "v": "one"}, {"k": 2, "v": "two"}]
        typed = rows(
            s, f"SELECT k FROM read_csv('{zone}/exports/a.csv', delim=';', columns={{'k': 'VARCHAR', 'v': 'VARCHAR'}})"
        )
        assert typed == [{"k": "1"}, {"k": "2"}]
        js = rows(s, f"SELECT sum(k) AS total FROM read_json('{zone}/exports/a.json')")
        assert js == [{"total": 3}]


def test_default_refuses_with_an_error_naming_the_setting(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, zone: str, tmp_path: Path
) -> None:
    with connect(tmp_path, catalog_server, engine_writer) as s, pytest.raises(ExternalAccessError) as caught:
        s.sql(f"SELECT * FROM read_parquet('{zone}/exports/part=1/data.parquet')").arrow()
    assert str(caught.value) == (
        "read_parquet: file table functions may not read object storage: set [storage.tvf] "
        "allowed_object_store_prefixes (or a catalog's tvf_prefixes)"
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("{zone}/private/s.csv", "read_csv: {zone}/private/s.csv is outside {setting}"),
        ("{zone}/exports_private/s.csv", "read_csv: {zone}/exports_private/s.csv is outside {setting}"),
        (
            "{zone}/export*/s.csv",
            "read_csv: the glob {zone}/export*/s.csv is not confined to an allowed prefix (its fixed part {zone}/ "
            "is outside {setting})",
        ),
        (
            "{zone}/exports/../private/s.csv",
            "read_csv: '.' and '..' path segments are not allowed in {zone}/exports/../private/s.csv",
        ),
        ("{s3a}/private/s.csv", "read_csv: {s3a}/private/s.csv is outside {setting}"),
        (
            "/etc/passwd",
            "read_csv: local files may not be read: /etc/passwd is not under [storage.tvf] allowed_local_prefixes "
            "(empty: none)",
        ),
        ("https://example.com/x.csv", "read_csv: scheme 'https' of https://example.com/x.csv is not supported"),
    ],
)
def test_refused_forms(
    catalog_server: CatalogServer,
    engine_writer: CatalogPrincipal,
    zone: str,
    tmp_path: Path,
    path: str,
    message: str,
) -> None:
    setting = "[storage.tvf] allowed_object_store_prefixes (or a catalog's tvf_prefixes)"
    s3a = zone.replace("s3://", "s3a://")
    allowed = [f"{zone}/exports"]
    with (
        connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_object_store_prefixes=allowed) as s,
        pytest.raises(ExternalAccessError) as caught,
    ):
        s.sql(f"SELECT * FROM read_csv('{path.format(zone=zone, s3a=s3a)}')").arrow()
    expected = message.format(zone=zone, s3a=s3a, setting=setting)
    assert str(caught.value).startswith(expected), str(caught.value)


def test_duckdb_own_file_access_stays_off(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, zone: str, tmp_path: Path
) -> None:
    allowed = [f"{zone}/exports"]
    with connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_object_store_prefixes=allowed) as s:
        with pytest.raises(QueryError):
            s.sql(f"SELECT * FROM '{zone}/exports/a.csv'").arrow()
        with pytest.raises(QueryError):
            s.sql(f"SELECT * FROM glob('{zone}/exports/*')").arrow()


def test_local_paths_only_under_allowed_local_prefixes(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "x.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    (tmp_path / "outside.csv").write_text("a\nsecret\n", encoding="utf-8")
    (allowed / "link.csv").symlink_to(tmp_path / "outside.csv")
    with connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_local_prefixes=[str(allowed)]) as s:
        assert rows(s, f"SELECT a + b AS c FROM read_csv('{allowed}/x.csv')") == [{"c": 3}]
        with pytest.raises(ExternalAccessError, match=r"is not under \[storage.tvf\] allowed_local_prefixes"):
            s.sql(f"SELECT * FROM read_csv('{tmp_path}/outside.csv')").arrow()
        with pytest.raises(ExternalAccessError, match="is not under"):  # a symlink out of the prefix
            s.sql(f"SELECT * FROM read_csv('{allowed}/link.csv')").arrow()


def test_prefix_overlapping_a_table_location_is_refused_at_start_and_per_query(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    namespace = f"tvfgov_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(catalog_server, engine_writer)
    catalog.create_namespace(namespace)
    root = catalog_server.warehouse_location
    zone = f"{root}/{namespace}_zone"
    # per query: a table created inside the allowed prefix after the session started
    with connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_object_store_prefixes=[zone]) as s:
        catalog.create_table(f"{namespace}.t", pa.schema([("id", pa.int64())]), location=f"{zone}/t")
        with pytest.raises(ExternalAccessError) as caught:
            s.sql(f"SELECT * FROM read_parquet('{zone}/t/data/*.parquet')").arrow()
    assert str(caught.value) == (
        f"file table function prefix {zone} overlaps the location {zone}/t of Iceberg table "
        f"{catalog_server.warehouse}.{namespace}.t; file table functions must not read governed table data"
    )
    # at start-up: the configured prefix covers that table's location
    with pytest.raises(ExternalAccessError, match=f"overlaps the location {zone}/t of Iceberg table"):
        connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_object_store_prefixes=[root])


def test_a_table_in_a_nested_namespace_is_governed(
    catalog_server: CatalogServer, engine_writer: CatalogPrincipal, tmp_path: Path
) -> None:
    namespace = f"tvfnest_{uuid.uuid4().hex[:6]}"
    catalog = pyiceberg_catalog(catalog_server, engine_writer)
    catalog.create_namespace(namespace)
    catalog.create_namespace((namespace, "inner"))
    zone = f"{catalog_server.warehouse_location}/{namespace}_zone"
    catalog.create_table((namespace, "inner", "t"), pa.schema([("id", pa.int64())]), location=f"{zone}/t")
    with pytest.raises(ExternalAccessError) as caught:
        connect(tmp_path, catalog_server, engine_writer, storage__tvf__allowed_object_store_prefixes=[zone])
    assert str(caught.value) == (
        f"file table function prefix {zone} overlaps the location {zone}/t of Iceberg table "
        f"{catalog_server.warehouse}.{namespace}.inner.t; file table functions must not read governed table data"
    )
