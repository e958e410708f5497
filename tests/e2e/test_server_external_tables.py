"""External tables through ``sqe serve``: each user's own, and never keyed from the server's environment.

A second server on the same catalog and users as ``test_server.served``, configured as an operator plausibly
would: its ``[storage]`` pair given through the environment (``SQE_STORAGE__...``) and a Fernet key for sealed
mounts. Then:
- a mount naming environment variables would read with the server's key (any location, governed tables' raw
  files included): refused, whether or not the variable is set;
- one user's mounts are not listed, read or dropped by another, and never shadow an Iceberg table for another.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest
from cryptography.fernet import Fernet

from sqe.server._proto import flight_sql_pb2 as sql_pb
from sqe.server.identity import authority_of
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

    workdir = tmp_path_factory.mktemp("external_served")
    config, env = _server_files(workdir, served, catalog_reader)
    proc, port = start_server(workdir, config, env)
    try:
        yield World(served, f"grpc://127.0.0.1:{port}")
    finally:
        stop_child(proc)


def _server_files(workdir: Path, served: Served, catalog_reader: CatalogPrincipal) -> tuple[Path, dict[str, str]]:
    """A server config in ``workdir`` (mount stores beside its engine config) and the environment it runs with."""
    catalog = served.catalog
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
    return config, env


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
    keys = _mount_keys(world.served)
    create = f"CREATE EXTERNAL TABLE {table_and_columns} STORED AS PARQUET LOCATION '{location}' WITH ({keys})"
    _sql_as(world, token, create)


def _mount_keys(served: Served) -> str:
    moto = served.catalog.moto
    return f"access_key_id = '{moto.access_key_id}', secret_access_key = '{moto.secret_access_key}'"


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


# ----------------------------------------------------------------- mount stores across versions (found by review)


@contextlib.contextmanager
def _serving(workdir: Path, config: Path, env: dict[str, str], served: Served) -> Iterator[World]:
    from tests.helpers.processes import stop_child

    (workdir / "port").unlink(missing_ok=True)  # a restart: the last server's port file would name its port
    proc, port = start_server(workdir, config, env)
    try:
        yield World(served, f"grpc://127.0.0.1:{port}")
    finally:
        stop_child(proc)


def _subject(token: str) -> str:
    payload = token.split(".")[-2]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sub"])


def _per_user_stores(workdir: Path) -> list[Path]:
    return sorted(workdir.glob("sqe-external-tables.*.db"))


def _stores_cli(config: Path, *options: str) -> str:
    """``sqe serve --config ... OPTIONS`` as an operator runs it beside the server; its standard output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SQE_"))}
    command = [sys.executable, "-m", "sqe.cli", "serve", "--config", str(config), *options]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_mount_store_of_an_earlier_version_is_moved_to_its_new_name_across_a_restart(
    served: Served, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    """Found by review: stores were named by 16 hex digits of SHA-256 (64 bits: two owners could share one, and
    read, drop and shadow each other's mounts). Now by the whole digest; a store a server of an earlier version
    wrote under its 64-bit name moves to the new name when its owner comes back, rather than being left behind
    (the user would have found no mounts after the upgrade)."""
    config, env = _server_files(tmp_path, served, catalog_reader)
    namespace = served.namespace
    location = _put_parquet(World(served, ""), pa.table({"note": ["mounted before the upgrade"]}))
    token = served.token("carol")
    with _serving(tmp_path, config, env, served) as before:
        _mount_as(before, token, f"{namespace}.upgraded (note VARCHAR)", location)
    [store] = _per_user_stores(tmp_path)
    assert len(bytes.fromhex(store.name.split(".")[1])) == 32  # the whole SHA-256, not 8 bytes of it
    # what an earlier version left: that store under its 64-bit name (the old formula, written out)
    owner = f"user:{_subject(token)}\0{authority_of(token)}"
    legacy = tmp_path / f"sqe-external-tables.{hashlib.sha256(owner.encode()).hexdigest()[:16]}.db"
    store.rename(legacy)

    with _serving(tmp_path, config, env, served) as after:
        rows = _sql_as(after, served.token("carol"), f"SELECT note FROM {namespace}.upgraded").to_pylist()
        assert rows == [{"note": "mounted before the upgrade"}]
        assert _per_user_stores(tmp_path) == [store]  # moved, once: no copy left under the old name
        assert _sql_as(after, token, f"DROP EXTERNAL TABLE {namespace}.upgraded").to_pylist() == [{"dropped": True}]
    log = (tmp_path / "server.log").read_text(encoding="utf-8")
    assert "1 external-table store beside" in log  # the second start counted the store the first one made
    assert token not in log and authority_of(token) not in log and _subject(token) in log  # sub is no secret


def test_stores_unused_for_days_are_listed_and_pruned_but_never_one_in_use(
    served: Served, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    """Found by review: the store of an authority that is gone (a rotated secret, an opaque token issued again) was
    never read again nor removed by anything. ``sqe serve --list-external-stores`` names each store with its last
    use; ``--prune-external-stores DAYS`` deletes those unused for DAYS days, while the server runs too: a store a
    client session uses is marked as used, so it is kept."""
    config, env = _server_files(tmp_path, served, catalog_reader)
    namespace = served.namespace
    location = _put_parquet(World(served, ""), pa.table({"note": ["in use"]}))
    with _serving(tmp_path, config, env, served) as world:
        _mount_as(world, served.token("carol"), f"{namespace}.in_use (note VARCHAR)", location)
        [store] = _per_user_stores(tmp_path)
        gone = tmp_path / f"sqe-external-tables.{hashlib.sha256(b'an authority that is gone').hexdigest()}.db"
        shutil.copy(store, gone)
        long_ago = time.time() - 40 * 86400
        for path in (store, gone):
            os.utime(path, (long_ago, long_ago))
        listed = _stores_cli(config, "--list-external-stores")
        assert "2 external-table stores" in listed and listed.count("1 mount,") + listed.count("1 mount\n") == 2
        assert listed.count("days ago") == 2

        # carol comes back (a new connection: a new client session), which marks her store as used
        assert _sql_as(world, served.token("carol"), f"SELECT note FROM {namespace}.in_use").num_rows == 1
        pruned = _stores_cli(config, "--prune-external-stores", "30")
        assert "removed 1 external-table store" in pruned and gone.name in pruned and store.name not in pruned
        assert _per_user_stores(tmp_path) == [store]
        assert _sql_as(world, served.token("carol"), f"SELECT note FROM {namespace}.in_use").num_rows == 1


def _sql_on(client: flight.FlightClient, token: str, sql: str) -> pa.Table:
    """``sql`` on ``client``'s own connection: a client without cookies keeps one client session per connection."""
    options = _bearer(token)
    info = client.get_flight_info(_command(sql_pb.CommandStatementQuery(query=sql)), options)
    return client.do_get(info.endpoints[0].ticket, options).read_all()


def test_a_store_a_client_session_holds_is_never_pruned_however_old(
    served: Served, catalog_reader: CatalogPrincipal, tmp_path: Path
) -> None:
    """Found by review: the prune read a store's age, then deleted it, and a session used a store without any hold
    on it; an owner coming back between the two (her session marks the store and reads it) lost every mount. Here
    her session uses the store while its time says 40 days (what a prune read the instant before her mark): the
    prune run beside the server must keep it. A session now holds a shared lock on its store; a prune deletes only
    what it locks exclusively, re-reading the age under that lock."""
    config, env = _server_files(tmp_path, served, catalog_reader)
    namespace = served.namespace
    location = _put_parquet(World(served, ""), pa.table({"note": ["still mine"]}))
    token = served.token("carol")
    with _serving(tmp_path, config, env, served) as world:
        client = flight.FlightClient(world.url)
        try:
            _sql_on(
                client,
                token,
                f"CREATE EXTERNAL TABLE {namespace}.held (note VARCHAR) STORED AS PARQUET "
                f"LOCATION '{location}' WITH ({_mount_keys(served)})",
            )
            assert _sql_on(client, token, f"SELECT note FROM {namespace}.held").num_rows == 1
            [store] = _per_user_stores(tmp_path)
            long_ago = time.time() - 40 * 86400
            os.utime(store, (long_ago, long_ago))

            pruned = _stores_cli(config, "--prune-external-stores", "30")
            assert "removed 0 external-table stores" in pruned and "kept 1 store" in pruned
            assert store.exists()
            rows = _sql_on(client, token, f"SELECT note FROM {namespace}.held").to_pylist()
            assert rows == [{"note": "still mine"}]
        finally:
            client.close()


# ------------------------------------------------- SQE's own statements through ADBC, which prepares every one


def _adbc(world: World, token: str) -> Any:
    import adbc_driver_flightsql.dbapi as dbapi

    headers = {"adbc.flight.sql.authorization_header": f"Bearer {token}"}
    return dbapi.connect(world.url, db_kwargs=headers, autocommit=True)


def _adbc_rows(conn: Any, sql: str) -> list[dict[str, Any]]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetch_arrow_table().to_pylist())


def test_adbc_runs_sqes_own_statements_as_the_statement_path_does(world: World) -> None:
    """Found by review: ADBC prepares every statement, and preparing one of SQE's own statements (CREATE / DROP
    EXTERNAL TABLE, SHOW EXTERNAL TABLES, OPTIMIZE) failed with DuckDB's "Parser Error: syntax error at or near
    ...": none of them was usable from ADBC or JDBC clients. They now prepare and run as CommandStatementQuery runs
    them, with the same answers and the same refusals."""
    namespace = world.served.namespace
    location = _put_parquet(world, pa.table({"note": ["mounted through ADBC"]}))
    name = f"{namespace}.adbc_{uuid.uuid4().hex[:6]}"
    create = (
        f"CREATE EXTERNAL TABLE {name} (note VARCHAR) STORED AS PARQUET LOCATION '{location}' "
        f"WITH ({_mount_keys(world.served)})"
    )
    with _adbc(world, world.served.token("carol")) as conn:
        assert _adbc_rows(conn, create) == [{"created": True}]
        assert _adbc_rows(conn, f"SELECT note FROM {name}") == [{"note": "mounted through ADBC"}]
        assert [r for r in _adbc_rows(conn, "SHOW EXTERNAL TABLES") if r["table"].endswith(name)]
        assert _adbc_rows(conn, f"EXPLAIN SELECT note FROM {name}")  # statements DuckDB parses prepared before too
        assert "people" in [r["table"] for r in _adbc_rows(conn, f"SHOW TABLES FROM {namespace}")]
        assert _adbc_rows(conn, f"DROP EXTERNAL TABLE {name}") == [{"dropped": True}]
        assert not [r for r in _adbc_rows(conn, "SHOW EXTERNAL TABLES") if r["table"].endswith(name)]
        with pytest.raises(Exception) as malformed:  # a malformed own statement: its own error, at prepare
            _adbc_rows(conn, f"CREATE EXTERNAL TABLE {name} (note VARCHAR)")
    assert "QueryError: CREATE EXTERNAL TABLE needs STORED AS" in str(malformed.value), str(malformed.value)

    # OPTIMIZE: the writer compacts; a reader is refused as the statement path refuses them, nothing written
    writer = pyiceberg_catalog(world.served.catalog, world.served.users["writer"])
    rows = pa.table({"id": pa.array([1], pa.int64())})
    table = writer.create_table((namespace, f"compact_{uuid.uuid4().hex[:6]}"), schema=rows.schema)
    for _ in range(2):
        table.append(rows)
    target = f"{namespace}.{table.name()[-1]}"
    with _adbc(world, world.served.token("carol")) as conn, pytest.raises(Exception) as refused:
        _adbc_rows(conn, f"OPTIMIZE {target}")
    with pytest.raises(flight.FlightError) as refused_as_statement:
        _sql(world, "carol", f"OPTIMIZE {target}")
    statement_error = str(refused_as_statement.value).split(". Detail:")[0].split("gRPC")[0].strip()
    assert statement_error.startswith("PermissionDeniedError: "), statement_error
    assert statement_error[:120] in str(refused.value), (str(refused.value), statement_error)
    assert len(writer.load_table((namespace, table.name()[-1])).inspect.files()) == 2
    with _adbc(world, world.served.token("writer")) as conn:
        [optimized] = _adbc_rows(conn, f"OPTIMIZE {target}")
        assert (optimized["rewritten_files"], optimized["added_files"]) == (2, 1)
        assert _adbc_rows(conn, f"SELECT id FROM {target}") == [{"id": 1}, {"id": 1}]
