"""The stack's ``sqe-catalog``: its ``catalog.toml``, the demo principals and grants, the server process, and
one ready-to-use SQE engine config file per demo principal.

Principals are created through the catalog's own admin CLI (``sqe_catalog.cli.main(["admin", ...])``, all
commands in one child interpreter), so the stack exercises the same path an operator uses. Secrets go only
into 0600 files; the admin CLI's stdout (which carries a fresh client secret) is parsed, never logged or quoted
in errors.
"""

from __future__ import annotations

import json
import secrets
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqe.stack.provision import (
    LOOPBACK,
    Daemon,
    StackError,
    StoreHandle,
    http_status,
    run_tool,
    spawn,
    toml_str,
    wait_until,
    write_private,
)

WAREHOUSE = "demo"
BUCKET = "warehouse"
WAREHOUSE_LOCATION = f"s3://{BUCKET}/{WAREHOUSE}"
REGION = "us-east-1"
SCOPE = "PRINCIPAL_ROLE:ALL"

ANALYST_PRIVILEGES = ("TABLE_READ_DATA", "NAMESPACE_LIST", "TABLE_LIST", "NAMESPACE_READ_PROPERTIES")
WRITER_PRIVILEGES = (
    "TABLE_WRITE_DATA",
    "TABLE_CREATE",
    "NAMESPACE_CREATE",
    "NAMESPACE_LIST",
    "TABLE_LIST",
    "NAMESPACE_READ_PROPERTIES",
)


@dataclass(frozen=True)
class DemoPrincipal:
    name: str
    admin: bool = False
    role: str = ""
    privileges: tuple[str, ...] = ()


DEMO_PRINCIPALS = (
    DemoPrincipal("admin", admin=True),
    DemoPrincipal("analyst", role="analyst_role", privileges=ANALYST_PRIVILEGES),
    DemoPrincipal("writer", role="writer_role", privileges=WRITER_PRIVILEGES),
)


@dataclass(frozen=True)
class PrincipalCredentials:
    """OAuth client credentials of one principal; the secret never shows in a repr."""

    name: str
    client_id: str
    client_secret: str = field(repr=False)

    @property
    def credential(self) -> str:
        """``client_id:client_secret``, the form pyiceberg's RestCatalog takes as ``credential``."""
        return f"{self.client_id}:{self.client_secret}"


def catalog_config_text(dir: Path, port: int, store: StoreHandle, credential_lifetime: int, signing_key: str) -> str:
    database = f"sqlite:///{dir / 'catalog.db'}"
    return f"""# Written by `sqe stack up`; holds secrets (mode 0600). Recreated on every `up`.
[server]
host = {toml_str(LOOPBACK)}
port = {port}
database = {toml_str(database)}
token_signing_key = {toml_str(signing_key)}
log_level = "info"

[[warehouses]]
name = {toml_str(WAREHOUSE)}
location = {toml_str(WAREHOUSE_LOCATION)}
endpoint = {toml_str(store.s3_endpoint)}
region = {toml_str(REGION)}
path_style = true
sts_endpoint = {toml_str(store.sts_endpoint)}
role_arn = {toml_str(store.role_arn)}
credential_lifetime_seconds = {credential_lifetime}
access_key_id = {toml_str(store.access_key_id)}
secret_access_key = {toml_str(store.secret_access_key)}
"""


def write_catalog_config(dir: Path, port: int, store: StoreHandle, credential_lifetime: int) -> Path:
    """Write ``DIR/catalog.toml`` (0600) and check it with the catalog's own parser."""
    from sqe_catalog.config import load_config
    from sqe_catalog.errors import ConfigError as CatalogConfigError

    path = dir / "catalog.toml"
    # An empty file is a valid new SQLite database; creating it 0600 keeps the hashed client secrets private
    # (SQLite gives its -wal/-shm files the database file's permissions).
    write_private(dir / "catalog.db", "")
    signing_key = secrets.token_hex(32)
    write_private(path, catalog_config_text(dir, port, store, credential_lifetime, signing_key))
    try:
        load_config(path)
    except CatalogConfigError as exc:
        raise StackError(f"generated {path} is invalid: {exc}") from None
    return path


def read_catalog_key(config_path: Path) -> tuple[str, str]:
    """The demo warehouse's static key (access key id, secret) from ``catalog.toml``."""
    from sqe_catalog.config import load_config

    warehouse = load_config(config_path).warehouse(WAREHOUSE)
    if warehouse is None:
        raise StackError(f"{config_path} has no warehouse {WAREHOUSE!r}")
    pair = warehouse.static_key_pair()
    if pair is None:
        raise StackError(f"{config_path}: warehouse {WAREHOUSE!r} has no access_key_id/secret_access_key")
    return pair


# Runs many ``sqe-catalog admin`` commands through the CLI's own ``main`` in ONE interpreter: a separate
# ``python -m sqe_catalog.cli admin`` per command costs ~1.4 s of imports each (17 commands -> ~24 s).
# Input: JSON list of argv lists on stdin. Output: JSON list of each command's stdout. Stops at the first
# failure with that command's exit status (its one-line error is already on stderr).
_ADMIN_BATCH = """
import contextlib, io, json, sys
from sqe_catalog.cli import main
outputs = []
for argv in json.load(sys.stdin):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    if code != 0:
        sys.exit(code)
    outputs.append(buf.getvalue())
json.dump(outputs, sys.stdout)
"""


def _admin_commands() -> list[list[str]]:
    commands: list[list[str]] = []
    for demo in DEMO_PRINCIPALS:
        commands.append(["create-principal", demo.name, *(["--admin"] if demo.admin else [])])
        if demo.role:
            commands.append(["create-role", demo.role])
            commands += [["grant", demo.role, p, "--warehouse", WAREHOUSE] for p in demo.privileges]
            commands.append(["assign-role", demo.name, demo.role])
    return commands


def run_admin_batch(config_path: Path, commands: Sequence[Sequence[str]]) -> list[str]:
    """Run ``sqe-catalog admin --config CONFIG <command>`` for each command; return each one's stdout."""
    argvs = [["admin", "--config", str(config_path), *command] for command in commands]
    out = run_tool(
        [sys.executable, "-c", _ADMIN_BATCH],
        "sqe-catalog admin",
        timeout=120,
        stdin=json.dumps(argvs).encode(),
    )
    try:
        outputs = json.loads(out)
    except ValueError:
        raise StackError("sqe-catalog admin: unexpected output") from None
    if not isinstance(outputs, list) or len(outputs) != len(argvs):
        raise StackError("sqe-catalog admin: unexpected output")
    return [str(o) for o in outputs]


def _parse_principal(name: str, output: str) -> PrincipalCredentials:
    try:
        doc = json.loads(output)
        return PrincipalCredentials(name=name, client_id=str(doc["client_id"]), client_secret=str(doc["client_secret"]))
    except (ValueError, KeyError, TypeError):
        raise StackError(f"sqe-catalog admin create-principal {name}: unexpected output") from None


def bootstrap_principals(config_path: Path) -> dict[str, PrincipalCredentials]:
    """Create the demo principals, their roles and warehouse-wide grants; return their credentials."""
    commands = _admin_commands()
    outputs = run_admin_batch(config_path, commands)
    return {
        command[1]: _parse_principal(command[1], output)
        for command, output in zip(commands, outputs, strict=True)
        if command[0] == "create-principal"
    }


def spawn_catalog(dir: Path, config_path: Path, env: Mapping[str, str]) -> Daemon:
    """Start ``sqe-catalog serve`` in the background (see :func:`wait_for_catalog`)."""
    argv = [sys.executable, "-m", "sqe_catalog.cli", "serve", "--config", str(config_path)]
    return spawn(
        "catalog",
        argv,
        dir / "logs" / "catalog.log",
        markers=("sqe_catalog.cli", "serve", str(config_path)),
        env={"PYTHONUNBUFFERED": "1", **env},
    )


def wait_for_catalog(dir: Path, port: int, daemon: Daemon) -> str:
    """The catalog's URI once ``GET /v1/config`` answers (401 without a token, or 200)."""
    uri = f"http://{LOOPBACK}:{port}"
    wait_until(
        lambda: http_status(f"{uri}/v1/config") in (200, 401),
        "sqe-catalog",
        timeout=60,
        watch=[daemon],
        log_hint=f" (see {dir / 'logs' / 'catalog.log'})",
    )
    return uri


def engine_config_text(creds: PrincipalCredentials, catalog_uri: str, s3_endpoint: str) -> str:
    return f"""# SQE config for principal {creds.name!r}, written by `sqe stack up` (0600: holds a secret).
[catalog]
uri = {toml_str(catalog_uri)}
warehouse = {toml_str(WAREHOUSE)}
client_id = {toml_str(creds.client_id)}
client_secret = {toml_str(creds.client_secret)}
scope = {toml_str(SCOPE)}
access_delegation = "vended-credentials"
require_vended_credentials = true

[storage]
endpoint = {toml_str(s3_endpoint)}
region = {toml_str(REGION)}
path_style = true
"""


def write_engine_configs(
    dir: Path, principals: Sequence[PrincipalCredentials], catalog_uri: str, s3_endpoint: str
) -> dict[str, Path]:
    paths: dict[str, Path] = {}
    for creds in principals:
        path = dir / f"{creds.name}.toml"
        write_private(path, engine_config_text(creds, catalog_uri, s3_endpoint))
        paths[creds.name] = path
    return paths


def read_engine_credentials(path: Path, name: str) -> PrincipalCredentials:
    """A principal's client id and secret from its engine config file."""
    try:
        with open(path, "rb") as fh:
            catalog = tomllib.load(fh)["catalog"]
        return PrincipalCredentials(
            name=name, client_id=str(catalog["client_id"]), client_secret=str(catalog["client_secret"])
        )
    except FileNotFoundError:
        raise StackError(f"principal config not found: {path}") from None
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        raise StackError(f"{path}: not an SQE config with [catalog] client_id/client_secret") from None
