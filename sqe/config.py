"""SQE's configuration (``config.toml``), validated strictly at start-up.

Sources, lowest precedence first: the TOML file, ``SQE_<SECTION>__<KEY>`` environment variables, then
``overrides`` given to :func:`load_config`. Unknown keys and wrong types are :class:`ConfigError` naming the
full key (and the variable or override that set it), so a typo never silently falls back to a default.
The models are pydantic (strict, frozen, unknown keys forbidden; see ``sqe._config_loader``). Secrets are
``SecretStr``: reprs show ``**********``, and the plain value comes only from the accessors used for signing
and authentication (``static_key_pair()``, ``CatalogConnection.client_secret_value()``, ...). The config
objects refuse to be pickled. ``config.toml.example`` documents every key.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr

from sqe._config_loader import (
    Array,
    ConfigSection,
    Origins,
    Unset,
    apply_env,
    apply_overrides,
    build,
    read_toml,
    reveal,
    short,
)
from sqe._net import address_host, is_loopback
from sqe.errors import ConfigError
from sqe.locations import is_object_store
from sqe.vocabulary import READ_RESTRICTIONS_V1, VENDED_CREDENTIALS

AccessDelegation = Literal["none", "vended-credentials"]
DistributedCredentials = Literal["vended", "static", "auto"]

ENV_PREFIX = "SQE_"
# Values some users will try that SQE refuses, with the reason shown in the error.
_UNSUPPORTED_CHOICES: dict[str, dict[str, str]] = {
    "catalog.access_delegation": {"remote-signing": "SQE does not implement remote signing"},
}


class CatalogAuth(ConfigSection):
    """The catalog credentials one principal uses; ``[catalog]``, a sibling warehouse and a connection hold them."""

    client_id: Unset[str] = None
    client_secret: Unset[SecretStr] = None
    token: Unset[SecretStr] = None
    # The engine's trusted-reader identity: when set, every catalog call uses a token delegated by the end
    # user (subject) to this reader (actor), obtained by OAuth token exchange (RFC 8693).
    reader_client_id: Unset[str] = None
    reader_client_secret: Unset[SecretStr] = None

    def auth_settings(self) -> dict[str, Any]:
        """These credentials as keyword arguments, to hand on as one unit (never mixed with another's)."""
        return {name: getattr(self, name) for name in CatalogAuth.model_fields}

    @property
    def sets_auth(self) -> bool:
        """True when any credential setting is given."""
        return any(value is not None for value in self.auth_settings().values())

    def client_secret_value(self) -> str | None:
        """The OAuth client secret, for the token request only."""
        return reveal(self.client_secret)

    def reader_client_secret_value(self) -> str | None:
        """The reader's OAuth client secret, for its token request only."""
        return reveal(self.reader_client_secret)

    def token_value(self) -> str | None:
        """The static bearer token, for the Authorization header only."""
        return reveal(self.token)


class SiblingWarehouseConfig(CatalogAuth):
    """A sibling warehouse (``[[catalog.warehouses]]``); unset connection settings come from ``[catalog]``."""

    name: str
    uri: Unset[str] = None
    # Opt-in for a sibling on another catalog (its uri) with no identity of its own to use [catalog]'s end-user
    # credentials: they are then sent to that other host. A sibling on the same catalog inherits them without it.
    inherit_credentials: bool = False


class CatalogConnection(CatalogAuth):
    """Everything needed to talk to one warehouse's catalog, inheritance from ``[catalog]`` resolved."""

    warehouse: str
    uri: str
    scope: str

    @property
    def delegates(self) -> bool:
        """True when calls go through a trusted reader acting for the end user."""
        return bool(self.reader_client_id)


class CatalogConfig(CatalogAuth):
    uri: str  # the REST catalog's base URL, e.g. http://127.0.0.1:8181/api/catalog
    warehouse: str  # asked for in GET /v1/config (Polaris: the catalog's name)
    scope: str = "PRINCIPAL_ROLE:ALL"  # the OAuth scope of the client-credentials token
    access_delegation: AccessDelegation = "none"  # "vended-credentials": ask for table-scoped keys
    # Refuse a file no vended credential covers: the static pair and the SDK's ambient chain are never used.
    require_vended_credentials: bool = False
    tvf_prefixes: Array[str] = ()  # object-store prefixes the file table functions may read with these keys
    # A vended set with no expiry is trusted this long, then the table is loaded again (see StoragePolicy).
    credential_max_age_seconds: int = 900
    request_timeout_seconds: float = 30.0
    max_retries: int = 5
    client_capabilities: str = READ_RESTRICTIONS_V1
    metadata_cache: bool = True
    # Seconds after a table's last successful load or 304 during which its cached entry is used with no request
    # at all; 0 (the default): every lookup revalidates with If-None-Match (strict freshness).
    metadata_revalidate_seconds: float = 0.0
    server_side_planning: bool = False
    warehouses: Array[SiblingWarehouseConfig] = ()

    @property
    def effective_access_delegation(self) -> AccessDelegation:
        """What SQE sends as ``X-Iceberg-Access-Delegation``: requiring vended credentials implies asking."""
        return VENDED_CREDENTIALS if self.require_vended_credentials else self.access_delegation

    @property
    def warehouse_names(self) -> tuple[str, ...]:
        return (self.warehouse, *(w.name for w in self.warehouses))

    def connections(self) -> dict[str, CatalogConnection]:
        """Every warehouse's connection settings by name; a :class:`ConfigError` when one is refused."""
        return {name: self.connection(name) for name in self.warehouse_names}

    def connection(self, warehouse: str | None = None) -> CatalogConnection:
        """Connection settings for ``warehouse`` (default: the primary one).

        A sibling that sets any of client_id/client_secret/token/reader_* uses only its own credentials, so two
        principals' credentials are never mixed; otherwise it inherits all of ``[catalog]``'s, on another catalog
        only when it opts in (``inherit_credentials``) and ``[catalog]`` has no reader. That rule is checked here
        too, not only by :func:`load_config`: a config built in code reaches every catalog client through here.
        """
        name = self.warehouse if warehouse is None else warehouse
        if name == self.warehouse:
            return CatalogConnection(warehouse=name, uri=self.uri, scope=self.scope, **self.auth_settings())
        index = next((i for i, w in enumerate(self.warehouses) if w.name == name), None)
        if index is None:
            raise ConfigError(f"unknown warehouse {name!r}; configured: {', '.join(self.warehouse_names)}")
        refusal = sibling_credentials_refusal(self, index)
        if refusal is not None:
            raise ConfigError(": ".join(refusal))
        sibling = self.warehouses[index]
        source: CatalogAuth = sibling if sibling.sets_auth else self
        return CatalogConnection(
            warehouse=name, uri=sibling.uri or self.uri, scope=self.scope, **source.auth_settings()
        )


class TvfConfig(ConfigSection):
    """File table functions (``read_parquet``, ``read_csv``, ``read_json``): where they may read at all."""

    allowed_object_store_prefixes: Array[str] = ()
    # Local directories (absolute paths) the file table functions may read; empty: no local file at all.
    allowed_local_prefixes: Array[str] = ()


class StorageConfig(ConfigSection):
    endpoint: Unset[str] = None  # S3 endpoint URL, over the catalog's; None: the catalog's, else AWS
    # None: the catalog's region if it sends one, else DEFAULT_REGION (see effective_region).
    region: Unset[str] = None
    # None: pyarrow's default (path style with a custom endpoint, virtual hosts on AWS).
    path_style: Unset[bool] = None
    access_key_id: Unset[str] = None
    secret_access_key: Unset[SecretStr] = None
    session_token: Unset[SecretStr] = None
    tvf: TvfConfig = Field(default_factory=TvfConfig)

    DEFAULT_REGION: typing.ClassVar[str] = "us-east-1"

    @property
    def effective_region(self) -> str:
        return self.region or self.DEFAULT_REGION

    def session_token_value(self) -> str | None:
        """The static pair's session token, for signing requests only."""
        return reveal(self.session_token)


class CoordinatorConfig(ConfigSection):
    """Distributed execution: scan workers, their token/TLS, what tickets carry, credential pushing."""

    workers: Array[str] = ()
    token: Unset[SecretStr] = None
    tls_ca: Unset[str] = None
    distributed_credentials: DistributedCredentials = "auto"
    push_credentials: bool = True
    # Simple aggregates (count/sum/min/max, GROUP BY columns, no WHERE) run partially on the workers.
    partial_aggregation: bool = True

    def token_value(self) -> str | None:
        """The bearer token presented to workers, for the gRPC call metadata only."""
        return reveal(self.token)


class ExternalTablesConfig(ConfigSection):
    """Hive-style external tables: where their definitions persist, and the key their own S3 keys are sealed with."""

    # SQLite file of the definitions; relative paths are relative to the config file. Unset: beside the config
    # file (``sqe-external-tables.db``), or in the working directory without one. load_config makes it absolute.
    path: Unset[str] = None
    # Environment variable holding the Fernet key (urlsafe base64, 32 bytes) that encrypts a mount's own keys.
    key_env: str = "SQE_EXTERNAL_TABLES_KEY"
    # Whether a mount may read its keys from environment variables it names (access_key_id_env): this process's
    # own environment. ``sqe serve`` turns it off for its users (the server's environment is not theirs).
    environment_keys: bool = True
    # Whether a mount without keys of its own may read with the [storage] pair. ``sqe serve`` turns it off for its
    # users: the server's key is not theirs, so each mount brings its own keys.
    storage_keys: bool = True


class CacheConfig(ConfigSection):
    """Per-process caches of immutable file content, each entry served only under the credential set it was
    read with (see ``sqe.execution.byte_cache``). Bytes; 0 turns a cache off."""

    # Data-file byte ranges (column chunks, footers) for repeat queries.
    data_bytes: int = 256 << 20
    # Whole manifest lists and manifests, so a repeat plan reads no metadata from the object store.
    manifest_bytes: int = 32 << 20
    # Decoded Arrow columns of range-cached files' row groups, so a repeat scan skips the Parquet decode too.
    decoded_bytes: int = 256 << 20
    # Fetch the column chunks a scan reads of a large (range-cached) data file in parallel, before pyarrow asks
    # for a row group's one after another: faster on a store with per-request latency (a remote one) and large
    # row groups, not on a loopback one. Needs data_bytes > 0 (the parts go into that cache). Per session.
    prefetch: bool = False


class MemoryConfig(ConfigSection):
    """How the process's C allocator treats freed memory (``sqe.execution.allocator``)."""

    # Freed memory kept for reuse instead of returned to the OS at once (glibc only); 0 leaves malloc alone.
    keep_freed_bytes: int = 1 << 30


class SQEConfig(ConfigSection):
    catalog: CatalogConfig
    storage: StorageConfig = Field(default_factory=StorageConfig)
    coordinator: CoordinatorConfig = Field(default_factory=CoordinatorConfig)
    external_tables: ExternalTablesConfig = Field(default_factory=ExternalTablesConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)

    def static_key_pair(self) -> tuple[str, str] | None:
        """The ``[storage]`` access key pair, or None when SQE has no static key."""
        key, secret = self.storage.access_key_id, reveal(self.storage.secret_access_key)
        return (key, secret) if key and secret else None


# ------------------------------------------------------------------------------------- cross-field checks


def _check_http_url(value: str | None, key: str, origins: Origins) -> None:
    if value is None:
        return
    try:
        parts = urlsplit(value)
    except ValueError:  # "http://[x": an IPv6 host urlsplit cannot read
        origins.fail(key, "must be an http:// or https:// URL")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        origins.fail(key, "must be an http:// or https:// URL")
    if "\\" in parts.netloc:  # requests (urllib3) would read another host than urlsplit: see _catalog_endpoint
        origins.fail(key, "must not hold a backslash in its host part")


def _check_no_userinfo(value: str | None, key: str, origins: Origins, why: str) -> None:
    """A URL setting with ``user:password@``: refused, naming the key only (the value would show the password)."""
    if value and "@" in urlsplit(value).netloc:
        origins.fail(key, f"must not hold a user name or password ({why})")


def _check_auth(
    client_id: str | None, secret: SecretStr | None, token: SecretStr | None, where: str, o: Origins
) -> None:
    if client_id and not secret:
        o.fail(f"{where}.client_secret", f"required when {where}.client_id is set")
    if secret and not client_id:
        o.fail(f"{where}.client_id", f"required when {where}.client_secret is set")
    if token and client_id:
        o.fail(f"{where}.token", f"set either {where}.token or {where}.client_id/client_secret, not both")


def _check_reader(
    reader_id: str | None,
    reader_secret: SecretStr | None,
    has_end_user: bool,
    where: str,
    o: Origins,
) -> None:
    if reader_id and not reader_secret:
        o.fail(f"{where}.reader_client_secret", f"required when {where}.reader_client_id is set")
    if reader_secret and not reader_id:
        o.fail(f"{where}.reader_client_id", f"required when {where}.reader_client_secret is set")
    if reader_id and not has_end_user:
        o.fail(
            f"{where}.reader_client_id",
            f"a reader acts for an end user: set {where}.client_id/client_secret or {where}.token too",
        )


def _check_object_store_prefixes(prefixes: tuple[str, ...], key: str, origins: Origins) -> None:
    for i, prefix in enumerate(prefixes):
        if not is_object_store(prefix) or not urlsplit(prefix).netloc:
            origins.fail(f"{key}[{i}]", "must be an object-store prefix with a bucket, e.g. s3://bucket/path")


def _validate_catalog(c: CatalogConfig, o: Origins) -> None:
    _check_http_url(c.uri, "catalog.uri", o)
    # Never sent as credentials (the catalog authenticates with OAuth), it would be carried into logs and reprs.
    _check_no_userinfo(c.uri, "catalog.uri", o, "set catalog.client_id/client_secret or catalog.token")
    if not c.warehouse:
        o.fail("catalog.warehouse", "must not be empty")
    _check_auth(c.client_id, c.client_secret, c.token, "catalog", o)
    _check_reader(c.reader_client_id, c.reader_client_secret, bool(c.client_id or c.token), "catalog", o)
    if c.credential_max_age_seconds <= 0:
        o.fail("catalog.credential_max_age_seconds", "must be positive")
    if c.request_timeout_seconds <= 0:
        o.fail("catalog.request_timeout_seconds", "must be positive")
    if c.max_retries < 0:
        o.fail("catalog.max_retries", "must not be negative")
    if c.metadata_revalidate_seconds < 0:
        o.fail("catalog.metadata_revalidate_seconds", "must not be negative")
    _check_object_store_prefixes(c.tvf_prefixes, "catalog.tvf_prefixes", o)
    seen = {c.warehouse}
    for i, w in enumerate(c.warehouses):
        where = f"catalog.warehouses[{i}]"
        if not w.name:
            o.fail(f"{where}.name", "must not be empty")
        if w.name in seen:
            o.fail(f"{where}.name", f"duplicate warehouse name {short(w.name)}")
        seen.add(w.name)
        _check_http_url(w.uri, f"{where}.uri", o)
        _check_no_userinfo(w.uri, f"{where}.uri", o, f"set {where}.client_id/client_secret or {where}.token")
        _check_auth(w.client_id, w.client_secret, w.token, where, o)
        # A sibling with its own reader must name its own end user too (own credentials are never mixed).
        _check_reader(w.reader_client_id, w.reader_client_secret, bool(w.client_id or w.token), where, o)
        refusal = sibling_credentials_refusal(c, i)
        if refusal is not None:
            o.fail(*refusal)


def sibling_credentials_refusal(c: CatalogConfig, index: int) -> tuple[str, str] | None:
    """Why sibling ``index`` may not have the credentials it would get, as (key, message); None when it may.

    A sibling on another catalog that inherited ``[catalog]``'s credentials would send them to that catalog's
    host, whose operator could replay them at the primary catalog as this user (a browser or curl never sends
    credentials to another origin on a redirect either). So it inherits only on an explicit
    ``inherit_credentials = true``, and never the reader's: with the reader's secret that operator could exchange
    any user's token it also sees for raw credentials of their restricted tables."""
    w, where = c.warehouses[index], f"catalog.warehouses[{index}]"
    if w.inherit_credentials and w.sets_auth:
        return (
            f"{where}.inherit_credentials",
            f"set either {where}.inherit_credentials or its own credentials, not both",
        )
    on_another_catalog = w.uri is not None and not same_catalog(w.uri, c.uri)
    if w.sets_auth or not c.sets_auth or not on_another_catalog:
        return None  # its own credentials, nothing to inherit, or the same catalog
    if c.reader_client_id is not None:
        return (
            f"{where}.uri",
            "is another catalog than catalog.uri, which would receive the reader's secret "
            f"(catalog.reader_client_secret) from this warehouse; set {where}.client_id/client_secret or {where}.token "
            f"(and {where}.reader_client_id with its secret for a reader there); {where}.inherit_credentials never "
            "sends the reader's",
        )
    if w.inherit_credentials:
        return None
    sent = "catalog.client_secret" if c.client_secret is not None else "catalog.token"
    return (
        f"{where}.uri",
        f"{short(origin_of(w.uri or ''))} is another catalog than catalog.uri and would receive [catalog]'s "
        f"credentials ({sent}); set {where}.client_id/client_secret or {where}.token, or "
        f"{where}.inherit_credentials = true to send [catalog]'s to that host",
    )


def origin_of(uri: str) -> str:
    """``scheme://host:port`` of ``uri``: what an error may show of it (never a user name, password or query).
    Read by hand: a config built in code may hold a uri urlsplit refuses (``http://[x``)."""
    scheme, _, rest = uri.partition("://")
    authority = re.split(r"[/?#\\]", rest, maxsplit=1)[0]  # a backslash ends it for requests (urllib3)
    return f"{scheme}://{authority.rpartition('@')[2]}"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def same_catalog(uri: str, other: str) -> bool:
    """Whether two catalog URIs name one catalog as HTTP reads them: scheme and host in any case, the default port
    written or not, trailing slashes aside. Any other difference (host, port, path) is another catalog."""
    endpoint = _catalog_endpoint(uri)
    return endpoint is not None and endpoint == _catalog_endpoint(other)


def same_origin(uri: str, other: str) -> bool:
    """Whether two URLs name one origin (scheme, host, port) as HTTP reads them: a browser or requests keeps
    sending ``Authorization`` within it, and only within it. A URL urlsplit cannot read is no origin."""
    endpoint = _catalog_endpoint(uri)
    return endpoint is not None and endpoint[:3] == (_catalog_endpoint(other) or ())[:3]


def _catalog_endpoint(uri: str) -> tuple[str, str, int, str, str, str] | None:
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:  # not a host or port urlsplit reads: no endpoint, so never the same catalog as another
        return None
    if "\\" in parts.netloc:
        # urlsplit reads http://evil\@cat:8181 as host cat, requests (urllib3) as host evil: no endpoint either
        return None
    scheme = parts.scheme  # urlsplit reads it in lower case; hostname too
    default = _DEFAULT_PORTS.get(scheme, 0)
    return scheme, parts.hostname or "", port or default, parts.path.rstrip("/"), parts.query, parts.fragment


def _validate_storage(s: StorageConfig, o: Origins) -> None:
    _check_http_url(s.endpoint, "storage.endpoint", o)
    # Never used (requests are signed with the key pair), it would only be carried into every FileIO's settings.
    _check_no_userinfo(s.endpoint, "storage.endpoint", o, "S3 requests are signed with the keys")
    if s.access_key_id and not s.secret_access_key:
        o.fail("storage.secret_access_key", "required when storage.access_key_id is set")
    if s.secret_access_key and not s.access_key_id:
        o.fail("storage.access_key_id", "required when storage.secret_access_key is set")
    if s.session_token and not s.access_key_id:
        o.fail("storage.session_token", "requires storage.access_key_id and storage.secret_access_key")
    _check_object_store_prefixes(s.tvf.allowed_object_store_prefixes, "storage.tvf.allowed_object_store_prefixes", o)
    for i, local in enumerate(s.tvf.allowed_local_prefixes):
        if not Path(local).is_absolute() or "://" in local:
            o.fail(
                f"storage.tvf.allowed_local_prefixes[{i}]", "must be an absolute local directory, e.g. /data/exports"
            )


def _check_plaintext_workers(workers: tuple[str, ...], o: Origins) -> None:
    """Without ``tls_ca`` the channel is plaintext: the token and every ticket's keys would cross the network
    readable, so only loopback workers are allowed (as ``[server] listen`` serves plaintext on loopback only)."""
    for i, worker in enumerate(workers):
        if not is_loopback(address_host(worker)):
            o.fail(
                f"coordinator.workers[{i}]",
                f"{short(worker)} is not a loopback address; workers are reached in plaintext on loopback only "
                "(set coordinator.tls_ca)",
            )


def _validate_coordinator(c: CoordinatorConfig, require_vended: bool, o: Origins) -> None:
    for i, worker in enumerate(c.workers):
        host, sep, port = worker.rpartition(":")
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            o.fail(f"coordinator.workers[{i}]", 'must be "host:port"')
    if c.workers and not c.token:
        o.fail(
            "coordinator.token",
            "required when coordinator.workers is set (workers only accept an authenticated coordinator)",
        )
    if not c.tls_ca:
        _check_plaintext_workers(c.workers, o)
    if c.distributed_credentials == "static" and require_vended:
        o.fail(
            "coordinator.distributed_credentials",
            '"static" contradicts catalog.require_vended_credentials = true; use "vended" or "auto"',
        )


def _validate_cache(c: CacheConfig, o: Origins) -> None:
    for key in ("data_bytes", "manifest_bytes", "decoded_bytes"):
        if getattr(c, key) < 0:
            o.fail(f"cache.{key}", "must not be negative (0 turns the cache off)")
    if c.prefetch and c.data_bytes == 0:
        o.fail("cache.prefetch", "needs cache.data_bytes above 0 (prefetched column chunks go into that cache)")


def _validate_memory(m: MemoryConfig, o: Origins) -> None:
    if m.keep_freed_bytes < 0:
        o.fail("memory.keep_freed_bytes", "must not be negative (0 leaves the allocator alone)")


def _validate(config: SQEConfig, origins: Origins) -> None:
    _validate_catalog(config.catalog, origins)
    _validate_storage(config.storage, origins)
    _validate_cache(config.cache, origins)
    _validate_memory(config.memory, origins)
    _validate_coordinator(config.coordinator, config.catalog.require_vended_credentials, origins)


# ------------------------------------------------------------------------------------------- loading


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SQEConfig:
    """Loads and validates SQE's configuration.

    ``env`` defaults to ``os.environ``; pass ``{}`` to ignore the environment. ``overrides`` take dotted keys
    (``{"catalog.uri": ...}``) or whole sections (``{"catalog": {"uri": ...}}``) with native values.
    """
    tree = read_toml(path, ConfigError, SQEConfig) if path is not None else {}
    origins = Origins(ConfigError)
    apply_env(tree, os.environ if env is None else env, ENV_PREFIX, SQEConfig, origins)
    apply_overrides(tree, overrides or {}, origins)
    config = build(SQEConfig, tree, origins, _UNSUPPORTED_CHOICES)
    _validate(config, origins)
    return _anchor_external_tables(config, Path(path) if path is not None else None)


EXTERNAL_TABLES_FILE = "sqe-external-tables.db"


def _anchor_external_tables(config: SQEConfig, path: Path | None) -> SQEConfig:
    """The definitions file beside the config file by default; a relative path is relative to that file."""
    base = path.resolve().parent if path is not None else Path.cwd()
    given = config.external_tables.path
    where = base / EXTERNAL_TABLES_FILE if given is None else base / Path(given).expanduser()
    section = config.external_tables.model_copy(update={"path": str(where)})
    return config.model_copy(update={"external_tables": section})
