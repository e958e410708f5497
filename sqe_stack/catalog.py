"""The stack's ``sqe-catalog``: its ``catalog.toml``, the demo principals and grants, the server process, and
one ready-to-use SQE engine config file per demo principal.

Principals, roles and grants are created through the catalog's own admin store
(``sqe_catalog.admin.open_auth_store``, the one the ``sqe-catalog admin`` commands use) and read-restrictions set
through ``sqe_catalog.admin.set_restrictions``, in this process, on the catalog's database: safe while the catalog
serves (SQLite in WAL mode with a busy timeout). ``sqe stack up`` and the test fixtures create principals with
:func:`provision_principal` / :func:`create_principal`. Secrets go only into 0600 files or the caller's hands,
never into a log, an error or a repr.
"""

from __future__ import annotations

import json
import secrets
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from sqe._text import first_line
from sqe_catalog.admin import open_auth_store
from sqe_catalog.admin import set_restrictions as catalog_set_restrictions
from sqe_catalog.auth import AuthStore
from sqe_catalog.config import CatalogServerConfig, load_config
from sqe_catalog.config import WarehouseConfig as CatalogWarehouseConfig
from sqe_catalog.errors import CatalogError, describe_database_error
from sqe_catalog.errors import ConfigError as CatalogConfigError
from sqe_catalog.restrictions import Subject, SubjectKind
from sqe_stack.provision import (
    LOOPBACK,
    Daemon,
    StackError,
    StoreHandle,
    http_status,
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
CATALOG_DB = "catalog.db"
SQLITE_PREFIX = "sqlite:///"

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
class Grant:
    """One privilege of a role in a warehouse: on all of it, on a namespace (and those under it), or on a table."""

    privilege: str
    namespace: tuple[str, ...] | None = None
    table: str | None = None


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


def server_settings(dir: Path, port: int, *, log_level: str = "info") -> dict[str, object]:
    """The ``[server]`` table: loopback on ``port``, SQLite in ``DIR/catalog.db``, a fresh token signing key."""
    return {
        "host": LOOPBACK,
        "port": port,
        "database": f"sqlite:///{dir / CATALOG_DB}",
        "token_signing_key": secrets.token_hex(32),
        "log_level": log_level,
    }


def warehouse_settings(
    store: StoreHandle,
    *,
    name: str = WAREHOUSE,
    location: str = WAREHOUSE_LOCATION,
    region: str = REGION,
    credential_lifetime: int = 3600,
) -> dict[str, object]:
    """One ``[[warehouses]]`` entry on ``store``: path-style S3, STS through the store's role, its static key."""
    return {
        "name": name,
        "location": location,
        "endpoint": store.s3_endpoint,
        "region": region,
        "path_style": True,
        "sts_endpoint": store.sts_endpoint,
        "role_arn": store.role_arn,
        "credential_lifetime_seconds": credential_lifetime,
        "access_key_id": store.access_key_id,
        "secret_access_key": store.secret_access_key,
    }


def _toml_value(key: str, value: object) -> str:
    if isinstance(value, bool | int | float | str):
        return json.dumps(value)  # JSON scalars are valid TOML scalars (strings: toml_str)
    raise StackError(f"catalog setting {key}: unsupported value type {type(value).__name__}")


def catalog_config_text(server: Mapping[str, object], warehouse: Mapping[str, object]) -> str:
    lines = ["# Written by the SQE local stack; holds secrets (mode 0600). Recreated on every start.", "[server]"]
    lines += [f"{key} = {_toml_value(key, value)}" for key, value in server.items()]
    lines += ["", "[[warehouses]]", *(f"{key} = {_toml_value(key, value)}" for key, value in warehouse.items())]
    return "\n".join(lines) + "\n"


def _create_private_sqlite(database: object) -> None:
    """Create an empty SQLite file 0600 first: it keeps the hashed client secrets private (SQLite gives its
    -wal/-shm files the database file's permissions), and an empty file is a valid new database."""
    if isinstance(database, str) and database.startswith(SQLITE_PREFIX):
        path = Path(database.removeprefix(SQLITE_PREFIX))
        if not path.exists():
            write_private(path, "")


def write_catalog_config(path: Path, server: Mapping[str, object], warehouse: Mapping[str, object]) -> Path:
    """Write a ``catalog.toml`` (0600) and check it with the catalog's own parser."""
    _create_private_sqlite(server.get("database"))
    write_private(path, catalog_config_text(server, warehouse))
    load_catalog_config(path)
    return path


def write_stack_catalog_config(dir: Path, port: int, store: StoreHandle, credential_lifetime: int) -> Path:
    """``DIR/catalog.toml`` of ``sqe stack up``: warehouse ``demo`` on the store, info-level logs."""
    warehouse = warehouse_settings(store, credential_lifetime=credential_lifetime)
    return write_catalog_config(dir / "catalog.toml", server_settings(dir, port), warehouse)


def load_catalog_config(path: Path) -> CatalogServerConfig:
    """The catalog's parsed config; an invalid file is a one-line StackError."""
    try:
        return load_config(path)
    except CatalogConfigError as exc:
        raise StackError(f"{path} is not a valid catalog config: {first_line(exc)}") from None


def _demo_warehouse(config_path: Path) -> CatalogWarehouseConfig:
    warehouse = load_catalog_config(config_path).warehouse(WAREHOUSE)
    if warehouse is None:
        raise StackError(f"{config_path} has no warehouse {WAREHOUSE!r}")
    return warehouse


def _static_key(warehouse: CatalogWarehouseConfig, config_path: Path) -> tuple[str, str]:
    pair = warehouse.static_key_pair()
    if pair is None:
        raise StackError(f"{config_path}: warehouse {WAREHOUSE!r} has no access_key_id/secret_access_key")
    return pair


def read_catalog_key(config_path: Path) -> tuple[str, str]:
    """The demo warehouse's static key (access key id, secret) from ``catalog.toml``."""
    return _static_key(_demo_warehouse(config_path), config_path)


def read_store_handle(config_path: Path, kind: str) -> StoreHandle:
    """The running store a stack's ``catalog.toml`` points at, for another catalog to use beside it (endpoints,
    role, the catalog's key). It names no daemon: stopping the store stays the business of the stack that
    started it."""
    warehouse = _demo_warehouse(config_path)
    key = _static_key(warehouse, config_path)
    return StoreHandle(kind, warehouse.endpoint, warehouse.sts_endpoint, warehouse.role_arn, *key, ())


@dataclass(frozen=True)
class PrincipalSpec:
    """A principal to create: an ``admin``, a ``reader``, and with ``role`` that role holding ``grants`` in
    ``warehouse``, assigned to it."""

    name: str
    admin: bool = False
    reader: bool = False
    role: str = ""
    grants: Sequence[Grant] = ()
    warehouse: str = WAREHOUSE


def provision_principal(store: AuthStore, spec: PrincipalSpec) -> PrincipalCredentials:
    """Create ``spec`` in ``store``; return its credentials (the secret exists nowhere else)."""
    client_id, client_secret = store.create_principal(spec.name, is_admin=spec.admin, reader=spec.reader)
    if spec.role:
        store.create_role(spec.role)
        store.assign_role(spec.name, spec.role)
        for grant in spec.grants:
            store.grant(spec.role, grant.privilege, spec.warehouse, grant.namespace, grant.table)
    return PrincipalCredentials(name=spec.name, client_id=client_id, client_secret=client_secret)


def _create_demo_principal(store: AuthStore, demo: DemoPrincipal) -> PrincipalCredentials:
    grants = [Grant(privilege) for privilege in demo.privileges]  # warehouse-wide
    return provision_principal(store, PrincipalSpec(demo.name, admin=demo.admin, role=demo.role, grants=grants))


def bootstrap_principals(config_path: Path) -> dict[str, PrincipalCredentials]:
    """Create the demo principals, their roles and warehouse-wide grants; return their credentials."""
    with principal_store(config_path, "creating the demo principals") as store:
        return {demo.name: _create_demo_principal(store, demo) for demo in DEMO_PRINCIPALS}


def create_principal(config_path: Path, spec: PrincipalSpec) -> PrincipalCredentials:
    """:func:`provision_principal` on the database of the catalog configured in ``config_path`` (which may be
    serving); grants need ``spec.warehouse`` to be one of its warehouses, as ``sqe-catalog admin grant`` does."""
    what = f"creating principal {spec.name!r}"
    if spec.grants and load_catalog_config(config_path).warehouse(spec.warehouse) is None:
        raise StackError(f"{what} failed: {config_path} has no warehouse {spec.warehouse!r}")
    with principal_store(config_path, what) as store:
        return provision_principal(store, spec)


@contextmanager
def _admin_errors(doing: str) -> Iterator[None]:
    """The catalog's admin failures as one-line :class:`StackError` s that say what was being done."""
    try:
        yield
    except (CatalogError, CatalogConfigError) as exc:
        raise StackError(f"{doing} failed: {first_line(exc)}") from None
    except SQLAlchemyError as exc:
        raise StackError(f"{doing} failed: database error: {describe_database_error(exc)}") from None


@contextmanager
def principal_store(config_path: Path, doing: str) -> Iterator[AuthStore]:
    """The store the ``sqe-catalog admin`` commands use, on the config's database, in this process.

    Its failures become one-line :class:`StackError` s that say what was being done (``doing``).
    """
    config = load_catalog_config(config_path)
    with _admin_errors(doing), open_auth_store(config) as store:
        yield store


def set_restrictions(
    config_path: Path, principal: str, namespace: tuple[str, ...], table: str, document: Mapping[str, object]
) -> None:
    """``sqe-catalog admin set-restrictions`` for ``principal`` on table ``namespace.table`` of the stack's
    warehouse, in this process: ``document`` is the read-restrictions object, checked against the table."""
    config = load_catalog_config(config_path)
    with _admin_errors(f"restricting {principal!r} on {'.'.join((*namespace, table))}"):
        subject = Subject(SubjectKind.PRINCIPAL, principal)
        catalog_set_restrictions(config, WAREHOUSE, namespace, table, subject, dict(document))


def catalog_log_path(dir: Path) -> Path:
    """Where :func:`spawn_catalog` appends the catalog's output."""
    return dir / "logs" / "catalog.log"


def spawn_catalog(dir: Path, config_path: Path, env: Mapping[str, str]) -> Daemon:
    """Start ``sqe-catalog serve`` in the background, output in :func:`catalog_log_path` (see
    :func:`wait_for_catalog`). It signs with its configured key only: ambient ``AWS_*`` variables are dropped
    (``env`` is added after that)."""
    argv = [sys.executable, "-m", "sqe_catalog.cli", "serve", "--config", str(config_path)]
    return spawn(
        "catalog",
        argv,
        catalog_log_path(dir),
        markers=("sqe_catalog.cli", "serve", str(config_path)),
        env={"PYTHONUNBUFFERED": "1", **env},
        scrub_aws_env=True,
    )


def wait_for_catalog(dir: Path, port: int, daemon: Daemon) -> str:
    """The catalog's URI once ``GET /v1/config`` answers (401 without a token, or 200)."""
    uri = f"http://{LOOPBACK}:{port}"
    wait_until(
        lambda: http_status(f"{uri}/v1/config") in (200, 401),
        "sqe-catalog",
        timeout=60,
        watch=[daemon],
        log_hint=f" (see {catalog_log_path(dir)})",
    )
    return uri


def engine_settings_text(catalog_uri: str, s3_endpoint: str, credentials: str = "") -> str:
    """``[catalog]`` (with the given credential lines, if any) and ``[storage]`` of an engine config of the stack."""
    return f"""[catalog]
uri = {toml_str(catalog_uri)}
warehouse = {toml_str(WAREHOUSE)}
{credentials}access_delegation = "vended-credentials"
require_vended_credentials = true

[storage]
endpoint = {toml_str(s3_endpoint)}
region = {toml_str(REGION)}
path_style = true
"""


def engine_config_text(creds: PrincipalCredentials, catalog_uri: str, s3_endpoint: str) -> str:
    header = f"# SQE config for principal {creds.name!r}, written by `sqe stack up` (0600: holds a secret).\n"
    credentials = (
        f"client_id = {toml_str(creds.client_id)}\n"
        f"client_secret = {toml_str(creds.client_secret)}\n"
        f"scope = {toml_str(SCOPE)}\n"
    )
    return header + engine_settings_text(catalog_uri, s3_endpoint, credentials)


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
