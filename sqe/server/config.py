"""``server.toml``: the ``[server]`` section of ``sqe serve``, a strict pydantic model with env overrides.

Sources, lowest precedence first: the ``[server]`` table of the file, then ``SQE_SERVER_<KEY>`` environment
variables (e.g. ``SQE_SERVER_READER_CLIENT_SECRET``). The engine settings every user session shares (catalog
URI and warehouse, storage, coordinator) live in an ordinary SQE config file named by ``engine_config`` (relative
to ``server.toml``), loaded with :func:`sqe.config.load_config`. Unknown keys, wrong types and bad values are a
one-line :class:`~sqe.errors.ConfigError` naming the key and, when an env variable set it, the variable.
``config.toml.example`` documents every key in its ``[server]`` section.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from sqe._net import is_loopback
from sqe._text import first_line
from sqe.errors import ConfigError

ENV_PREFIX = "SQE_SERVER_"


class ServerConfig(BaseModel):
    """What ``sqe serve`` needs besides the engine config. Secrets are ``SecretStr`` (never in a repr)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    engine_config: str
    listen: str = "127.0.0.1:8815"
    tls_cert: str | None = None
    tls_key: str | None = None
    reader_client_id: str | None = None
    reader_client_secret: SecretStr | None = None
    max_concurrent_queries: int = Field(default=16, ge=1)
    max_concurrent_queries_per_user: int = Field(default=4, ge=1)
    idle_session_seconds: float = Field(default=900.0, gt=0)
    query_timeout_seconds: float = Field(default=3600.0, gt=0)
    # a result GetFlightInfo produced holds an engine and a query slot until its DoGet; a client that never asks
    # for it must not hold them for the whole query timeout
    unfetched_result_seconds: float = Field(default=60.0, gt=0)
    auth_cache_seconds: float = Field(default=0.0, ge=0)
    batch_rows: int = Field(default=65_536, ge=1)

    @model_validator(mode="after")
    def _pairs(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be set together")
        if (self.reader_client_id is None) != (self.reader_client_secret is None):
            raise ValueError("reader_client_id and reader_client_secret must be set together")
        if self.max_concurrent_queries_per_user > self.max_concurrent_queries:
            raise ValueError("max_concurrent_queries_per_user must not exceed max_concurrent_queries")
        return self

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def delegates(self) -> bool:
        """True when a reader identity is configured: user sessions then run on delegated tokens."""
        return self.reader_client_id is not None

    def check_listen(self) -> None:
        """``host:port`` must parse; plaintext is refused anywhere but loopback."""
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f'server.listen: must be "host:port", got {self.listen!r}')
        if not self.tls and not is_loopback(self.host):
            raise ConfigError(
                f"server.listen: {self.listen} is not a loopback address; plaintext is only served on loopback "
                "(set server.tls_cert and server.tls_key)"
            )


# ---------------------------------------------------------------------------------------------- loading


def _env_value(text: str, annotation: Any) -> Any:
    """An env string in the field's type (strict models take no strings for numbers); unparsable stays text."""
    kinds = {int: int, float: float}
    for kind, parse in kinds.items():
        if annotation is kind:
            try:
                return parse(text.strip())
            except ValueError:
                return text
    return text


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Env overrides into ``raw``; returns which variable set which key (for error messages)."""
    origins: dict[str, str] = {}
    fields = ServerConfig.model_fields
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or "__" in name:
            continue  # SQE_SERVER__X would be an engine-style key; not ours
        key = name[len(ENV_PREFIX) :].lower()
        if key not in fields:
            raise ConfigError(f"{name}: unknown key server.{key}")
        raw[key] = _env_value(env[name], fields[key].annotation)
        origins[key] = name
    return origins


def _error(exc: ValidationError, origins: Mapping[str, str]) -> ConfigError:
    error = exc.errors()[0]
    location = ".".join(str(part) for part in error["loc"])
    key = f"server.{location}" if location else "server"
    if location in origins:
        key += f" (set by {origins[location]})"
    message = "unknown key" if error["type"] == "extra_forbidden" else first_line(str(error["msg"]))
    message = message.removeprefix("Value error, ")
    return ConfigError(f"{key}: {message}")


def _read_server_table(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            tree = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"server config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {first_line(exc)}") from None
    unknown = sorted(set(tree) - {"server"})
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section in {path.name} (engine settings go in server.engine_config)")
    section = tree.get("server", {})
    if not isinstance(section, dict):
        raise ConfigError("server: expected a table")
    return dict(section)


def load_server_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> ServerConfig:
    """Reads ``[server]`` from ``path`` plus ``SQE_SERVER_*``; ``engine_config`` becomes an absolute path."""
    source = Path(path)
    raw = _read_server_table(source)
    origins = _apply_env(raw, os.environ if env is None else env)
    if isinstance(raw.get("reader_client_secret"), str):
        raw["reader_client_secret"] = SecretStr(raw["reader_client_secret"])
    if isinstance(raw.get("engine_config"), str):
        raw["engine_config"] = str((source.parent / raw["engine_config"]).resolve())
    try:
        config = ServerConfig.model_validate(raw)
    except ValidationError as exc:
        raise _error(exc, origins) from None
    config.check_listen()
    return config
