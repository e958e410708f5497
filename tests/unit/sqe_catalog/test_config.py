"""Catalog server configuration: strict parsing, one-line errors naming the key, and no secret in any output."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest

from sqe_catalog.api import create_app
from sqe_catalog.config import CatalogServerConfig, ServerConfig, WarehouseConfig, load_config, parse_config
from sqe_catalog.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
SIGNING_KEY = "SIGNING-KEY-7d1e0c"
STATIC_SECRET = "CATALOG-STATIC-SECRET-42f"
SECRETS = (SIGNING_KEY, STATIC_SECRET)

FULL_TOML = f"""
[server]
host = "0.0.0.0"
port = 9191
database = "sqlite:///x.db"
token_signing_key = "{SIGNING_KEY}"
token_lifetime_seconds = 60
log_level = "debug"
request_timeout_seconds = 5

[[warehouses]]
name = "demo"
location = "s3://warehouse/demo"
endpoint = "http://127.0.0.1:9000"
role_arn = "arn:aws:iam::123456789012:role/lakehouse"
credential_lifetime_seconds = 5
access_key_id = "AKIACATALOG"
secret_access_key = "{STATIC_SECRET}"

[[warehouses]]
name = "local"
location = "file:///tmp/local"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return path


def _error(raw: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    return str(info.value)


WAREHOUSE = {"name": "w", "location": "file:///tmp/w"}


class TestParsing:
    def test_full_file_parses_into_typed_values(self, tmp_path: Path) -> None:
        config = load_config(_write(tmp_path, FULL_TOML))
        assert (config.server.host, config.server.port, config.server.token_lifetime_seconds) == ("0.0.0.0", 9191, 60)
        assert config.server.request_timeout_seconds == 5.0 and config.server.log_level == "debug"
        demo = config.warehouse("demo")
        assert demo is not None and demo.bucket == "warehouse" and demo.credential_lifetime_seconds == 5
        assert demo.static_key_pair() == ("AKIACATALOG", STATIC_SECRET)
        assert [w.name for w in config.warehouses] == ["demo", "local"] and config.warehouse("nope") is None

    def test_optional_secret_key_set_and_unset(self) -> None:
        """The old loader failed on the first ``str | None`` field; these are ``SecretStr | None``."""
        set_ = parse_config({"server": {"token_signing_key": SIGNING_KEY}, "warehouses": [WAREHOUSE]})
        assert set_.server.signing_key_bytes() == SIGNING_KEY.encode()
        for server in ({}, {"token_signing_key": ""}):
            unset = parse_config({"server": server, "warehouses": [{**WAREHOUSE, "secret_access_key": ""}]})
            assert unset.server.token_signing_key is None and unset.server.signing_key_bytes() is None
            assert unset.warehouses[0].secret_access_key is None and unset.warehouses[0].static_key_pair() is None

    def test_defaults_and_empty_document(self) -> None:
        config = parse_config({})
        assert config.server == ServerConfig() and config.warehouses == ()
        assert (config.server.host, config.server.port) == ("127.0.0.1", 8181)

    def test_example_file_parses(self) -> None:
        config = load_config(REPO / "catalog.toml.example")
        assert config.warehouses[0].name == "demo" and config.server.signing_key_bytes() is None


class TestErrorsNameTheKey:
    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            ({"serve": {}}, "serve: unknown key"),
            ({"server": {"prot": 1}}, "server.prot: unknown key"),
            ({"warehouses": [{**WAREHOUSE, "locaton": "x"}]}, "warehouses[0].locaton: unknown key"),
            ({"server": {"port": "8181"}}, "server.port: expected an integer, got a string"),
            ({"server": {"port": True}}, "server.port: expected an integer, got a boolean"),
            ({"server": {"request_timeout_seconds": "5"}}, "server.request_timeout_seconds: expected a number"),
            ({"server": []}, "server: expected a table, got a list"),
            ({"warehouses": {"name": "w"}}, "warehouses: expected an array of tables, got a table"),
            ({"warehouses": [WAREHOUSE, {"name": "x"}]}, "warehouses[1].location: required"),
            ({"warehouses": [{**WAREHOUSE, "path_style": "yes"}]}, "warehouses[0].path_style: expected a boolean"),
            ({"server": {"token_lifetime_seconds": 0}}, "server.token_lifetime_seconds: must be positive"),
            ({"server": {"port": 99999}}, "server.port: must be from 0 to 65535"),
            ({"server": {"keep_alive_seconds": 0}}, "server.keep_alive_seconds: must be more than 0"),
            ({"server": {"keep_alive_seconds": 3601}}, "server.keep_alive_seconds: must be more than 0"),
            ({"server": {"port": -1}}, "server.port: must be from 0 to 65535"),
            ({"server": {"secret_hash_scrypt_n": 512}}, "server.secret_hash_scrypt_n: must be a power of two from"),
            ({"server": {"secret_hash_scrypt_n": 3000}}, "server.secret_hash_scrypt_n: must be a power of two from"),
            ({"server": {"secret_hash_scrypt_n": 2**17}}, "server.secret_hash_scrypt_n: must be a power of two from"),
            ({"warehouses": [WAREHOUSE, WAREHOUSE]}, "warehouses[1].name: duplicate warehouse name"),
            ({"warehouses": [{**WAREHOUSE, "location": "/tmp/w"}]}, "warehouses[0].location: must start with"),
            (
                {"warehouses": [{**WAREHOUSE, "credential_lifetime_seconds": 0}]},
                "warehouses[0].credential_lifetime_seconds: must be >= 1",
            ),
            (
                {"warehouses": [{**WAREHOUSE, "metadata_cache_entries": -1}]},
                "warehouses[0].metadata_cache_entries: must be >= 0",
            ),
            (
                {"warehouses": [{**WAREHOUSE, "metadata_recheck_seconds": -1}]},
                "warehouses[0].metadata_recheck_seconds: must be >= 0",
            ),
            (
                {"warehouses": [{"name": "w", "location": "s3://b/w"}]},
                "warehouses[0].role_arn: required unless sts_unavailable = true",
            ),
            (
                {"warehouses": [{**WAREHOUSE, "access_key_id": "AK"}]},
                "warehouses[0].secret_access_key: required when warehouses[0].access_key_id is set",
            ),
            (
                {"warehouses": [{**WAREHOUSE, "secret_access_key": STATIC_SECRET}]},
                "warehouses[0].access_key_id: required when",
            ),
        ],
    )
    def test_one_line_error_naming_the_key(self, raw: dict[str, object], expected: str) -> None:
        message = _error(raw)
        assert message.startswith(expected) and "\n" not in message

    def test_wrong_type_of_a_secret_never_echoes_it(self, tmp_path: Path) -> None:
        path = _write(tmp_path, f'[server]\ntoken_signing_key = ["{SIGNING_KEY}"]\n')
        with pytest.raises(ConfigError) as info:
            load_config(path)
        assert str(info.value) == "server.token_signing_key: expected a string, got a list"

    def test_missing_and_invalid_files(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="config file not found"):
            load_config(tmp_path / "nope.toml")
        with pytest.raises(ConfigError, match="invalid TOML"):
            load_config(_write(tmp_path, "[server\n"))


class TestSecrets:
    def test_no_secret_in_repr_str_or_errors(self, tmp_path: Path) -> None:
        config = load_config(_write(tmp_path, FULL_TOML))
        rendered = [repr(config), str(config), repr(config.server), *(repr(w) for w in config.warehouses)]
        for text in rendered:
            for secret in (*SECRETS, "sqlite:///x.db"):
                assert secret not in text
        assert "AKIACATALOG" in repr(config)  # key ids are not secret

    def test_config_refuses_pickling_but_copies_and_is_frozen(self, tmp_path: Path) -> None:
        config = load_config(_write(tmp_path, FULL_TOML))
        for obj in (config, config.server, config.warehouses[0]):
            with pytest.raises(TypeError, match="cannot be pickled"):
                pickle.dumps(obj)
        assert copy.deepcopy(config) is config and copy.copy(config.server) is config.server
        with pytest.raises(AttributeError):
            config.server.port = 1  # type: ignore[misc]

    def test_direct_construction_is_type_checked(self) -> None:
        with pytest.raises(ValueError):
            WarehouseConfig(name="w", location="file:///w", credential_lifetime_seconds="5")  # type: ignore[arg-type]
        assert CatalogServerConfig(warehouses=(WarehouseConfig(**WAREHOUSE),)).warehouse("w") is not None


@pytest.mark.parametrize("location", ["S3://b/w", "s3a://b/w", "s3n://b/w", "FILE:///w", "gs://b/w", "s3:/b/w", "w"])
def test_a_warehouse_root_is_a_canonical_s3_or_file_uri(location: str) -> None:
    """The catalog compares each table location's scheme with its root's as written, so the root must be spelled
    canonically: Hadoop's aliases and upper-case schemes, which the engine accepts for reads, are refused here."""
    message = _error({"warehouses": [{"name": "w", "location": location, "sts_unavailable": True}]})
    assert message == "warehouses[0].location: must start with s3:// or file://"


def test_an_s3_root_needs_a_role_and_a_file_root_does_not() -> None:
    assert parse_config({"warehouses": [{"name": "w", "location": "file:///w"}]}).warehouses[0].location == "file:///w"
    message = _error({"warehouses": [{"name": "w", "location": "s3://b/w"}]})
    assert message.startswith("warehouses[0].role_arn: required")
    assert parse_config({"warehouses": [{"name": "w", "location": "s3://b/w", "role_arn": "arn"}]}).warehouses


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("s3://lake/prod", "s3://lake/prod/sandbox"),  # nested
        ("s3://lake/prod/sandbox", "s3://lake/prod"),  # around
        ("s3://lake/prod", "s3://lake/prod/"),  # identical
        ("s3://lake", "s3://lake/prod"),  # a bucket root
        ("file:///tmp/w", "file:///tmp/w/x"),
    ],
)
def test_warehouse_roots_must_be_disjoint(first: str, second: str) -> None:
    """A table's location is checked against its own warehouse's tables only, so nested roots would let one
    warehouse's table claim another's files."""
    warehouses = [
        {"name": "prod", "location": first, "sts_unavailable": True},
        {"name": "sandbox", "location": second, "sts_unavailable": True},
    ]
    message = _error({"warehouses": warehouses})
    assert message.startswith("warehouses[1].location: warehouse 'sandbox' (") and "\n" not in message
    assert "overlaps warehouse 'prod' (" in message
    config = CatalogServerConfig(warehouses=tuple(WarehouseConfig(**w) for w in warehouses))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'sandbox'.*overlaps warehouse 'prod'"):
        create_app(config)  # built without parse_config: refused all the same


@pytest.mark.parametrize(
    ("first", "second"),
    [("s3://lake/prod", "s3://lake/prod2"), ("s3://lake/a", "s3://other/a"), ("file:///lake/a", "s3://lake/a")],
)
def test_sibling_warehouse_roots_are_fine(first: str, second: str) -> None:
    warehouses = [
        {"name": "a", "location": first, "sts_unavailable": True},
        {"name": "b", "location": second, "sts_unavailable": True},
    ]
    assert len(parse_config({"warehouses": warehouses}).warehouses) == 2
