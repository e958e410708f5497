"""The stack's catalog set-up without servers: the catalog.toml writer (checked by the catalog's own parser)
and the demo principals created through ``sqe_catalog.admin.open_auth_store`` on a real SQLite database."""

from __future__ import annotations

import dataclasses
import os
import stat
import tomllib
from pathlib import Path

import pytest

from sqe_catalog.admin import open_auth_store
from sqe_catalog.config import load_config
from sqe_stack.catalog import (
    ANALYST_PRIVILEGES,
    WAREHOUSE,
    WRITER_PRIVILEGES,
    Grant,
    PrincipalSpec,
    bootstrap_principals,
    create_principal,
    read_store_handle,
    server_settings,
    warehouse_settings,
    write_catalog_config,
    write_stack_catalog_config,
)
from sqe_stack.provision import Daemon, StackError, StoreHandle

STORE = StoreHandle(
    kind="moto",
    s3_endpoint="http://127.0.0.1:9",
    sts_endpoint="http://127.0.0.1:9",
    role_arn="arn:aws:iam::123456789012:role/lakehouse",
    access_key_id="AKIDSTACKTEST",
    secret_access_key="stack-test-secret-access-key",
    daemons=(),
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_stack_config_is_private_and_parses(tmp_path: Path) -> None:
    path = write_stack_catalog_config(tmp_path, 8181, STORE, credential_lifetime=60)
    assert _mode(path) == 0o600 and _mode(tmp_path / "catalog.db") == 0o600
    config = load_config(path)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8181)
    warehouse = config.warehouse(WAREHOUSE)
    assert warehouse is not None
    assert warehouse.location == "s3://warehouse/demo" and warehouse.credential_lifetime_seconds == 60
    assert warehouse.static_key_pair() == (STORE.access_key_id, STORE.secret_access_key)
    assert STORE.secret_access_key not in repr(STORE)


def test_the_running_store_is_read_back_from_the_config_without_its_daemons(tmp_path: Path) -> None:
    started = Daemon(name="moto", pid=os.getpid(), markers=("moto.server",))
    store = dataclasses.replace(STORE, sts_endpoint="http://127.0.0.1:10", daemons=(started,))
    path = write_stack_catalog_config(tmp_path, 8181, store, credential_lifetime=60)
    assert read_store_handle(path, "moto") == dataclasses.replace(store, daemons=())  # another's to stop


def test_overrides_replace_and_add_keys(tmp_path: Path) -> None:
    warehouse = {**warehouse_settings(STORE, name="wh", location="s3://warehouse/wh"), "vend_credentials": False}
    server = {**server_settings(tmp_path, 1234, log_level="debug"), "port": 4321}
    path = write_catalog_config(tmp_path / "catalog.toml", server, warehouse)
    with path.open("rb") as fh:
        doc = tomllib.load(fh)
    assert doc["server"]["port"] == 4321 and doc["server"]["log_level"] == "debug"
    assert doc["warehouses"] == [{**warehouse, "vend_credentials": False}]


def test_an_invalid_config_is_a_one_line_error(tmp_path: Path) -> None:
    server = {**server_settings(tmp_path, 1234), "port": "not-a-port"}
    with pytest.raises(StackError) as info:
        write_catalog_config(tmp_path / "catalog.toml", server, warehouse_settings(STORE))
    assert len(str(info.value).splitlines()) == 1 and STORE.secret_access_key not in str(info.value)
    with pytest.raises(StackError, match="unsupported value type"):
        write_catalog_config(tmp_path / "other.toml", {**server, "port": [1]}, warehouse_settings(STORE))


def test_bootstrap_creates_the_demo_principals_and_grants(tmp_path: Path) -> None:
    path = write_stack_catalog_config(tmp_path, 8181, STORE, credential_lifetime=60)
    credentials = bootstrap_principals(path)
    assert set(credentials) == {"admin", "analyst", "writer"}
    with open_auth_store(load_config(path)) as store:
        principals = {p.name: p for p in store.list_principals()}
        assert principals["admin"].is_admin and not principals["analyst"].is_admin
        assert principals["analyst"].roles == {"analyst_role"} and principals["writer"].roles == {"writer_role"}
        analyst = {(g.privilege.value, g.warehouse, g.namespace, g.table) for g in store.list_grants("analyst_role")}
        writer = {g.privilege.value for g in store.list_grants("writer_role")}
        # the secrets work: each principal gets a token with its own client id and secret
        for creds in credentials.values():
            assert principals[creds.name].client_id == creds.client_id
            assert store.issue_token(creds.client_id, creds.client_secret, "PRINCIPAL_ROLE:ALL")[0]
            assert creds.client_secret not in repr(creds)
    assert analyst == {(p, WAREHOUSE, None, None) for p in ANALYST_PRIVILEGES}
    assert writer == set(WRITER_PRIVILEGES)


def test_bootstrap_twice_is_a_one_line_error(tmp_path: Path) -> None:
    path = write_stack_catalog_config(tmp_path, 8181, STORE, credential_lifetime=60)
    first = bootstrap_principals(path)
    with pytest.raises(StackError) as info:
        bootstrap_principals(path)
    message = str(info.value)
    assert message.startswith("creating the demo principals failed: ") and len(message.splitlines()) == 1
    assert not any(c.client_secret in message for c in first.values())


def test_create_principal_with_a_role_and_scoped_grants(tmp_path: Path) -> None:
    path = write_stack_catalog_config(tmp_path, 8181, STORE, credential_lifetime=60)
    grants = [Grant("TABLE_READ_DATA", ("sales", "eu")), Grant("TABLE_WRITE_DATA", ("sales",), "t")]
    grants.append(Grant("TABLE_LIST"))
    creds = create_principal(path, PrincipalSpec("analyst", role="analyst_role", grants=grants))
    reader = create_principal(path, PrincipalSpec("engine", reader=True))
    with open_auth_store(load_config(path)) as store:
        principals = {p.name: p for p in store.list_principals()}
        listed = {(g.privilege.value, g.warehouse, g.namespace, g.table) for g in store.list_grants("analyst_role")}
        assert store.issue_token(creds.client_id, creds.client_secret, "PRINCIPAL_ROLE:ALL")[0]
    assert principals["analyst"].roles == {"analyst_role"} and not principals["analyst"].is_reader
    assert principals["engine"].is_reader and principals["engine"].roles == set()
    assert listed == {
        ("TABLE_READ_DATA", WAREHOUSE, ("sales", "eu"), None),
        ("TABLE_WRITE_DATA", WAREHOUSE, ("sales",), "t"),
        ("TABLE_LIST", WAREHOUSE, None, None),
    }
    assert creds.client_secret not in repr(creds) and reader.client_secret not in repr(reader)


def test_create_principal_failures_are_one_line_errors(tmp_path: Path) -> None:
    path = write_stack_catalog_config(tmp_path, 8181, STORE, credential_lifetime=60)
    with pytest.raises(StackError, match="has no warehouse 'nope'"):
        create_principal(path, PrincipalSpec("bob", role="r", grants=[Grant("TABLE_READ_DATA")], warehouse="nope"))
    first = create_principal(path, PrincipalSpec("bob"))
    with pytest.raises(StackError) as info:
        create_principal(path, PrincipalSpec("bob"))
    message = str(info.value)
    assert message.startswith("creating principal 'bob' failed: ") and len(message.splitlines()) == 1
    assert first.client_secret not in message
