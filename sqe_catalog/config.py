"""Catalog server configuration (``catalog.toml``), validated strictly at start-up.

Unknown keys and wrong types are errors that name the key, so a typo never silently falls back to a default.
See ``catalog.toml.example`` for every key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from sqe_catalog.errors import ConfigError


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8181
    # SQLAlchemy URL for table state, principals and grants: SQLite by default, PostgreSQL supported.
    database: str = "sqlite:///sqe-catalog.db"
    # HMAC key for bearer tokens. Empty: a random key per process (tokens die with the process).
    token_signing_key: str = field(default="", repr=False)
    token_lifetime_seconds: int = 3600
    log_level: str = "info"
    # Seconds a pyiceberg commit may take before the server gives up on a lost race (retries are the client's).
    request_timeout_seconds: float = 30.0


@dataclass(frozen=True)
class WarehouseConfig:
    name: str
    # Root location of the warehouse, e.g. "s3://warehouse/demo". Tables default to <location>/<ns>/<table>.
    location: str
    endpoint: str = ""
    region: str = "us-east-1"
    path_style: bool = True
    sts_endpoint: str = ""
    role_arn: str = ""
    external_id: str = ""
    # Lifetime of vended credentials. Real AWS needs >= 900; Ceph/moto in tests accept a few seconds.
    credential_lifetime_seconds: int = 3600
    # The catalog's own long-lived key: used for metadata I/O and to call sts:AssumeRole.
    access_key_id: str = ""
    secret_access_key: str = field(default="", repr=False)
    # false: ignore X-Iceberg-Access-Delegation and vend nothing (like a catalog without vending support).
    vend_credentials: bool = True
    # Reuse a vended credential per (principal, table, mode) while more than half its lifetime remains.
    credential_cache: bool = True
    # No STS: hand the static key above to clients instead (no expiry, no per-table scoping).
    sts_unavailable: bool = False

    @property
    def bucket(self) -> str:
        return self.location.split("://", 1)[1].split("/", 1)[0]


@dataclass(frozen=True)
class CatalogServerConfig:
    server: ServerConfig
    warehouses: tuple[WarehouseConfig, ...]

    def warehouse(self, name: str) -> WarehouseConfig | None:
        return next((w for w in self.warehouses if w.name == name), None)


_T = TypeVar("_T")
_PY_TYPES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def _build(cls: type[_T], raw: dict[str, Any], where: str) -> _T:
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    for key in raw:
        if key not in known:
            raise ConfigError(f"unknown key {where}.{key}")
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        if name not in raw:
            continue
        value = raw[name]
        expected = _PY_TYPES[str(f.type)]
        if isinstance(value, bool) and expected is not bool:
            raise ConfigError(f"{where}.{name} must be {f.type}, got a boolean")
        if not isinstance(value, expected):
            raise ConfigError(f"{where}.{name} must be {f.type}, got {type(value).__name__}")
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        missing = str(exc).split("argument", 1)[-1].strip(": ")
        raise ConfigError(f"{where}: missing required key {missing}") from None


def parse_config(raw: dict[str, Any]) -> CatalogServerConfig:
    for key in raw:
        if key not in ("server", "warehouses"):
            raise ConfigError(f"unknown section [{key}]")
    server_raw = raw.get("server", {})
    if not isinstance(server_raw, dict):
        raise ConfigError("[server] must be a table")
    server = _build(ServerConfig, server_raw, "server")
    if server.token_lifetime_seconds <= 0:
        raise ConfigError("server.token_lifetime_seconds must be positive")
    warehouses_raw = raw.get("warehouses", [])
    if not isinstance(warehouses_raw, list) or not all(isinstance(w, dict) for w in warehouses_raw):
        raise ConfigError("[[warehouses]] must be an array of tables")
    warehouses = tuple(_build(WarehouseConfig, w, f"warehouses[{i}]") for i, w in enumerate(warehouses_raw))
    names = [w.name for w in warehouses]
    if len(set(names)) != len(names):
        raise ConfigError("warehouses: duplicate warehouse name")
    for i, w in enumerate(warehouses):
        if not w.location.startswith(("s3://", "file://")):
            raise ConfigError(f"warehouses[{i}].location must start with s3:// or file://")
        if w.credential_lifetime_seconds < 1:
            raise ConfigError(f"warehouses[{i}].credential_lifetime_seconds must be >= 1")
        if w.location.startswith("s3://") and not w.sts_unavailable and not w.role_arn:
            raise ConfigError(f"warehouses[{i}].role_arn is required unless sts_unavailable = true")
    return CatalogServerConfig(server=server, warehouses=warehouses)


def load_config(path: str | Path) -> CatalogServerConfig:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return parse_config(raw)
