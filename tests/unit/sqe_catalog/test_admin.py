"""``sqe-catalog admin``: through ``sqe_catalog.cli.main`` in-process, once through the console script."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from sqe_catalog.auth import AuthStore, Privilege, create_engine_for
from sqe_catalog.cli import main
from sqe_catalog.errors import NotAuthorizedError


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(
        f"""
[server]
database = "sqlite:///{tmp_path / "catalog.db"}"
secret_hash_scrypt_n = 1024

[[warehouses]]
name = "demo"
location = "file://{tmp_path / "warehouse"}"
"""
    )
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[AuthStore]:
    """The server's view of the same database."""
    engine = create_engine_for(f"sqlite:///{tmp_path / 'catalog.db'}")
    yield AuthStore(engine, b"s" * 32, 60)
    engine.dispose()


class Admin:
    def __init__(self, config_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self._config_path = config_path
        self._capsys = capsys

    def run(self, *args: str) -> tuple[int, str, str]:
        code = main(["admin", "--config", str(self._config_path), *args])
        out, err = self._capsys.readouterr()
        return code, out, err

    def ok(self, *args: str) -> Any:
        code, out, err = self.run(*args)
        assert (code, err) == (0, ""), err
        return json.loads(out) if out else None

    def fails(self, *args: str) -> str:
        code, out, err = self.run(*args)
        assert code != 0 and out == ""
        assert err.endswith("\n") and err.count("\n") == 1, err
        return err


@pytest.fixture
def admin(config_path: Path, capsys: pytest.CaptureFixture[str]) -> Admin:
    return Admin(config_path, capsys)


def test_create_principal_prints_working_credentials(admin: Admin, store: AuthStore) -> None:
    created = admin.ok("create-principal", "analyst")
    assert set(created) == {"name", "client_id", "client_secret"} and created["name"] == "analyst"
    token, _ = store.issue_token(created["client_id"], created["client_secret"], "PRINCIPAL_ROLE:ALL")
    principal = store.principal_for_token(token)
    assert (principal.name, principal.is_admin) == ("analyst", False)


def _stored_hash_costs(tmp_path: Path) -> list[str]:
    engine = create_engine_for(f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        with engine.connect() as conn:
            hashes = conn.execute(sqlalchemy.text("SELECT secret_hash FROM sqe_principals ORDER BY name")).scalars()
            return [stored.split("$")[1] for stored in hashes]
    finally:
        engine.dispose()


def test_secrets_are_hashed_at_the_configured_scrypt_cost_and_still_verify(
    admin: Admin, store: AuthStore, config_path: Path, tmp_path: Path
) -> None:
    old = admin.ok("create-principal", "before")
    text = config_path.read_text().replace("secret_hash_scrypt_n = 1024", "secret_hash_scrypt_n = 2048", 1)
    config_path.write_text(text)
    new = admin.ok("create-principal", "dearer")
    assert _stored_hash_costs(tmp_path) == ["1024", "2048"]  # each hash carries its own cost
    rotated = admin.ok("rotate-secret", "before")
    assert _stored_hash_costs(tmp_path) == ["2048", "2048"]
    assert new["client_secret"] not in text and rotated["client_secret"] != old["client_secret"]
    for created in (new, rotated):  # the server's store, at another cost, verifies each by its own
        token, _ = store.issue_token(created["client_id"], created["client_secret"], "PRINCIPAL_ROLE:ALL")
        assert store.principal_for_token(token).name == created["name"]


def test_admin_flag_and_list_principals_without_secrets(admin: Admin) -> None:
    root = admin.ok("create-principal", "root", "--admin")
    analyst = admin.ok("create-principal", "analyst")
    engine = admin.ok("create-principal", "engine", "--reader")
    code, out, _ = admin.run("list-principals")
    assert code == 0
    assert all(p["client_secret"] not in out for p in (root, analyst, engine))
    listed = json.loads(out)
    assert listed == [
        {
            "name": "analyst",
            "client_id": analyst["client_id"],
            "is_admin": False,
            "reader": False,
            "roles": [],
            "groups": [],
        },
        {
            "name": "engine",
            "client_id": engine["client_id"],
            "is_admin": False,
            "reader": True,
            "roles": [],
            "groups": [],
        },
        {"name": "root", "client_id": root["client_id"], "is_admin": True, "reader": False, "roles": [], "groups": []},
    ]


def test_rotate_secret_prints_new_secret_and_retires_the_old(admin: Admin, store: AuthStore) -> None:
    created = admin.ok("create-principal", "analyst")
    rotated = admin.ok("rotate-secret", "analyst")
    assert rotated["client_id"] == created["client_id"]
    assert rotated["client_secret"] != created["client_secret"]
    with pytest.raises(NotAuthorizedError):
        store.issue_token(created["client_id"], created["client_secret"], "PRINCIPAL_ROLE:ALL")
    store.issue_token(rotated["client_id"], rotated["client_secret"], "PRINCIPAL_ROLE:ALL")


WRITE_ON_T = ("TABLE_WRITE_DATA", "--warehouse", "demo", "--namespace", "sales", "--table", "t")


def test_roles_groups_and_grants_end_to_end(admin: Admin, store: AuthStore) -> None:
    creds = admin.ok("create-principal", "analyst")
    for command in (
        ("create-role", "readers"),
        ("create-role", "writers"),
        ("assign-role", "analyst", "readers"),
        ("create-group", "sales-team"),
        ("add-to-group", "analyst", "sales-team"),
        ("assign-group-role", "sales-team", "writers"),
        ("grant", "readers", "TABLE_READ_DATA", "--warehouse", "demo", "--namespace", "sales.eu"),
        ("grant", "writers", *WRITE_ON_T),
    ):
        assert admin.ok(*command) is None  # mutations print nothing
    assert admin.ok("list-grants", "--role", "readers") == [
        {
            "role": "readers",
            "privilege": "TABLE_READ_DATA",
            "warehouse": "demo",
            "namespace": ["sales", "eu"],
            "table": None,
        }
    ]
    assert len(admin.ok("list-grants")) == 2
    assert admin.ok("list-principals")[0]["roles"] == ["readers", "writers"]
    token, _ = store.issue_token(creds["client_id"], creds["client_secret"], "PRINCIPAL_ROLE:ALL")
    p = store.principal_for_token(token)
    assert store.has_privilege(p, Privilege.TABLE_READ_DATA, "demo", ("sales", "eu", "x"), "orders")
    assert store.has_privilege(p, Privilege.TABLE_WRITE_DATA, "demo", ("sales",), "t")
    admin.ok("revoke", "writers", *WRITE_ON_T)
    admin.ok("unassign-role", "analyst", "readers")
    p = store.principal_for_token(token)
    assert not store.has_privilege(p, Privilege.TABLE_WRITE_DATA, "demo", ("sales",), "t")
    assert not store.has_privilege(p, Privilege.TABLE_READ_DATA, "demo", ("sales", "eu"), "orders")
    admin.ok("delete-principal", "analyst")
    assert admin.ok("list-principals") == []


def test_a_group_role_is_taken_back_and_a_group_deleted(admin: Admin, store: AuthStore) -> None:
    creds = admin.ok("create-principal", "analyst")
    for command in (
        ("create-role", "writers"),
        ("grant", "writers", *WRITE_ON_T),
        ("create-group", "sales-team"),
        ("add-to-group", "analyst", "sales-team"),
        ("assign-group-role", "sales-team", "writers"),
    ):
        admin.ok(*command)
    token, _ = store.issue_token(creds["client_id"], creds["client_secret"], "PRINCIPAL_ROLE:ALL")
    assert store.has_privilege(store.principal_for_token(token), Privilege.TABLE_WRITE_DATA, "demo", ("sales",), "t")
    assert admin.ok("unassign-group-role", "sales-team", "writers") is None
    assert not store.has_privilege(
        store.principal_for_token(token), Privilege.TABLE_WRITE_DATA, "demo", ("sales",), "t"
    )
    admin.ok("assign-group-role", "sales-team", "writers")
    assert admin.ok("delete-group", "sales-team") is None
    assert admin.ok("list-principals")[0]["groups"] == []
    assert not store.has_privilege(
        store.principal_for_token(token), Privilege.TABLE_WRITE_DATA, "demo", ("sales",), "t"
    )


def test_errors_are_one_line_on_stderr(admin: Admin) -> None:
    admin.ok("create-principal", "analyst")
    admin.ok("create-role", "readers")
    assert "principal analyst already exists" in admin.fails("create-principal", "analyst")
    assert "principal ghost does not exist" in admin.fails("assign-role", "ghost", "readers")
    assert "principal role ghost does not exist" in admin.fails("assign-role", "analyst", "ghost")
    assert "unknown warehouse prod; configured warehouses: demo" in admin.fails(
        "grant", "readers", "TABLE_READ_DATA", "--warehouse", "prod"
    )
    assert "unknown privilege 'READ'" in admin.fails("grant", "readers", "READ", "--warehouse", "demo")
    assert "invalid namespace 'a..b'" in admin.fails(
        "grant", "readers", "TABLE_READ_DATA", "--warehouse", "demo", "--namespace", "a..b"
    )
    assert "has no grant" in admin.fails("revoke", "readers", "TABLE_READ_DATA", "--warehouse", "demo")
    # revoke builds its Grant from the command line: the same typed errors as grant
    assert "unknown privilege 'READ'" in admin.fails("revoke", "readers", "READ", "--warehouse", "demo")
    assert "invalid namespace 'a..b'" in admin.fails(
        "revoke", "readers", "TABLE_READ_DATA", "--warehouse", "demo", "--namespace", "a..b"
    )
    assert "principal role ghost does not exist" in admin.fails(
        "revoke", "ghost", "TABLE_READ_DATA", "--warehouse", "demo"
    )
    assert "principal ghost does not exist" in admin.fails("rotate-secret", "ghost")


def test_unopenable_database_is_a_one_line_error(tmp_path: Path, admin: Admin, config_path: Path) -> None:
    config_path.write_text(f'[server]\ndatabase = "sqlite:///{tmp_path / "missing-dir" / "x.db"}"\n')
    assert "database error: unable to open database file" in admin.fails("list-principals")


def test_admin_writes_while_another_connection_reads(admin: Admin, tmp_path: Path) -> None:
    admin.ok("create-role", "readers")
    server_engine = create_engine_for(f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        with server_engine.connect() as conn:
            conn.exec_driver_sql("BEGIN")
            conn.execute(sqlalchemy.text("SELECT COUNT(*) FROM sqe_grants")).scalar_one()
            admin.ok("grant", "readers", "TABLE_READ_DATA", "--warehouse", "demo")  # WAL: readers don't block
            conn.exec_driver_sql("COMMIT")
    finally:
        server_engine.dispose()
    assert len(admin.ok("list-grants")) == 1


def test_console_script(config_path: Path) -> None:
    script = Path(sys.executable).parent / "sqe-catalog"
    result = subprocess.run(
        [str(script), "admin", "--config", str(config_path), "create-principal", "bob", "--admin"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    created = json.loads(result.stdout)
    assert created["name"] == "bob" and len(created["client_secret"]) >= 32
    assert created["client_secret"] not in result.stderr


def test_an_error_echoing_a_name_with_control_characters_is_escaped(admin: Admin) -> None:
    err = admin.fails("delete-principal", "zz\x1b[31mb")
    assert err == "sqe-catalog admin: principal zz\\x1b[31mb does not exist\n"


def test_a_config_error_is_one_escaped_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["admin", "--config", str(tmp_path / "x\x1b[2J.toml"), "list-principals"]) == 2
    assert capsys.readouterr().err == f"sqe-catalog: config file not found: {tmp_path}/x\\x1b[2J.toml\n"


def test_a_catalog_config_holding_a_secret_that_others_may_read_is_warned_about(
    admin: Admin, config_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config_path.write_text(config_path.read_text().replace("[server]\n", '[server]\ntoken_signing_key = "K"\n', 1))
    config_path.chmod(0o640)
    assert admin.ok("list-principals") == []
    assert [r.getMessage() for r in caplog.records if r.name == "sqe.config"] == [
        f"{config_path} holds server.token_signing_key but other users may read it (mode 640): chmod 600 {config_path}"
    ]
    caplog.clear()
    config_path.chmod(0o600)
    assert admin.ok("list-principals") == []
    assert not [r for r in caplog.records if r.name == "sqe.config"]
