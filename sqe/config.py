"""SQE's configuration (``config.toml``), validated strictly at start-up.

Sources, lowest precedence first: the TOML file, ``SQE_<SECTION>__<KEY>`` environment variables, then
``overrides`` given to :func:`load_config`. Unknown keys and wrong types are :class:`ConfigError` naming the
full key (and the variable or override that set it), so a typo never silently falls back to a default.
Secrets are ``repr=False`` everywhere and the config objects refuse to be pickled.
``config.toml.example`` documents every key.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar
from urllib.parse import urlsplit

from sqe.errors import ConfigError

AccessDelegation = Literal["none", "vended-credentials"]
DistributedCredentials = Literal["vended", "static", "auto"]

ENV_PREFIX = "SQE_"
_OBJECT_STORE_SCHEMES = ("s3://", "s3a://", "s3n://")
# Values some users will try that SQE refuses, with the reason shown in the error.
_UNSUPPORTED_CHOICES: dict[str, dict[str, str]] = {
    "catalog.access_delegation": {"remote-signing": "SQE does not implement remote signing"},
}


class _NoPickle:
    """Config objects hold secrets: they must never be pickled (copying in memory is fine: they're frozen)."""

    def __reduce__(self) -> NoReturn:
        raise TypeError(f"{type(self).__name__} holds secrets and cannot be pickled")

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


@dataclass(frozen=True)
class WarehouseConfig(_NoPickle):
    """A sibling warehouse (``[[catalog.warehouses]]``); unset connection settings come from ``[catalog]``."""

    name: str
    uri: str | None = None
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CatalogConnection(_NoPickle):
    """Everything needed to talk to one warehouse's catalog, inheritance from ``[catalog]`` resolved."""

    warehouse: str
    uri: str
    scope: str
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CatalogConfig(_NoPickle):
    uri: str
    warehouse: str
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    scope: str = "PRINCIPAL_ROLE:ALL"
    access_delegation: AccessDelegation = "none"
    require_vended_credentials: bool = False
    tvf_prefixes: tuple[str, ...] = ()
    credential_max_age_seconds: int = 900
    request_timeout_seconds: float = 30.0
    max_retries: int = 5
    client_capabilities: str = "read-restrictions.v1"
    metadata_cache: bool = True
    warehouses: tuple[WarehouseConfig, ...] = ()

    @property
    def effective_access_delegation(self) -> AccessDelegation:
        """What SQE sends as ``X-Iceberg-Access-Delegation``: requiring vended credentials implies asking."""
        return "vended-credentials" if self.require_vended_credentials else self.access_delegation

    @property
    def warehouse_names(self) -> tuple[str, ...]:
        return (self.warehouse, *(w.name for w in self.warehouses))

    def connection(self, warehouse: str | None = None) -> CatalogConnection:
        """Connection settings for ``warehouse`` (default: the primary one).

        A sibling that sets any of client_id/client_secret/token uses only its own credentials, so two
        principals' credentials are never mixed; otherwise it inherits all of ``[catalog]``'s.
        """
        name = self.warehouse if warehouse is None else warehouse
        if name == self.warehouse:
            return CatalogConnection(name, self.uri, self.scope, self.client_id, self.client_secret, self.token)
        sibling = next((w for w in self.warehouses if w.name == name), None)
        if sibling is None:
            raise ConfigError(f"unknown warehouse {name!r}; configured: {', '.join(self.warehouse_names)}")
        own_auth = any(v is not None for v in (sibling.client_id, sibling.client_secret, sibling.token))
        source: WarehouseConfig | CatalogConfig = sibling if own_auth else self
        return CatalogConnection(
            warehouse=name,
            uri=sibling.uri or self.uri,
            scope=self.scope,
            client_id=source.client_id,
            client_secret=source.client_secret,
            token=source.token,
        )


@dataclass(frozen=True)
class TvfConfig(_NoPickle):
    allowed_object_store_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StorageConfig(_NoPickle):
    endpoint: str | None = None
    # None: the catalog's region if it sends one, else DEFAULT_REGION (see effective_region).
    region: str | None = None
    # None: pyarrow's default (path style with a custom endpoint, virtual hosts on AWS).
    path_style: bool | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    tvf: TvfConfig = field(default_factory=TvfConfig)

    DEFAULT_REGION: typing.ClassVar[str] = "us-east-1"

    @property
    def effective_region(self) -> str:
        return self.region or self.DEFAULT_REGION


@dataclass(frozen=True)
class CoordinatorConfig(_NoPickle):
    """Distributed execution: scan workers, their token/TLS, what tickets carry, credential pushing."""

    workers: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)
    tls_ca: str | None = None
    distributed_credentials: DistributedCredentials = "auto"
    push_credentials: bool = True


@dataclass(frozen=True)
class SQEConfig(_NoPickle):
    catalog: CatalogConfig
    storage: StorageConfig = field(default_factory=StorageConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)

    def static_key_pair(self) -> tuple[str, str] | None:
        """The ``[storage]`` access key pair, or None when SQE has no static key."""
        key, secret = self.storage.access_key_id, self.storage.secret_access_key
        return (key, secret) if key and secret else None


# ---------------------------------------------------------------------------------------------- loading

_T = TypeVar("_T")


class _Origins:
    """Remembers which env variable or override set a key, so errors can point at it."""

    def __init__(self) -> None:
        self._by_key: dict[str, str] = {}

    def record(self, key: str, origin: str) -> None:
        self._by_key[key] = origin

    def fail(self, key: str, message: str) -> NoReturn:
        origin = self._lookup(key)
        where = f"{key} (set by {origin})" if origin else key
        raise ConfigError(f"{where}: {message}")

    def _lookup(self, key: str) -> str | None:
        candidate = key
        while candidate:
            if candidate in self._by_key:
                return self._by_key[candidate]
            candidate = _PARENT_KEY.sub("", candidate)
        # An unknown section named by a dotted override ("catalgo.uri" fails as "catalgo").
        return next((origin for k, origin in self._by_key.items() if k.startswith(key + ".")), None)


_PARENT_KEY = re.compile(r"(\.[^.\[]+|\[\d+\]|^[^.\[]+)$")  # strips the last ".name", "[i]" or the root


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _non_none(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0]


def _tuple_item(tp: Any) -> Any | None:
    if typing.get_origin(tp) is tuple:
        return typing.get_args(tp)[0]
    return None


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)


def _type_name(tp: Any) -> str:
    if _is_optional(tp):
        return _type_name(_non_none(tp))
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(f'"{a}"' for a in typing.get_args(tp))
    item = _tuple_item(tp)
    if item is not None:
        return "an array of tables" if _is_section(item) else "a list of strings"
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean (true/false)"}
    return names.get(tp, "a table")


def _value_kind(value: Any) -> str:
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}
    return "a table" if isinstance(value, dict) else kinds.get(type(value), type(value).__name__)


def _short(value: str) -> str:
    return json.dumps(value if len(value) <= 40 else value[:37] + "...")


def _convert(value: Any, tp: Any, key: str, origins: _Origins) -> Any:
    if _is_optional(tp):
        if value is None or value == "":
            return None
        return _convert(value, _non_none(tp), key, origins)
    if _is_section(tp):
        if not isinstance(value, dict):
            origins.fail(key, f"expected a table, got {_value_kind(value)}")
        return _build(tp, value, key, origins)
    item = _tuple_item(tp)
    if item is not None:
        return _convert_list(value, item, key, origins)
    if typing.get_origin(tp) is Literal:
        return _convert_choice(value, typing.get_args(tp), key, origins)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not tp:
        origins.fail(key, f"expected {_type_name(tp)}, got {_value_kind(value)}")
    return value


def _convert_list(value: Any, item: Any, key: str, origins: _Origins) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        origins.fail(key, f"expected {_type_name(tuple[item, ...])}, got {_value_kind(value)}")
    if _is_section(item):
        return tuple(_convert(v, item, f"{key}[{i}]", origins) for i, v in enumerate(value))
    for i, v in enumerate(value):
        if not isinstance(v, str):
            origins.fail(f"{key}[{i}]", f"expected a string, got {_value_kind(v)}")
    return tuple(value)


def _convert_choice(value: Any, choices: tuple[str, ...], key: str, origins: _Origins) -> str:
    allowed = " or ".join(f'"{c}"' for c in choices)
    if not isinstance(value, str):
        origins.fail(key, f"expected one of {allowed}, got {_value_kind(value)}")
    if value not in choices:
        reason = _UNSUPPORTED_CHOICES.get(key, {}).get(value)
        because = f" ({reason})" if reason else ""
        origins.fail(key, f"{_short(value)} is not supported{because}; use {allowed}")
    return value


def _build(cls: type[_T], raw: Mapping[str, Any], where: str, origins: _Origins) -> _T:
    hints = _hints(cls)
    for name in raw:
        if name not in hints:
            origins.fail(_join(where, name), "unknown key")
    kwargs: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        key, tp = _join(where, f.name), hints[f.name]
        if f.name in raw:
            kwargs[f.name] = _convert(raw[f.name], tp, key, origins)
        elif _is_section(tp):
            kwargs[f.name] = _build(tp, {}, key, origins)  # defaults apply; missing leaves get named
        elif f.default is MISSING and f.default_factory is MISSING:
            origins.fail(key, "required")
    return cls(**kwargs)


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# ------------------------------------------------------------------------------------- cross-field checks


def _check_http_url(value: str | None, key: str, origins: _Origins) -> None:
    if value is None:
        return
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        origins.fail(key, "must be an http:// or https:// URL")


def _check_auth(client_id: str | None, secret: str | None, token: str | None, where: str, o: _Origins) -> None:
    if client_id and not secret:
        o.fail(f"{where}.client_secret", f"required when {where}.client_id is set")
    if secret and not client_id:
        o.fail(f"{where}.client_id", f"required when {where}.client_secret is set")
    if token and client_id:
        o.fail(f"{where}.token", f"set either {where}.token or {where}.client_id/client_secret, not both")


def _check_object_store_prefixes(prefixes: tuple[str, ...], key: str, origins: _Origins) -> None:
    for i, prefix in enumerate(prefixes):
        scheme_ok = prefix.startswith(_OBJECT_STORE_SCHEMES)
        if not scheme_ok or not urlsplit(prefix).netloc:
            origins.fail(f"{key}[{i}]", "must be an object-store prefix with a bucket, e.g. s3://bucket/path")


def _validate_catalog(c: CatalogConfig, o: _Origins) -> None:
    _check_http_url(c.uri, "catalog.uri", o)
    if not c.warehouse:
        o.fail("catalog.warehouse", "must not be empty")
    _check_auth(c.client_id, c.client_secret, c.token, "catalog", o)
    if c.credential_max_age_seconds <= 0:
        o.fail("catalog.credential_max_age_seconds", "must be positive")
    if c.request_timeout_seconds <= 0:
        o.fail("catalog.request_timeout_seconds", "must be positive")
    if c.max_retries < 0:
        o.fail("catalog.max_retries", "must not be negative")
    _check_object_store_prefixes(c.tvf_prefixes, "catalog.tvf_prefixes", o)
    seen = {c.warehouse}
    for i, w in enumerate(c.warehouses):
        where = f"catalog.warehouses[{i}]"
        if not w.name:
            o.fail(f"{where}.name", "must not be empty")
        if w.name in seen:
            o.fail(f"{where}.name", f"duplicate warehouse name {_short(w.name)}")
        seen.add(w.name)
        _check_http_url(w.uri, f"{where}.uri", o)
        _check_auth(w.client_id, w.client_secret, w.token, where, o)


def _validate_storage(s: StorageConfig, o: _Origins) -> None:
    _check_http_url(s.endpoint, "storage.endpoint", o)
    if s.access_key_id and not s.secret_access_key:
        o.fail("storage.secret_access_key", "required when storage.access_key_id is set")
    if s.secret_access_key and not s.access_key_id:
        o.fail("storage.access_key_id", "required when storage.secret_access_key is set")
    if s.session_token and not s.access_key_id:
        o.fail("storage.session_token", "requires storage.access_key_id and storage.secret_access_key")
    _check_object_store_prefixes(s.tvf.allowed_object_store_prefixes, "storage.tvf.allowed_object_store_prefixes", o)


def _validate_coordinator(c: CoordinatorConfig, require_vended: bool, o: _Origins) -> None:
    for i, worker in enumerate(c.workers):
        host, sep, port = worker.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            o.fail(f"coordinator.workers[{i}]", 'must be "host:port"')
    if c.workers and not c.token:
        o.fail(
            "coordinator.token",
            "required when coordinator.workers is set (workers only accept an authenticated coordinator)",
        )
    if c.distributed_credentials == "static" and require_vended:
        o.fail(
            "coordinator.distributed_credentials",
            '"static" contradicts catalog.require_vended_credentials = true; use "vended" or "auto"',
        )


def _validate(config: SQEConfig, origins: _Origins) -> None:
    _validate_catalog(config.catalog, origins)
    _validate_storage(config.storage, origins)
    _validate_coordinator(config.coordinator, config.catalog.require_vended_credentials, origins)


# ------------------------------------------------------------------------------------ env and overrides


def _env_bool(text: str) -> bool | None:
    return {"true": True, "1": True, "false": False, "0": False}.get(text.strip().lower())


def _env_list(text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            return None
    return [part.strip() for part in stripped.split(",") if part.strip()]


def _parse_env_value(text: str, tp: Any) -> Any:
    """Turns an environment string into the field's type; None when it cannot be parsed."""
    if _is_optional(tp):
        return None if text == "" else _parse_env_value(text, _non_none(tp))
    item = _tuple_item(tp)
    if item is not None:
        return _env_list(text) if not _is_section(item) else _env_json(text)
    parsers: dict[Any, Any] = {bool: _env_bool, int: _env_int, float: _env_float}
    parser = parsers.get(tp)
    return parser(text) if parser else text


def _env_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _env_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _env_float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _resolve_key(parts: list[str]) -> tuple[str, Any] | None:
    """Dotted key and field type for ``parts`` (lower-case names), or None if no such key exists."""
    cls: Any = SQEConfig
    for i, part in enumerate(parts):
        hints = _hints(cls)
        if part not in hints:
            return None
        tp = hints[part]
        if i == len(parts) - 1:
            return ".".join(parts), tp
        if not _is_section(tp):
            return None
        cls = tp
    return None


def _apply_env(tree: dict[str, Any], env: Mapping[str, str], origins: _Origins) -> None:
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue  # e.g. SQE_CONFIG: not a key override
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        dotted = ".".join(parts)
        resolved = _resolve_key(parts)
        if resolved is None:
            raise ConfigError(f"{name}: unknown key {dotted}")
        key, tp = resolved
        if _is_section(tp):
            raise ConfigError(f"{name}: {key} is a section; set its keys as {name}__<KEY>")
        value = _parse_env_value(env[name], tp)
        if value is None and not _is_optional(tp):
            raise ConfigError(f"{key} (set by {name}): expected {_type_name(tp)}")
        origins.record(key, name)
        _set_path(tree, parts, value)


def _set_path(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    leaf = parts[-1]
    if isinstance(value, Mapping) and isinstance(node.get(leaf), dict):
        for k, v in value.items():
            _set_path(node[leaf], [str(k)], v)
    else:
        node[leaf] = dict(value) if isinstance(value, Mapping) else value


def _apply_overrides(tree: dict[str, Any], overrides: Mapping[str, Any], origins: _Origins) -> None:
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        _record_leaves(dotted, value, f"override {dotted!r}", origins)
        _set_path(tree, parts, value)


def _record_leaves(key: str, value: Any, origin: str, origins: _Origins) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _record_leaves(f"{key}.{k}", v, origin, origins)
    else:
        origins.record(key, origin)


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a directory: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


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
    tree = _read_toml(path) if path is not None else {}
    origins = _Origins()
    _apply_env(tree, os.environ if env is None else env, origins)
    _apply_overrides(tree, overrides or {}, origins)
    config = _build(SQEConfig, tree, "", origins)
    _validate(config, origins)
    return config
