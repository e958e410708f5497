"""External tables through ``sqe serve``: each user's own, and never keyed from the server's environment.

A second server on the same catalog and users as ``test_server.served``, configured as an operator plausibly
would: its ``[storage]`` pair given through the environment (``SQE_STORAGE__...``) and a Fernet key for sealed
mounts. Then:
- a mount naming environment variables would read with the server's key (any location, governed tables' raw
  files included): refused, whether or not the variable is set;
- one user's mounts are not listed, read or dropped by another, and never shadow an Iceberg table for another.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from cryptography.fernet import Fernet

from sqe.server._proto import flight_sql_pb2 as sql_pb
from tests.conftest import CatalogPrincipal, pyiceberg_catalog
from tests.e2e.test_server import Served, _bearer, _command, _reader_settings, _two_scopes, served, start_server

__all__ = ["served"]  # the module fixture of test_server, shared (the second server joins its users)

pytestmark = [pytest.mark.e2e]

PEOPLE_COLUMNS = "(id BIGINT, name VARCHAR, region VARCHAR, ssn VARCHAR)"


@dataclass
class World:
    served: Served
    url: str


@pytest.fixture(scope="module")
def world(
    served: Served, catalog_reader: CatalogPrincipal, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    from tests.helpers.processes import stop_child

    catalog = served.catalog
    workdir = tmp_path_factory.mktemp("external_served")
    engine = [
        "[catalog]",
        f'uri = "{catalog.url}"',
        f'warehouse = "{catalog.warehouse}"',
        'access_delegation = "vended-credentials"',
        "require_vended_credentials = true",
        "[storage]",
        f'endpoint = "{catalog.moto.url}"',
        f'region = "{catalog.moto.region}"',
        "path_style = true",
    ]
    (workdir / "engine.toml").write_text("\n".join(engine) + "\n", encoding="utf-8")
    settings = {"engine_config": "engine.toml", "listen": "127.0.0.1:0", **_reader_settings(catalog_reader)}
    config = workdir / "server.toml"
    config.write_text("[server]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    config.chmod(0o600)
    env = {
        "SQE_STORAGE__ACCESS_KEY_ID": catalog.moto.access_key_id,
        "SQE_STORAGE__SECRET_ACCESS_KEY": catalog.moto.secret_access_key,
        "SQE_EXTERNAL_TABLES_KEY": Fernet.generate_key().decode(),
    }
    proc, port = start_server(workdir, config, env)
    try:
        yield World(served, f"grpc://127.0.0.1:{port}")
    finally:
        stop_child(proc)


def _sql(world: World, who: str, sql: str) -> pa.Table:
    return _sql_as(world, world.served.token(who), sql)


def _sql_as(world: World, token: str, sql: str) -> pa.Table:
    client = flight.FlightClient(world.url)
    options = _bearer(token)
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
    return client.do_get(info.endpoints[0].ticket, options).read_all()


def _put_parquet(world: World, table: pa.Table) -> str:
    moto = world.served.catalog.moto
    prefix = f"private_{uuid.uuid4().hex[:8]}"
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    moto.client("s3").put_object(Bucket=moto.bucket, Key=f"{prefix}/part-0.parquet", Body=buffer.getvalue())
    return f"s3://{moto.bucket}/{prefix}"


def _mount(world: World, who: str, table_and_columns: str, location: str) -> None:
    """``who`` mounts ``location`` with the mount's own keys (sealed by the server)."""
    _mount_as(world, world.served.token(who), table_and_columns, location)


def _mount_as(world: World, token: str, table_and_columns: str, location: str) -> None:
    moto = world.served.catalog.moto
    keys = f"access_key_id = '{moto.access_key_id}', secret_access_key = '{moto.secret_access_key}'"
    create = f"CREATE EXTERNAL TABLE {table_and_columns} STORED AS PARQUET LOCATION '{location}' WITH ({keys})"
    _sql_as(world, token, create)


def test_a_mount_never_reads_with_the_servers_keys(world: World) -> None:
    """Neither the server's [storage] pair nor its environment: not on a governed table, nor anywhere else."""
    namespace = world.served.namespace
    location = f"{world.served.catalog.warehouse_location}/{namespace}/people/data"
    elsewhere = _put_parquet(world, pa.table({"note": ["readable with the server's key"]}))
    for where in (location, elsewhere):
        with pytest.raises(flight.FlightError, match="does not let external tables read with its \\[storage\\] key"):
            _sql(
                world,
                "bob",
                f"CREATE EXTERNAL TABLE {namespace}.by_server (note VARCHAR) STORED AS PARQUET LOCATION '{where}'",
            )
    for variable in ("SQE_STORAGE__ACCESS_KEY_ID", "NOT_SET_ANYWHERE"):  # the same answer, set or not
        env_keys = f"access_key_id_env = '{variable}', secret_access_key_env = 'SQE_STORAGE__SECRET_ACCESS_KEY'"
        create = f"CREATE EXTERNAL TABLE {namespace}.raw_env {PEOPLE_COLUMNS} STORED AS PARQUET LOCATION '{location}'"
        with pytest.raises(flight.FlightError, match="does not let external tables read keys from its environment"):
            _sql(world, "bob", f"{create} WITH ({env_keys})")
    rows = sorted(_sql(world, "bob", f"SELECT id, ssn FROM {namespace}.people").to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 2, "ssn": None}, {"id": 4, "ssn": None}, {"id": 5, "ssn": None}]  # still only bob's view


def test_one_users_mounts_are_invisible_and_unusable_to_another(world: World) -> None:
    namespace = world.served.namespace
    location = _put_parquet(world, pa.table({"note": ["carol's data"]}))
    _mount(world, "carol", f"{namespace}.carol_mount (note VARCHAR)", location)
    assert _sql(world, "carol", f"SELECT note FROM {namespace}.carol_mount").to_pylist() == [{"note": "carol's data"}]
    assert not [r for r in _sql(world, "alice", "SHOW EXTERNAL TABLES").to_pylist() if "carol_mount" in r["table"]]
    with pytest.raises(flight.FlightError):
        _sql(world, "alice", f"SELECT note FROM {namespace}.carol_mount")
    assert _sql(world, "bob", f"DROP EXTERNAL TABLE IF EXISTS {namespace}.carol_mount").to_pylist() == [
        {"dropped": False}
    ]
    assert _sql(world, "carol", f"SELECT note FROM {namespace}.carol_mount").num_rows == 1  # still hers


def test_a_mount_never_shadows_an_iceberg_table_for_another_user(world: World) -> None:
    namespace = world.served.namespace
    location = _put_parquet(world, pa.table({"id": pa.array([666], pa.int64()), "name": ["planted by carol"]}))
    _mount(world, "carol", f"{namespace}.orders (id BIGINT, name VARCHAR)", location)
    real = pa.table({"id": pa.array([1], pa.int64()), "name": ["real order"]})
    writer = pyiceberg_catalog(world.served.catalog, world.served.users["writer"])
    writer.create_table((namespace, "orders"), schema=real.schema).append(real)
    assert _sql(world, "alice", f"SELECT * FROM {namespace}.orders").to_pylist() == [{"id": 1, "name": "real order"}]


def test_a_mount_belongs_to_the_authority_it_was_created_under(world: World) -> None:
    """Found by review: mounts were kept per principal, so a token of the same principal scoped to fewer roles
    listed, read (with the keys sealed under the wider token) and dropped the wider token's mounts, and a mount
    it made would have replaced a same-named table for the wider one. A token issued again with the same roles
    is the same authority and keeps them."""
    namespace = world.served.namespace
    wide, narrow = _two_scopes(world.served)
    location = _put_parquet(world, pa.table({"note": ["under every role"]}))
    name = f"{namespace}.wide_{uuid.uuid4().hex[:6]}"
    _mount_as(world, wide, f"{name} (note VARCHAR)", location)

    assert not [r for r in _sql_as(world, narrow, "SHOW EXTERNAL TABLES").to_pylist() if r["table"].endswith(name)]
    with pytest.raises(flight.FlightError) as refused:
        _sql_as(world, narrow, f"SELECT note FROM {name}")
    assert "under every role" not in str(refused.value)
    assert _sql_as(world, narrow, f"DROP EXTERNAL TABLE IF EXISTS {name}").to_pylist() == [{"dropped": False}]
    assert _sql_as(world, wide, f"SELECT note FROM {name}").to_pylist() == [{"note": "under every role"}]
    assert [r for r in _sql_as(world, wide, "SHOW EXTERNAL TABLES").to_pylist() if r["table"].endswith(name)]

    first = world.served.token("carol")
    _mount_as(world, first, f"{name}_kept (note VARCHAR)", location)
    time.sleep(1.1)  # iat counts whole seconds: the next token differs from the first
    second = world.served.token("carol")
    assert first != second
    assert _sql_as(world, second, f"SELECT note FROM {name}_kept").to_pylist() == [{"note": "under every role"}]
