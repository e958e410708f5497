"""The ``[server]`` model: strict types, env overrides named in errors, loopback-only plaintext, no secret shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from sqe.errors import ConfigError
from sqe.server.config import load_server_config
from sqe.server.sessions import Limits, ServerBusyError


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "server.toml"
    path.write_text('[server]\nengine_config = "engine.toml"\n' + body, encoding="utf-8")
    return path


def test_defaults_env_overrides_and_secret_repr(tmp_path: Path) -> None:
    env = {
        "SQE_SERVER_MAX_CONCURRENT_QUERIES": "8",
        "SQE_SERVER_READER_CLIENT_ID": "sqe-engine",
        "SQE_SERVER_READER_CLIENT_SECRET": "s3cr3t-value",
    }
    config = load_server_config(_write(tmp_path, ""), env=env)
    assert config.max_concurrent_queries == 8 and config.delegates
    assert config.engine_config == str(tmp_path / "engine.toml")
    assert "s3cr3t-value" not in repr(config)


def test_errors_name_the_key_and_the_variable(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^server\.max_concurrent_queries \(set by SQE_SERVER_MAX_CONCURRENT_QUERIES\)"
    ):
        load_server_config(_write(tmp_path, ""), env={"SQE_SERVER_MAX_CONCURRENT_QUERIES": "many"})
    with pytest.raises(ConfigError, match=r"^server\.colour: unknown key"):
        load_server_config(_write(tmp_path, 'colour = "blue"\n'), env={})
    with pytest.raises(ConfigError, match="SQE_SERVER_NOPE: unknown key"):
        load_server_config(_write(tmp_path, ""), env={"SQE_SERVER_NOPE": "1"})


def test_plaintext_is_refused_off_loopback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a loopback address"):
        load_server_config(_write(tmp_path, 'listen = "0.0.0.0:8815"\n'), env={})
    assert load_server_config(_write(tmp_path, 'listen = "[::1]:0"\n'), env={}).port == 0


def test_limits_refuse_past_the_user_and_total_bounds() -> None:
    limits = Limits(total=2, per_user=1)
    limits.acquire("a")
    with pytest.raises(ServerBusyError, match="max_concurrent_queries_per_user = 1"):
        limits.acquire("a")
    limits.acquire("b")
    with pytest.raises(ServerBusyError, match="max_concurrent_queries = 2"):
        limits.acquire("c")
    limits.release("a")
    limits.acquire("c")
    assert limits.running() == 2
