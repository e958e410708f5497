"""The ``[server]`` model: strict types, env overrides named in errors, loopback-only plaintext, no secret shown."""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import pytest

from sqe.duckdb_connection import DatabaseLimits, spill_disk_free_bytes
from sqe.errors import ConfigError
from sqe.server.config import ServerConfig, load_server_config
from sqe.server.sessions import Limits, ServerBusyError, engine_limits


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
    # Found by review: the refusal said "1 queries of this user are running".
    with pytest.raises(ServerBusyError, match=r"1 query of this user is running \(max_concurrent_queries_per_user = 1"):
        limits.acquire("a")
    limits.acquire("b")
    with pytest.raises(ServerBusyError, match=r"2 queries are running \(max_concurrent_queries = 2"):
        limits.acquire("c")
    limits.release("a")
    limits.acquire("c")
    assert limits.running() == 2


SECRET = "READER-SECRET-5e9a"


def _error(tmp_path: Path, body: str = "", env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_server_config(_write(tmp_path, body), env=env or {})
    message = str(info.value)
    assert "\n" not in message and SECRET not in message
    return message


def test_the_documented_variables_override_the_file(tmp_path: Path) -> None:
    body = 'reader_client_id = "file-id"\nreader_client_secret = "file-secret"\nbatch_rows = 10\n'
    env = {"SQE_SERVER_READER_CLIENT_SECRET": SECRET, "SQE_SERVER_QUERY_TIMEOUT_SECONDS": "2.5"}
    config = load_server_config(_write(tmp_path, body), env=env)
    assert config.reader_client_id == "file-id" and config.reader_client_secret_value() == SECRET
    assert (config.query_timeout_seconds, config.batch_rows) == (2.5, 10)
    assert SECRET not in repr(config) and SECRET not in str(config)


def test_variables_of_other_loaders_are_left_alone(tmp_path: Path) -> None:
    env = {"SQE_SERVER__BATCH_ROWS": "x", "SQE_CATALOG__URI": "x", "SQE_CONFIG": "x", "SQE_SERVERS": "x"}
    assert load_server_config(_write(tmp_path, ""), env=env).batch_rows == 65_536


@pytest.mark.parametrize(
    ("body", "env", "expected"),
    [
        ('colour = "blue"\n', {}, "server.colour: unknown key"),
        ("", {"SQE_SERVER_COLOUR": "blue"}, "SQE_SERVER_COLOUR: unknown key server.colour"),
        ('batch_rows = "10"\n', {}, "server.batch_rows: expected an integer, got a string"),
        (
            "",
            {"SQE_SERVER_QUERY_TIMEOUT_SECONDS": "soon"},
            "server.query_timeout_seconds (set by SQE_SERVER_QUERY_TIMEOUT_SECONDS): expected a number",
        ),
        (
            "",
            {"SQE_SERVER_BATCH_ROWS": "0"},
            "server.batch_rows (set by SQE_SERVER_BATCH_ROWS): Input should be greater than or equal to 1",
        ),
        (f'reader_client_secret = ["{SECRET}"]\n', {}, "server.reader_client_secret: expected a string, got a list"),
        (
            "",
            {"SQE_SERVER_READER_CLIENT_SECRET": SECRET},
            "server.reader_client_secret (set by SQE_SERVER_READER_CLIENT_SECRET): "
            "reader_client_id and reader_client_secret must be set together",
        ),
        ('tls_cert = "c.pem"\n', {}, "server.tls_cert: tls_cert and tls_key must be set together"),
        (
            "max_concurrent_queries_per_user = 5\n",
            {"SQE_SERVER_MAX_CONCURRENT_QUERIES": "4"},
            "server.max_concurrent_queries_per_user: must not exceed server.max_concurrent_queries (4)",
        ),
        ('listen = "8815"\n', {}, 'server.listen: must be "host:port", got "8815"'),
        ('listen = "127.0.0.1:\u00b2"\n', {}, 'server.listen: must be "host:port", got "127.0.0.1:\\u00b2"'),
        (
            "",
            {"SQE_SERVER_LISTEN": "0.0.0.0:8815"},
            'server.listen (set by SQE_SERVER_LISTEN): "0.0.0.0:8815" is not a loopback address',
        ),
        ("[catalog]\n", {}, "catalog: unknown section in server.toml (engine settings go in server.engine_config)"),
        ("engine_memory_bytes = 1024\n", {}, "server.engine_memory_bytes: must be at least 16777216 (16 MiB)"),
        (
            "",
            {"SQE_SERVER_ENGINE_THREADS": "0"},
            "server.engine_threads (set by SQE_SERVER_ENGINE_THREADS): must be at least 1 and at most 1024",
        ),
        ("engine_spill_bytes = -1\n", {}, "server.engine_spill_bytes: must not be negative"),
    ],
)
def test_one_line_errors_name_the_key_and_the_variable(
    tmp_path: Path, body: str, env: dict[str, str], expected: str
) -> None:
    assert _error(tmp_path, body, env).startswith(expected)


def test_file_errors(tmp_path: Path) -> None:
    (tmp_path / "empty.toml").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^server\.engine_config: required$"):
        load_server_config(tmp_path / "empty.toml", env={})
    with pytest.raises(ConfigError, match="config file not found"):
        load_server_config(tmp_path / "nope.toml", env={})
    (tmp_path / "bad.toml").write_text("[server\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_server_config(tmp_path / "bad.toml", env={})
    (tmp_path / "list.toml").write_text('server = "x"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^server: expected a table, got a string$"):
        load_server_config(tmp_path / "list.toml", env={})


def test_engine_config_is_relative_to_the_server_file_also_from_the_environment(tmp_path: Path) -> None:
    path = _write(tmp_path, "")
    assert load_server_config(path, env={"SQE_SERVER_ENGINE_CONFIG": "sub/e.toml"}).engine_config == str(
        tmp_path / "sub" / "e.toml"
    )
    absolute = str(tmp_path / "elsewhere.toml")
    assert load_server_config(path, env={"SQE_SERVER_ENGINE_CONFIG": absolute}).engine_config == absolute


def test_an_empty_string_unsets_an_optional_key(tmp_path: Path) -> None:
    """As in the engine's and the catalog's files (``Unset``): until the shared loader, ``tls_cert = ""`` meant
    TLS with a certificate at path ""."""
    config = load_server_config(
        _write(tmp_path, 'tls_cert = ""\ntls_key = ""\n'), env={"SQE_SERVER_READER_CLIENT_ID": ""}
    )
    assert (config.tls_cert, config.tls_key, config.tls, config.delegates) == (None, None, False, False)


def test_the_config_is_frozen_unpicklable_and_strict(tmp_path: Path) -> None:
    env = {"SQE_SERVER_READER_CLIENT_ID": "r", "SQE_SERVER_READER_CLIENT_SECRET": SECRET}
    config = load_server_config(_write(tmp_path, ""), env=env)
    with pytest.raises(AttributeError):
        config.listen = "127.0.0.1:1"  # type: ignore[misc]
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(config)
    assert copy.deepcopy(config) is config
    with pytest.raises(ValueError):
        ServerConfig(engine_config="e.toml", batch_rows="10")  # type: ignore[arg-type]


def test_the_example_documents_every_server_key() -> None:
    text = (Path(__file__).resolve().parents[4] / "config.toml.example").read_text(encoding="utf-8")
    section = text[text.index("# [server]\n") :]
    for name in ServerConfig.model_fields:
        assert f"\n# {name} = " in section, f"server.{name} undocumented"


def test_each_engine_takes_its_share_of_the_machine_unless_the_limits_are_set(tmp_path: Path) -> None:
    """Found by review: every user engine kept DuckDB's defaults (80% of the memory, every core, 90% of the free
    disk), so one user's query could take all of the server's. Unset, the running engines together get half of
    the memory and half of the spill disk's free space."""
    shared = load_server_config(_write(tmp_path, "max_concurrent_queries = 8\n"), env={})
    limits = engine_limits(shared)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 16 << 20 <= limits.memory_bytes <= max(16 << 20, physical // 2 // 8)
    assert 1 <= limits.threads <= min(4, os.cpu_count() or 1)
    free = spill_disk_free_bytes()
    assert 0 < limits.spill_bytes <= free // 2 // 8 * 1.01
    body = "engine_memory_bytes = 33554432\nengine_threads = 3\nengine_spill_bytes = 0\n"
    assert engine_limits(load_server_config(_write(tmp_path, body), env={})) == DatabaseLimits(32 << 20, 3, 0)


def _group(root: Path, path: str, file: str, value: str) -> None:
    (root / path).mkdir(parents=True, exist_ok=True)
    (root / path / file).write_text(value + "\n", encoding="ascii")


def test_a_memory_limit_of_the_processs_own_control_group_or_its_parents_counts(tmp_path: Path) -> None:
    """Found by review: only the hierarchy's root was read (``/sys/fs/cgroup/memory.max``), which is the process's
    own group only in a container with its own cgroup namespace. A server run as a systemd unit with
    ``MemoryMax=2G`` on a big machine (its group ``/system.slice/sqe.service``) got engines sized for the whole
    machine's memory, together far past its limit. Real files laid out as cgroup v2 and v1 mount them."""
    from sqe._machine import cgroup_memory_limit

    v2 = tmp_path / "v2"
    _group(v2, "", "cgroup.controllers", "memory")  # the root group has no memory.max
    _group(v2, "system.slice", "memory.max", "max")
    _group(v2, "system.slice/sqe.service", "memory.max", str(2 << 30))
    assert cgroup_memory_limit("0::/system.slice/sqe.service\n", v2) == 2 << 30
    _group(v2, "system.slice", "memory.max", str(1 << 30))  # a parent's lower limit holds its children too
    assert cgroup_memory_limit("0::/system.slice/sqe.service\n", v2) == 1 << 30
    assert cgroup_memory_limit("0::/user.slice\n", v2) is None, "no group on the way limits it"

    v1 = tmp_path / "v1"
    unlimited = "9223372036854771712"
    _group(v1 / "memory", "", "memory.limit_in_bytes", unlimited)
    _group(v1 / "memory", "docker/abc", "memory.limit_in_bytes", str(512 << 20))
    membership = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n"
    assert cgroup_memory_limit(membership, v1) == 512 << 20
    assert cgroup_memory_limit("4:memory:/\n", v1) == int(unlimited)

    # a group outside the process's namespace (shown as /../..) never leads outside the mount
    _group(tmp_path, "escape", "memory.max", "1")
    assert cgroup_memory_limit("0::/../escape\n", v2) is None
    _group(v2, "bad", "memory.max", "lots")  # unreadable as a number: passed over
    assert cgroup_memory_limit("0::/bad\n", v2) is None
    assert cgroup_memory_limit("", tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("engine_threads = 100000\n", "server.engine_threads: must be at least 1 and at most 1024"),
        ("engine_threads = 9223372036854775807\n", "server.engine_threads: must be at least 1 and at most 1024"),
        ("engine_memory_bytes = 18446744073709551621\n", "server.engine_memory_bytes: must be at most"),
        ("engine_spill_bytes = 18446744073709551621\n", "server.engine_spill_bytes: must be at most"),
    ],
)
def test_engine_limits_duckdb_cannot_open_a_database_with_stop_the_start(
    tmp_path: Path, body: str, expected: str
) -> None:
    """Found by review: the keys had no upper bound, and DuckDB fails at each engine's opening, long after the
    start: 100000 threads hung every user's first query, 2**63 - 1 aborted the whole server process (C++'s
    length_error), and a byte count past 64 bits failed every engine with a parse error."""
    assert _error(tmp_path, body, {}).startswith(expected)


def test_the_largest_engine_limits_allowed_still_open_a_working_database() -> None:
    from sqe.duckdb_connection import connect_locked_down
    from sqe.server.config import MAX_ENGINE_BYTES, MAX_ENGINE_THREADS

    con = connect_locked_down(DatabaseLimits(MAX_ENGINE_BYTES, MAX_ENGINE_THREADS, MAX_ENGINE_BYTES).apply)
    try:
        assert con.execute("SELECT sum(x) FROM range(100000) t(x)").fetchone() == (4999950000,)
        assert con.execute("SELECT current_setting('threads')").fetchone() == (MAX_ENGINE_THREADS,)
    finally:
        con.close()
