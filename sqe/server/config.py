"""``server.toml``: the ``[server]`` section of ``sqe serve``, on the engine's and the catalog's config loader.

Sources, lowest precedence first: the ``[server]`` table of the file, then ``SQE_SERVER_<KEY>`` environment
variables (e.g. ``SQE_SERVER_READER_CLIENT_SECRET``; the prefix names the section, see
:func:`sqe._config_loader.apply_env`). The engine settings every user session shares (catalog URI and warehouse,
storage, coordinator) live in an ordinary SQE config file named by ``engine_config`` (relative to ``server.toml``),
loaded with :func:`sqe.config.load_config`. The model is a :class:`~sqe._config_loader.ConfigSection` (strict,
frozen, unknown keys forbidden, an empty string unsets an optional key); unknown keys, wrong types and bad values
are a one-line :class:`~sqe.errors.ConfigError` naming the key and, when an env variable set it, the variable, and
never showing a secret. ``config.toml.example`` documents every key in its ``[server]`` section.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, SecretStr

from sqe._config_loader import ConfigSection, Origins, Unset, apply_env, build, read_toml, reveal, short
from sqe._machine import MAX_DATABASE_BYTES, MAX_DATABASE_THREADS, MIN_DATABASE_MEMORY_BYTES
from sqe._net import is_loopback
from sqe.errors import ConfigError

if TYPE_CHECKING:
    from sqe.config import SQEConfig

ENV_PREFIX = "SQE_SERVER_"
SECTION = "server"


class ServerConfig(ConfigSection):
    """What ``sqe serve`` needs besides the engine config. Secrets are ``SecretStr`` (never in a repr)."""

    engine_config: str
    listen: str = "127.0.0.1:8815"
    tls_cert: Unset[str] = None
    tls_key: Unset[str] = None
    reader_client_id: Unset[str] = None
    reader_client_secret: Unset[SecretStr] = None
    max_concurrent_queries: int = Field(default=16, ge=1)
    max_concurrent_queries_per_user: int = Field(default=4, ge=1)
    idle_session_seconds: float = Field(default=900.0, gt=0)
    query_timeout_seconds: float = Field(default=3600.0, gt=0)
    # a result GetFlightInfo produced holds an engine and a query slot until its DoGet; a client that never asks
    # for it must not hold them for the whole query timeout
    unfetched_result_seconds: float = Field(default=60.0, gt=0)
    auth_cache_seconds: float = Field(default=0.0, ge=0)
    batch_rows: int = Field(default=65_536, ge=1)
    # parameter rows a client sends by DoPut are held in memory before a query slot is taken: bounded per call
    max_parameter_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    # What each engine (a client session's DuckDB database) may take; unset: its share of the machine
    # (sqe.server.sessions.engine_limits). Set before the engine's configuration is locked: no user's SQL raises them.
    engine_memory_bytes: Unset[int] = None
    engine_threads: Unset[int] = None
    engine_spill_bytes: Unset[int] = None

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

    def reader_client_secret_value(self) -> str | None:
        """The reader's OAuth client secret, for its token request only."""
        return reveal(self.reader_client_secret)


class ServerFile(ConfigSection):
    """A whole ``server.toml``: only ``[server]`` (the engine settings live in the file ``engine_config`` names)."""

    server: ServerConfig


# ------------------------------------------------------------------------------------- cross-field checks


def _check_pair(first: object, second: object, names: tuple[str, str], o: Origins) -> None:
    """Both set or neither; the error names the one that is set (and the variable that set it)."""
    if (first is None) != (second is None):
        given = names[0] if first is not None else names[1]
        o.fail(f"{SECTION}.{given}", f"{names[0]} and {names[1]} must be set together")


def _check_listen(s: ServerConfig, o: Origins) -> None:
    """``host:port`` must parse; plaintext is refused anywhere but loopback."""
    host, sep, port = s.listen.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) < 65536:
        o.fail(f"{SECTION}.listen", f'must be "host:port", got {short(s.listen)}')
    if not s.tls and not is_loopback(s.host):
        o.fail(
            f"{SECTION}.listen",
            f"{short(s.listen)} is not a loopback address; plaintext is only served on loopback "
            f"(set {SECTION}.tls_cert and {SECTION}.tls_key)",
        )


def _validate(s: ServerConfig, o: Origins) -> None:
    _check_pair(s.tls_cert, s.tls_key, ("tls_cert", "tls_key"), o)
    _check_pair(s.reader_client_id, s.reader_client_secret, ("reader_client_id", "reader_client_secret"), o)
    if s.max_concurrent_queries_per_user > s.max_concurrent_queries:
        o.fail(
            f"{SECTION}.max_concurrent_queries_per_user",
            f"must not exceed {SECTION}.max_concurrent_queries ({s.max_concurrent_queries})",
        )
    _check_listen(s, o)
    _check_engine_limits(s, o)


MIN_ENGINE_MEMORY_BYTES = MIN_DATABASE_MEMORY_BYTES
MAX_ENGINE_BYTES = MAX_DATABASE_BYTES
MAX_ENGINE_THREADS = MAX_DATABASE_THREADS


def _check_engine_limits(s: ServerConfig, o: Origins) -> None:
    if s.engine_memory_bytes is not None and s.engine_memory_bytes < MIN_ENGINE_MEMORY_BYTES:
        o.fail(f"{SECTION}.engine_memory_bytes", f"must be at least {MIN_ENGINE_MEMORY_BYTES} (16 MiB)")
    if s.engine_threads is not None and not 1 <= s.engine_threads <= MAX_ENGINE_THREADS:
        o.fail(f"{SECTION}.engine_threads", f"must be at least 1 and at most {MAX_ENGINE_THREADS}")
    if s.engine_spill_bytes is not None and s.engine_spill_bytes < 0:
        o.fail(f"{SECTION}.engine_spill_bytes", "must not be negative (0: an engine never spills)")
    for key in ("engine_memory_bytes", "engine_spill_bytes"):
        value = getattr(s, key)
        if value is not None and value > MAX_ENGINE_BYTES:
            o.fail(f"{SECTION}.{key}", f"must be at most {MAX_ENGINE_BYTES} (2**63 - 1)")


# ---------------------------------------------------------------------------------------------- loading


def load_server_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> ServerConfig:
    """Reads ``[server]`` from ``path`` plus ``SQE_SERVER_*``; ``engine_config`` becomes an absolute path.

    ``env`` defaults to ``os.environ``; pass ``{}`` to ignore the environment.
    """
    source = Path(path)
    tree = read_toml(source, ConfigError, ServerFile)
    origins = Origins(ConfigError)
    for name in sorted(set(tree) - set(ServerFile.model_fields)):
        origins.fail(name, f"unknown section in {source.name} (engine settings go in {SECTION}.engine_config)")
    apply_env(tree, os.environ if env is None else env, ENV_PREFIX, ServerFile, origins, section=SECTION)
    config = build(ServerFile, tree, origins).server
    _validate(config, origins)
    return config.model_copy(update={"engine_config": str((source.parent / config.engine_config).resolve())})


def check_serving_config(engine_config: SQEConfig) -> None:
    """ConfigError unless the engine reads users' tables with vended credentials only. Without
    ``require_vended_credentials`` a file a table's manifests name outside every prefix the catalog vended for that
    table is read with the server's ``[storage]`` pair or the AWS SDK's ambient credentials; manifests are the
    table writer's text, so a user who may commit to some table could point it at another table's data files and
    have the server read them raw, past that table's restrictions or without a grant on it."""
    if not engine_config.catalog.require_vended_credentials:
        raise ConfigError(
            "sqe serve reads for many users: its engine config must turn on [catalog] require_vended_credentials "
            "(without it a file a table names outside what the catalog vended for it would be read with the "
            "server's own key)"
        )
