"""Catalog server configuration (``catalog.toml``), validated strictly at start-up.

The same loader as the engine's (``sqe._config_loader``): pydantic models that are strict, frozen and forbid
unknown keys, so a typo never silently falls back to a default, and every error is one line naming the key
(``warehouses[0].role_arn: ...``). Secrets are ``SecretStr``; the plain values come only from
``ServerConfig.signing_key_bytes()`` and ``WarehouseConfig.static_key_pair()``. The config objects refuse to
be pickled. See ``catalog.toml.example`` for every key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr

from sqe._config_loader import Array, ConfigSection, Origins, Unset, build, read_toml, reveal
from sqe.locations import is_object_store, normalize_location, scheme_of
from sqe.vocabulary import FILE_SCHEME
from sqe_catalog.errors import ConfigError

DEFAULT_SECRET_HASH_SCRYPT_N = 2**14
MIN_SECRET_HASH_SCRYPT_N = 2**10
MAX_SECRET_HASH_SCRYPT_N = 2**16  # 64 MiB of memory per hash (r = 8), for every token request in flight


class ServerConfig(ConfigSection):
    host: str = "127.0.0.1"
    port: int = 8181
    # SQLAlchemy URL for table state, principals and grants: SQLite by default, PostgreSQL supported. It may
    # carry a database password, so it stays out of the repr.
    database: str = Field(default="sqlite:///sqe-catalog.db", repr=False)
    # HMAC key for bearer tokens. Unset or empty: a random key per process (tokens die with the process).
    token_signing_key: Unset[SecretStr] = None
    token_lifetime_seconds: int = 3600
    # scrypt cost N of the stored client-secret hashes (a power of two, MIN_ to MAX_SECRET_HASH_SCRYPT_N). Each
    # hash keeps its own parameters, so a change applies to secrets created or reset afterwards. Client secrets
    # are random 256-bit strings; lower it only for throwaway stacks whose every test issues tokens.
    secret_hash_scrypt_n: int = DEFAULT_SECRET_HASH_SCRYPT_N
    log_level: str = "info"
    # Seconds a pyiceberg commit may take before the server gives up on a lost race (retries are the client's).
    request_timeout_seconds: float = 30.0
    # Seconds an idle client connection stays open. A client that sends on a kept connection just as the server
    # closes it sees the connection reset (a POST is not resent), so this stays well above the pauses of common
    # clients (uvicorn's own default, 5 s, is a pause a credential refresh or a user easily makes).
    keep_alive_seconds: int = 75
    # --- Polaris mode (quickstart issue): answer exactly as Apache Polaris does on the points SQE depends on.
    # true: the REST API is served under /api/catalog (Polaris's base path) instead of the root, /v1/config
    # requires ?warehouse= (no single-warehouse default) and returns the warehouse location as the
    # default-base-location default. Everything else (OAuth path and scope, prefix, storage-credential shape,
    # session policy, /credentials, ErrorModel bodies) is already Polaris's in both modes.
    polaris_compat: bool = False
    # --- end Polaris mode
    # The background cleaner (sqe_catalog.integrity.cleaner) wakes this often and runs each purge cleanup task
    # persisted at least this long ago; 0 turns it off (then only `sqe-catalog admin run-cleanup` runs them).
    cleanup_interval_seconds: float = 2.0
    # -- sql-catalog: protocol defaults, sandbox, scan planning ------------------------------------------
    # Properties every new table gets unless its create request sets them (the conventions other catalogs use).
    default_table_properties: dict[str, str] = Field(
        default_factory=lambda: {"write.parquet.compression-codec": "zstd"}
    )
    # Sandbox mode: serve requests without a bearer token as this principal. Off when empty; refused (with a
    # warning) unless ``host`` is a loopback address.
    anonymous_principal: str = ""
    # Server-side scan planning (POST .../plan): plans are kept this long for GET/DELETE .../plan/{id}.
    scan_planning: bool = True
    plan_lifetime_seconds: int = 600
    # File tasks one caller's stored plans hold in all; a new plan drops the caller's oldest past it (64 plans of a
    # table with 100,000 files would otherwise keep 6.4 million tasks, about 3 KiB each: 20 GiB for one caller).
    max_plan_tasks_per_caller: int = 100_000
    # -- end sql-catalog ---------------------------------------------------------------------------------
    # Tag-based row-filter and column-mask policies (sqe_catalog.policies): off by default, as the design says.
    read_restriction_policies: bool = False

    def signing_key_bytes(self) -> bytes | None:
        """The configured token signing key, for HMAC only; None when each process should pick a random one."""
        key = reveal(self.token_signing_key)
        return key.encode("utf-8") if key else None


class WarehouseConfig(ConfigSection):
    name: str
    # Root location of the warehouse, e.g. "s3://warehouse/demo". Tables default to <location>/<ns>/<table>.
    # Disjoint from every other warehouse's (not equal, not inside, not around it).
    location: str
    endpoint: str = ""
    region: str = "us-east-1"
    path_style: bool = True
    sts_endpoint: str = ""
    role_arn: str = ""
    external_id: str = ""
    # Lifetime of vended credentials. Real AWS needs >= 900; Ceph/moto in tests accept a few seconds.
    credential_lifetime_seconds: int = 3600
    # The catalog's own long-lived key: used for metadata I/O and to call sts:AssumeRole. Set both or neither.
    access_key_id: str = ""
    secret_access_key: Unset[SecretStr] = None
    # false: ignore X-Iceberg-Access-Delegation and vend nothing (like a catalog without vending support).
    vend_credentials: bool = True
    # Reuse a vended credential per (principal, table, mode) while more than half its lifetime remains.
    credential_cache: bool = True
    # Parsed metadata files kept per process (protected tables' only after their digest check passed, used while a
    # HEAD shows the stored file unchanged); an unchanged table's load does not read the file. 0: read every load.
    metadata_cache_entries: int = 512
    # 0: every load of a protected table confirms its cached revision's file unchanged in storage (one HEAD), so a
    # rewrite is refused by the next load. N > 0: no HEAD within N seconds of the last confirmation (loads then
    # touch no storage; a rewrite is refused at most N seconds later, and never served).
    metadata_recheck_seconds: float = 0.0
    # No STS: hand the static key above to clients instead (no expiry, no per-table scoping).
    sts_unavailable: bool = False

    @property
    def bucket(self) -> str:
        return self.location.split("://", 1)[1].split("/", 1)[0]

    def static_key_pair(self) -> tuple[str, str] | None:
        """The catalog's own key pair, for signing S3/STS requests only; None to use the AWS SDK chain."""
        secret = reveal(self.secret_access_key)
        return (self.access_key_id, secret) if self.access_key_id and secret else None


class CatalogServerConfig(ConfigSection):
    server: ServerConfig = Field(default_factory=ServerConfig)
    warehouses: Array[WarehouseConfig] = ()

    def warehouse(self, name: str) -> WarehouseConfig | None:
        return next((w for w in self.warehouses if w.name == name), None)


def _is_warehouse_root(location: str) -> bool:
    """An object-store or ``file://`` URI, spelled canonically (``s3://``, not ``S3://`` or Hadoop's ``s3a://``): the
    catalog compares the scheme of each table location with the root's as written."""
    canonical = normalize_location(location) == location
    return canonical and (is_object_store(location) or scheme_of(location) == FILE_SCHEME)


def _validate_warehouse(w: WarehouseConfig, where: str, origins: Origins) -> None:
    if not _is_warehouse_root(w.location):
        origins.fail(f"{where}.location", "must start with s3:// or file://")
    if w.credential_lifetime_seconds < 1:
        origins.fail(f"{where}.credential_lifetime_seconds", "must be >= 1")
    if is_object_store(w.location) and not w.sts_unavailable and not w.role_arn:
        origins.fail(f"{where}.role_arn", "required unless sts_unavailable = true")
    if w.metadata_cache_entries < 0:
        origins.fail(f"{where}.metadata_cache_entries", "must be >= 0 (0 turns the metadata cache off)")
    if w.metadata_recheck_seconds < 0:
        origins.fail(f"{where}.metadata_recheck_seconds", "must be >= 0 (0 checks storage on every load)")
    if w.access_key_id and not w.secret_access_key:
        origins.fail(f"{where}.secret_access_key", f"required when {where}.access_key_id is set")
    if w.secret_access_key and not w.access_key_id:
        origins.fail(f"{where}.access_key_id", f"required when {where}.secret_access_key is set")


def overlapping_warehouses(warehouses: Sequence[WarehouseConfig]) -> tuple[int, int] | None:
    """The indexes (earlier, later) of the first two warehouses whose roots are equal or nested, or None.

    Roots must be disjoint: a table's location is checked against the tables of its own warehouse only, so a
    root inside another would let a table claim (and be vended credentials for) another warehouse's files."""
    roots = [w.location.rstrip("/") for w in warehouses]
    for j, later in enumerate(roots):
        for i, earlier in enumerate(roots[:j]):
            if earlier == later or later.startswith(earlier + "/") or earlier.startswith(later + "/"):
                return i, j
    return None


def overlap_message(warehouses: Sequence[WarehouseConfig], pair: tuple[int, int]) -> str:
    earlier, later = warehouses[pair[0]], warehouses[pair[1]]
    return (
        f"warehouse {later.name!r} ({later.location}) overlaps warehouse {earlier.name!r} ({earlier.location}); "
        "warehouse locations must be disjoint"
    )


def _validate(config: CatalogServerConfig, origins: Origins) -> None:
    if not 0 <= config.server.port <= 65535:  # 0: any free port
        origins.fail("server.port", "must be from 0 to 65535")
    if config.server.token_lifetime_seconds <= 0:
        origins.fail("server.token_lifetime_seconds", "must be positive")
    if config.server.cleanup_interval_seconds < 0:
        origins.fail("server.cleanup_interval_seconds", "must be >= 0 (0 turns the background cleaner off)")
    if not 0 < config.server.keep_alive_seconds <= 3600:
        origins.fail("server.keep_alive_seconds", "must be more than 0 and at most 3600")
    if config.server.plan_lifetime_seconds <= 0:
        origins.fail("server.plan_lifetime_seconds", "must be positive")
    if config.server.max_plan_tasks_per_caller <= 0:
        origins.fail("server.max_plan_tasks_per_caller", "must be positive")
    cost = config.server.secret_hash_scrypt_n
    if not MIN_SECRET_HASH_SCRYPT_N <= cost <= MAX_SECRET_HASH_SCRYPT_N or cost & (cost - 1):
        allowed = f"a power of two from {MIN_SECRET_HASH_SCRYPT_N} to {MAX_SECRET_HASH_SCRYPT_N}"
        origins.fail("server.secret_hash_scrypt_n", f"must be {allowed}")
    seen: set[str] = set()
    for i, w in enumerate(config.warehouses):
        if w.name in seen:
            origins.fail(f"warehouses[{i}].name", "duplicate warehouse name")
        seen.add(w.name)
        _validate_warehouse(w, f"warehouses[{i}]", origins)
    if (pair := overlapping_warehouses(config.warehouses)) is not None:
        origins.fail(f"warehouses[{pair[1]}].location", overlap_message(config.warehouses, pair))


def parse_config(raw: Mapping[str, Any]) -> CatalogServerConfig:
    """Validates an already-parsed ``catalog.toml`` document."""
    origins = Origins(ConfigError)
    config = build(CatalogServerConfig, raw, origins)
    _validate(config, origins)
    return config


def load_config(path: str | Path) -> CatalogServerConfig:
    return parse_config(read_toml(path, ConfigError, CatalogServerConfig))
