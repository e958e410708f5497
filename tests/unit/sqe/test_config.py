"""SQE configuration: TOML parsing, environment overrides, strict validation, and no secret in any repr."""

from __future__ import annotations

import copy
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

from sqe._config_loader import is_section
from sqe.config import (
    CatalogConfig,
    CoordinatorConfig,
    SiblingWarehouseConfig,
    SQEConfig,
    StorageConfig,
    TvfConfig,
    load_config,
)
from sqe.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[3]
SECRETS = (
    "CLIENT-SECRET-9f2",
    "BEARER-TOKEN-77a",
    "STATIC-SECRET-KEY-1c4",
    "STATIC-SESSION-TOKEN-e5d",
    "WORKER-TOKEN-0b8",
    "SIBLING-SECRET-3aa",
)
MINIMAL = {"catalog.uri": "http://127.0.0.1:8181", "catalog.warehouse": "demo"}


def _load(overrides: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> SQEConfig:
    return load_config(env=env or {}, overrides={**MINIMAL, **(overrides or {})})


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def _error(**kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)
    return str(info.value)


FULL_TOML = f"""
[catalog]
uri = "https://catalog.example:8181/api/catalog"
warehouse = "demo"
client_id = "alice"
client_secret = "{SECRETS[0]}"
scope = "PRINCIPAL_ROLE:reader"
access_delegation = "vended-credentials"
require_vended_credentials = false
tvf_prefixes = ["s3://exports/alice"]
credential_max_age_seconds = 600
request_timeout_seconds = 12.5
max_retries = 2
client_capabilities = ""
metadata_cache = false

[[catalog.warehouses]]
name = "sales"

[[catalog.warehouses]]
name = "hr"
uri = "http://127.0.0.1:9999"
client_id = "alice-hr"
client_secret = "{SECRETS[5]}"

[storage]
endpoint = "http://127.0.0.1:9000"
region = "eu-west-1"
path_style = true
access_key_id = "AKIASTATIC"
secret_access_key = "{SECRETS[2]}"
session_token = "{SECRETS[3]}"

[storage.tvf]
allowed_object_store_prefixes = ["s3://lake/raw", "s3a://lake/landing/"]

[coordinator]
workers = ["10.0.0.1:50051", "worker-2:50051"]
token = "{SECRETS[4]}"
tls_ca = "/etc/sqe/ca.pem"
distributed_credentials = "vended"
push_credentials = false
"""


class TestParsing:
    def test_full_file_parses_into_typed_values(self, tmp_path: Path) -> None:
        config = load_config(_write(tmp_path, FULL_TOML), env={})
        catalog, storage, coordinator = config.catalog, config.storage, config.coordinator
        assert catalog.uri == "https://catalog.example:8181/api/catalog"
        assert catalog.access_delegation == "vended-credentials"
        assert catalog.tvf_prefixes == ("s3://exports/alice",)
        assert catalog.request_timeout_seconds == 12.5
        assert (catalog.max_retries, catalog.credential_max_age_seconds) == (2, 600)
        assert catalog.client_capabilities == "" and catalog.metadata_cache is False
        assert [w.name for w in catalog.warehouses] == ["sales", "hr"]
        assert storage == StorageConfig(
            endpoint="http://127.0.0.1:9000",
            region="eu-west-1",
            path_style=True,
            access_key_id="AKIASTATIC",
            secret_access_key=SECRETS[2],
            session_token=SECRETS[3],
            tvf=TvfConfig(allowed_object_store_prefixes=("s3://lake/raw", "s3a://lake/landing/")),
        )
        assert coordinator.workers == ("10.0.0.1:50051", "worker-2:50051")
        assert coordinator.distributed_credentials == "vended" and coordinator.push_credentials is False
        assert config.static_key_pair() == ("AKIASTATIC", SECRETS[2])

    def test_defaults(self) -> None:
        config = _load()
        catalog = config.catalog
        assert catalog.scope == "PRINCIPAL_ROLE:ALL"
        assert catalog.access_delegation == "none"
        assert catalog.require_vended_credentials is False
        assert catalog.credential_max_age_seconds == 900
        assert catalog.request_timeout_seconds == 30.0
        assert catalog.max_retries == 5
        assert catalog.client_capabilities == "read-restrictions.v1"
        assert catalog.metadata_cache is True
        assert config.storage.region is None and config.storage.effective_region == "us-east-1"
        assert config.coordinator == CoordinatorConfig()
        assert config.coordinator.distributed_credentials == "auto" and config.coordinator.push_credentials
        assert config.static_key_pair() is None

    def test_example_file_parses_and_documents_every_key(self) -> None:
        example = REPO_ROOT / "config.toml.example"
        load_config(example, env={})
        text = example.read_text()
        for section, cls in _sections():
            for name, info in cls.model_fields.items():
                if is_section(info.annotation) or name == "warehouses":
                    continue
                assert re.search(rf"^#? ?{name} = ", text, re.MULTILINE), f"{section}.{name} undocumented"
        for header in ("[catalog]", "[[catalog.warehouses]]", "[storage]", "[storage.tvf]", "[coordinator]"):
            assert header in text

    def test_require_vended_implies_vended_credentials(self) -> None:
        config = _load({"catalog.require_vended_credentials": True})
        assert config.catalog.access_delegation == "none"
        assert config.catalog.effective_access_delegation == "vended-credentials"
        assert _load().catalog.effective_access_delegation == "none"

    def test_cache_bounds_default_on_and_zero_turns_a_cache_off(self) -> None:
        assert (_load().cache.data_bytes, _load().cache.manifest_bytes) == (256 << 20, 32 << 20)
        off = _load(env={"SQE_CACHE__DATA_BYTES": "0"})
        assert off.cache.data_bytes == 0 and off.cache.manifest_bytes == 32 << 20
        with pytest.raises(ConfigError, match=r"cache\.manifest_bytes.*must not be negative"):
            _load({"cache.manifest_bytes": -1})

    def test_the_decoded_cache_defaults_on_takes_env_and_refuses_a_negative_bound(self) -> None:
        assert _load().cache.decoded_bytes == 256 << 20
        off = _load(env={"SQE_CACHE__DECODED_BYTES": "0"})
        assert off.cache.decoded_bytes == 0 and off.cache.data_bytes == 256 << 20
        with pytest.raises(ConfigError, match=r"cache\.decoded_bytes.*must not be negative"):
            _load({"cache.decoded_bytes": -1})

    def test_prefetch_is_off_by_default_takes_env_and_toml_and_needs_the_range_cache(self, tmp_path: Path) -> None:
        assert _load().cache.prefetch is False
        assert _load(env={"SQE_CACHE__PREFETCH": "true"}).cache.prefetch is True
        assert _load(env={"SQE_CACHE__PREFETCH": "false"}).cache.prefetch is False
        toml = _write(
            tmp_path, '[catalog]\nuri = "http://127.0.0.1:1/api"\nwarehouse = "w"\n[cache]\nprefetch = true\n'
        )
        assert load_config(toml, env={}).cache.prefetch is True
        with pytest.raises(ConfigError, match=r"cache\.prefetch"):
            _load({"cache.prefetch": "yes"})  # strict: a string is no boolean
        with pytest.raises(ConfigError, match=r"cache\.prefetch"):
            _load(env={"SQE_CACHE__PREFETCH": "maybe"})
        with pytest.raises(ConfigError, match=r"cache\.prefetch.*needs cache\.data_bytes above 0"):
            _load({"cache.prefetch": True, "cache.data_bytes": 0})
        assert _load({"cache.prefetch": True, "cache.decoded_bytes": 0}).cache.prefetch is True

    def test_freed_memory_kept_defaults_to_a_gibibyte_takes_env_and_refuses_a_negative_amount(self) -> None:
        assert _load().memory.keep_freed_bytes == 1 << 30
        assert _load(env={"SQE_MEMORY__KEEP_FREED_BYTES": "0"}).memory.keep_freed_bytes == 0
        with pytest.raises(ConfigError, match=r"memory\.keep_freed_bytes.*must not be negative"):
            _load({"memory.keep_freed_bytes": -1})

    def test_integers_are_accepted_for_float_keys(self) -> None:
        assert _load({"catalog.request_timeout_seconds": 5}).catalog.request_timeout_seconds == 5.0


def _sections() -> list[tuple[str, type]]:
    return [
        ("catalog", CatalogConfig),
        ("catalog.warehouses", SiblingWarehouseConfig),
        ("storage", StorageConfig),
        ("storage.tvf", TvfConfig),
        ("coordinator", CoordinatorConfig),
    ]


class TestRejections:
    @pytest.mark.parametrize("value", ["remote-signing", "Remote-Signing", "vended", ""])
    def test_unsupported_access_delegation_names_the_setting(self, value: str) -> None:
        message = _error(env={}, overrides={**MINIMAL, "catalog.access_delegation": value})
        assert message.startswith("catalog.access_delegation")
        assert '"none" or "vended-credentials"' in message

    def test_remote_signing_says_why(self) -> None:
        message = _error(env={}, overrides={**MINIMAL, "catalog.access_delegation": "remote-signing"})
        assert '"remote-signing" is not supported (SQE does not implement remote signing)' in message

    def test_unknown_key_in_file_names_the_full_key(self, tmp_path: Path) -> None:
        path = _write(tmp_path, '[catalog]\nuri = "http://x"\nwarehouse = "w"\nacces_delegation = "none"\n')
        assert _error(path=path, env={}) == "catalog.acces_delegation: unknown key"

    def test_unknown_nested_and_section_keys(self, tmp_path: Path) -> None:
        base = '[catalog]\nuri = "http://x"\nwarehouse = "w"\n'
        assert _error(path=_write(tmp_path, base + "[storage.tvf]\nprefixes = []\n"), env={}) == (
            "storage.tvf.prefixes: unknown key"
        )
        assert _error(path=_write(tmp_path, base + "[storge]\nregion = 'x'\n"), env={}) == "storge: unknown key"
        text = base + '[[catalog.warehouses]]\nname = "a"\nuri2 = "x"\n'
        assert _error(path=_write(tmp_path, text), env={}) == "catalog.warehouses[0].uri2: unknown key"

    @pytest.mark.parametrize(
        ("key", "value", "expected"),
        [
            (
                "catalog.max_retries",
                "5",
                "catalog.max_retries (set by override 'catalog.max_retries'): expected an integer, got a string",
            ),
            ("catalog.metadata_cache", 1, "expected a boolean (true/false), got an integer"),
            ("catalog.max_retries", True, "expected an integer, got a boolean"),
            ("catalog.tvf_prefixes", "s3://a/b", "expected a list of strings, got a string"),
            ("storage.tvf", [], "storage.tvf (set by override 'storage.tvf'): expected a table, got a list"),
            ("catalog.warehouses", [{"uri": "http://x"}], "catalog.warehouses[0].name"),
        ],
    )
    def test_wrong_types_name_the_key(self, key: str, value: Any, expected: str) -> None:
        message = _error(env={}, overrides={**MINIMAL, key: value})
        assert expected in message
        assert message.startswith(key)

    def test_wrong_type_in_file_never_echoes_the_value(self, tmp_path: Path) -> None:
        text = '[catalog]\nuri = "http://x"\nwarehouse = "w"\nclient_id = "a"\n'
        text += f'client_secret = ["{SECRETS[0]}"]\n'
        message = _error(path=_write(tmp_path, text), env={})
        assert message == "catalog.client_secret: expected a string, got a list"

    def test_required_keys(self) -> None:
        assert _error(env={}) == "catalog.uri: required"
        assert _error(env={}, overrides={"catalog.uri": "http://x"}) == "catalog.warehouse: required"

    @pytest.mark.parametrize(
        ("overrides", "expected"),
        [
            ({"catalog.uri": "ftp://x"}, "catalog.uri (set by override 'catalog.uri'): must be an http"),
            ({"catalog.client_id": "a"}, "catalog.client_secret: required when catalog.client_id is set"),
            ({"catalog.client_secret": SECRETS[0]}, "catalog.client_id: required when"),
            (
                {"catalog.client_id": "a", "catalog.client_secret": SECRETS[0], "catalog.token": SECRETS[1]},
                "catalog.token (set by override 'catalog.token'): set either",
            ),
            ({"catalog.credential_max_age_seconds": 0}, "catalog.credential_max_age_seconds"),
            ({"catalog.request_timeout_seconds": -1}, "catalog.request_timeout_seconds"),
            ({"catalog.max_retries": -1}, "catalog.max_retries"),
            ({"catalog.tvf_prefixes": ["s3://"]}, "catalog.tvf_prefixes[0]"),
            ({"catalog.warehouses": [{"name": "demo"}]}, "catalog.warehouses[0].name"),
            ({"catalog.warehouses": [{"name": "a"}, {"name": "a"}]}, "catalog.warehouses[1].name"),
            ({"catalog.warehouses": [{"name": "a", "uri": "nope"}]}, "catalog.warehouses[0].uri"),
            # found by review: an IPv6 host urlsplit cannot read raised its ValueError out of load_config
            ({"catalog.uri": "http://[::1"}, "catalog.uri (set by override 'catalog.uri'): must be an http://"),
            (
                {"catalog.warehouses": [{"name": "a", "uri": "http://[x]/"}]},
                "catalog.warehouses[0].uri (set by override 'catalog.warehouses'): must",
            ),
            ({"storage.endpoint": "http://[::1"}, "storage.endpoint (set by override 'storage.endpoint'): must be"),
            (
                {"catalog.warehouses": [{"name": "a", "client_id": "x"}]},
                "catalog.warehouses[0].client_secret",
            ),
            ({"storage.endpoint": "127.0.0.1:9000"}, "storage.endpoint"),
            ({"storage.access_key_id": "AK"}, "storage.secret_access_key: required"),
            ({"storage.secret_access_key": SECRETS[2]}, "storage.access_key_id: required"),
            ({"storage.session_token": SECRETS[3]}, "storage.session_token (set by override"),
            (
                {"storage.tvf.allowed_object_store_prefixes": ["/local/dir"]},
                "storage.tvf.allowed_object_store_prefixes[0]",
            ),
            ({"coordinator.workers": ["host"], "coordinator.token": SECRETS[4]}, "coordinator.workers[0]"),
            ({"coordinator.workers": ["host:\u00b2"], "coordinator.token": SECRETS[4]}, "coordinator.workers[0]"),
            (
                {"coordinator.workers": ["host:70000"], "coordinator.token": SECRETS[4]},
                "coordinator.workers[0]",
            ),
            ({"coordinator.workers": ["host:1"]}, "coordinator.token: required"),
            (
                {"coordinator.workers": ["127.0.0.1:1", "10.0.0.1:1"], "coordinator.token": SECRETS[4]},
                "coordinator.workers[1] (set by override 'coordinator.workers'): \"10.0.0.1:1\" is not a loopback "
                "address; workers are reached in plaintext on loopback only (set coordinator.tls_ca)",
            ),
            ({"coordinator.workers": ["[::]:1"], "coordinator.token": SECRETS[4]}, "coordinator.workers[0]"),
            ({"coordinator.workers": ["worker-1:1"], "coordinator.token": SECRETS[4]}, "coordinator.workers[0]"),
            ({"coordinator.distributed_credentials": "everything"}, "coordinator.distributed_credentials"),
            (
                {"coordinator.distributed_credentials": "static", "catalog.require_vended_credentials": True},
                "coordinator.distributed_credentials (set by override "
                "'coordinator.distributed_credentials'): "
                '"static" contradicts catalog.require_vended_credentials',
            ),
        ],
    )
    def test_invalid_values(self, overrides: dict[str, Any], expected: str) -> None:
        message = _error(env={}, overrides={**MINIMAL, **overrides})
        assert message.startswith(expected.split(" ", 1)[0])
        assert expected in message
        for secret in SECRETS:
            assert secret not in message

    def test_a_catalog_uri_with_a_user_name_or_password_is_refused_without_showing_it(self, tmp_path: Path) -> None:
        """Found by review: ``storage.endpoint`` refused userinfo, the catalog's URIs did not, and their password
        went on into the REST client's settings and every repr and log line quoting the URI."""
        path = _write(tmp_path, '[catalog]\nuri = "http://user:hunter22@127.0.0.1:8181/"\nwarehouse = "w"\n')
        message = _error(path=path, env={})
        assert message == (
            "catalog.uri: must not hold a user name or password (set catalog.client_id/client_secret or catalog.token)"
        )
        env = {"SQE_CATALOG__URI": "http://user:hunter22@127.0.0.1:8181/"}
        assert "hunter22" not in _error(env={**env, "SQE_CATALOG__WAREHOUSE": "w"})
        sibling = {"catalog.warehouses": [{"name": "b", "uri": "https://tok3n@catalog.example/"}]}
        message = _error(env={}, overrides={**MINIMAL, **sibling})
        assert message.startswith("catalog.warehouses[0].uri (set by override") and "tok3n" not in message
        endpoint = _error(env={}, overrides={**MINIMAL, "storage.endpoint": "http://k:hunter22@127.0.0.1:9000"})
        assert "storage.endpoint (set by override 'storage.endpoint'): must not hold" in endpoint
        assert "hunter22" not in endpoint

    def test_unknown_key_is_reported_before_the_key_it_misspells(self, tmp_path: Path) -> None:
        path = _write(tmp_path, '[catalog]\nurii = "http://x"\nwarehouse = "w"\n')
        assert _error(path=path, env={}) == "catalog.urii: unknown key"

    def test_empty_string_in_the_file_unsets_an_optional_key(self, tmp_path: Path) -> None:
        text = '[catalog]\nuri = "http://x"\nwarehouse = "w"\ntoken = ""\n[storage]\nendpoint = ""\npath_style = ""\n'
        config = load_config(_write(tmp_path, text), env={})
        assert config.catalog.token is None and config.storage.endpoint is None and config.storage.path_style is None

    def test_direct_construction_is_strict(self) -> None:
        with pytest.raises(ValueError):
            CatalogConfig(uri="http://x", warehouse="w", max_retries="5")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            CatalogConfig(uri="http://x", warehouse="w", unknown=1)  # type: ignore[call-arg]

    def test_missing_and_invalid_files(self, tmp_path: Path) -> None:
        assert "config file not found" in _error(path=tmp_path / "nope.toml", env={})
        assert "invalid TOML" in _error(path=_write(tmp_path, "[catalog\n"), env={})
        assert "is a directory" in _error(path=tmp_path, env={})

    def test_unreadable_files_are_config_errors_naming_the_file(self, tmp_path: Path) -> None:
        """Not UTF-8, a name too long, a NUL in the name: one ConfigError, never a bare OSError or ValueError."""
        binary = tmp_path / "binary.toml"
        binary.write_bytes(b"\xff\xfe[catalog]\n")
        assert _error(path=binary, env={}).startswith(f"{binary}: not UTF-8 text")
        too_long = tmp_path / ("a" * 300)
        assert _error(path=too_long, env={}).startswith(f"cannot read config file {too_long}: ")
        assert "cannot read config file" in _error(path="a\0b.toml", env={})


class TestEnvironment:
    def test_env_overrides_file_values_per_type(self, tmp_path: Path) -> None:
        env = {
            "SQE_CATALOG__ACCESS_DELEGATION": "vended-credentials",
            "SQE_CATALOG__REQUIRE_VENDED_CREDENTIALS": "1",
            "SQE_CATALOG__MAX_RETRIES": "9",
            "SQE_CATALOG__REQUEST_TIMEOUT_SECONDS": "2.5",
            "SQE_CATALOG__METADATA_CACHE": "FALSE",
            "SQE_CATALOG__TVF_PREFIXES": "s3://a/x, s3://b/y",
            "SQE_STORAGE__REGION": "ap-south-1",
            "SQE_STORAGE__PATH_STYLE": "0",
            "SQE_STORAGE__TVF__ALLOWED_OBJECT_STORE_PREFIXES": '["s3://lake/raw"]',
            "SQE_COORDINATOR__WORKERS": "h1:1,h2:2",
            # another catalog: [catalog]'s credentials go there only when the sibling says so
            "SQE_CATALOG__WAREHOUSES": '[{"name": "sales", "uri": "http://127.0.0.1:1", "inherit_credentials": true}]',
        }
        config = load_config(_write(tmp_path, FULL_TOML), env=env)
        catalog = config.catalog
        assert catalog.access_delegation == "vended-credentials" and catalog.require_vended_credentials
        assert (catalog.max_retries, catalog.request_timeout_seconds, catalog.metadata_cache) == (
            9,
            2.5,
            False,
        )
        assert catalog.tvf_prefixes == ("s3://a/x", "s3://b/y")
        assert config.storage.region == "ap-south-1" and config.storage.path_style is False
        assert config.storage.tvf.allowed_object_store_prefixes == ("s3://lake/raw",)
        assert config.coordinator.workers == ("h1:1", "h2:2")
        assert catalog.warehouses == (
            SiblingWarehouseConfig(name="sales", uri="http://127.0.0.1:1", inherit_credentials=True),
        )
        assert catalog.uri == "https://catalog.example:8181/api/catalog"  # untouched keys keep file values

    def test_env_alone_is_enough_and_empty_unsets_optional_keys(self, tmp_path: Path) -> None:
        env = {"SQE_CATALOG__URI": "http://c", "SQE_CATALOG__WAREHOUSE": "w", "SQE_STORAGE__ENDPOINT": ""}
        assert load_config(env=env).storage.endpoint is None
        env["SQE_CATALOG__TVF_PREFIXES"] = ""
        assert load_config(env=env).catalog.tvf_prefixes == ()

    def test_env_remote_signing_names_setting_and_variable(self) -> None:
        message = _error(env={"SQE_CATALOG__ACCESS_DELEGATION": "remote-signing"}, overrides=MINIMAL)
        assert message.startswith("catalog.access_delegation (set by SQE_CATALOG__ACCESS_DELEGATION): ")
        assert "SQE does not implement remote signing" in message

    @pytest.mark.parametrize(
        ("name", "expected"),
        [
            (
                "SQE_CATALOG__ACCES_DELEGATION",
                "SQE_CATALOG__ACCES_DELEGATION: unknown key catalog.acces_delegation",
            ),
            ("SQE_STORGE__REGION", "SQE_STORGE__REGION: unknown key storge.region"),
            ("SQE_STORAGE__TVF__NOPE", "SQE_STORAGE__TVF__NOPE: unknown key storage.tvf.nope"),
            ("SQE_STORAGE__REGION__X", "SQE_STORAGE__REGION__X: unknown key storage.region.x"),
            ("SQE_STORAGE__TVF", "SQE_STORAGE__TVF: storage.tvf is a section"),
        ],
    )
    def test_unknown_variables_are_errors(self, name: str, expected: str) -> None:
        assert _error(env={name: "x"}, overrides=MINIMAL).startswith(expected)

    def test_variables_without_a_key_path_are_ignored(self) -> None:
        assert _load(env={"SQE_CONFIG": "/etc/sqe.toml", "SQE_DEBUG": "1"}).catalog.warehouse == "demo"

    @pytest.mark.parametrize(
        ("name", "value", "expected"),
        [
            (
                "SQE_CATALOG__METADATA_CACHE",
                "yes",
                "catalog.metadata_cache (set by SQE_CATALOG__METADATA_CACHE): expected a boolean",
            ),
            ("SQE_CATALOG__MAX_RETRIES", "five", "catalog.max_retries (set by SQE_CATALOG__MAX_RETRIES)"),
            ("SQE_CATALOG__REQUEST_TIMEOUT_SECONDS", "soon", "catalog.request_timeout_seconds"),
            (
                "SQE_CATALOG__TVF_PREFIXES",
                "[not json",
                "catalog.tvf_prefixes (set by SQE_CATALOG__TVF_PREFIXES)",
            ),
            (
                "SQE_CATALOG__TVF_PREFIXES",
                "[1]",
                "catalog.tvf_prefixes[0] (set by SQE_CATALOG__TVF_PREFIXES)",
            ),
            ("SQE_CATALOG__WAREHOUSES", "sales", "catalog.warehouses (set by SQE_CATALOG__WAREHOUSES)"),
        ],
    )
    def test_unparseable_values_name_key_and_variable(self, name: str, value: str, expected: str) -> None:
        assert _error(env={name: value}, overrides=MINIMAL).startswith(expected)

    def test_secret_env_value_never_echoed(self) -> None:
        env = {"SQE_CATALOG__CLIENT_SECRET": SECRETS[0]}
        message = _error(env=env, overrides=MINIMAL)
        assert message.startswith("catalog.client_id: required") and SECRETS[0] not in message

    def test_unknown_override_section_names_the_override(self) -> None:
        message = _error(env={}, overrides={**MINIMAL, "catalgo.uri": "http://x"})
        assert message == "catalgo (set by override 'catalgo.uri'): unknown key"

    def test_overrides_beat_env_and_accept_sections(self) -> None:
        env = {"SQE_STORAGE__REGION": "eu-west-1", "SQE_CATALOG__MAX_RETRIES": "1"}
        config = load_config(
            env=env,
            overrides={
                "catalog": {"uri": "http://c", "warehouse": "w", "max_retries": 3},
                "storage.region": "us-west-2",
            },
        )
        assert config.storage.region == "us-west-2" and config.catalog.max_retries == 3

    def test_process_environment_is_the_default(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("SQE_STORAGE__REGION", "sa-east-1")
        assert load_config(overrides=MINIMAL).storage.region == "sa-east-1"


class TestWarehouses:
    def test_siblings_inherit_or_use_only_their_own_credentials(self, tmp_path: Path) -> None:
        catalog = load_config(_write(tmp_path, FULL_TOML), env={}).catalog
        assert catalog.warehouse_names == ("demo", "sales", "hr")
        primary, sales, hr = (catalog.connection(n) for n in (None, "sales", "hr"))
        assert (primary.warehouse, primary.client_id, primary.client_secret_value()) == ("demo", "alice", SECRETS[0])
        assert (sales.uri, sales.client_id, sales.client_secret_value()) == (catalog.uri, "alice", SECRETS[0])
        assert (hr.uri, hr.client_id, hr.client_secret_value(), hr.token_value()) == (
            "http://127.0.0.1:9999",
            "alice-hr",
            SECRETS[5],
            None,
        )
        assert hr.scope == catalog.scope

    def test_sibling_with_token_does_not_inherit_client_credentials(self) -> None:
        config = _load(
            {
                "catalog.client_id": "a",
                "catalog.client_secret": SECRETS[0],
                "catalog.warehouses": [{"name": "x", "token": SECRETS[1]}],
            }
        )
        conn = config.catalog.connection("x")
        assert (conn.client_id, conn.client_secret_value(), conn.token_value()) == (None, None, SECRETS[1])

    def test_unknown_warehouse(self) -> None:
        with pytest.raises(ConfigError, match="unknown warehouse 'nope'; configured: demo"):
            _load().catalog.connection("nope")


class TestSecrets:
    def _config(self, tmp_path: Path) -> SQEConfig:
        text = FULL_TOML.replace('client_id = "alice"\n', "").replace(
            f'client_secret = "{SECRETS[0]}"', f'token = "{SECRETS[1]}"', 1
        )
        config = load_config(_write(tmp_path, text), env={})
        assert config.catalog.connection().token_value() == SECRETS[1]
        return config

    def test_no_secret_in_any_repr_or_str(self, tmp_path: Path) -> None:
        for config in (self._config(tmp_path), load_config(_write(tmp_path, FULL_TOML), env={})):
            rendered = [
                repr(config),
                str(config),
                repr(config.catalog.connection()),
                *(repr(config.catalog.connection(w)) for w in config.catalog.warehouse_names),
            ]
            for text in rendered:
                for secret in SECRETS:
                    assert secret not in text
            assert "AKIASTATIC" in repr(config)  # key ids are not secret; the repr is still useful

    def test_config_refuses_pickling_but_copies(self, tmp_path: Path) -> None:
        config = self._config(tmp_path)
        for obj in (config, config.catalog, config.storage, config.coordinator, config.catalog.connection()):
            with pytest.raises(TypeError, match="cannot be pickled"):
                pickle.dumps(obj)
        assert copy.deepcopy(config) is config and copy.copy(config.storage) is config.storage

    def test_secrets_are_masked_and_revealed_only_by_accessors(self, tmp_path: Path) -> None:
        config = load_config(_write(tmp_path, FULL_TOML), env={})
        storage, coordinator = config.storage, config.coordinator
        assert "**********" in repr(storage.secret_access_key) and SECRETS[2] not in str(storage.secret_access_key)
        assert storage.session_token_value() == SECRETS[3] and coordinator.token_value() == SECRETS[4]
        assert config.catalog.connection("hr").client_secret_value() == SECRETS[5]
        assert _load().storage.session_token_value() is None and _load().coordinator.token_value() is None

    def test_every_section_refuses_pickling(self, tmp_path: Path) -> None:
        config = load_config(_write(tmp_path, FULL_TOML), env={})
        for obj in (config.catalog.warehouses[1], config.storage.tvf, config.catalog.connection("hr")):
            with pytest.raises(TypeError, match="cannot be pickled"):
                pickle.dumps(obj)

    def test_configs_are_frozen(self) -> None:
        config = _load()
        with pytest.raises(AttributeError):
            config.catalog.uri = "http://elsewhere"  # type: ignore[misc]


def test_metadata_revalidate_seconds_defaults_to_strict_and_refuses_negative() -> None:
    """issue 11 item 4: 0 (every lookup revalidates) unless asked; a negative interval is a start-up error."""
    assert _load().catalog.metadata_revalidate_seconds == 0
    assert _load({"catalog.metadata_revalidate_seconds": 2.5}).catalog.metadata_revalidate_seconds == 2.5
    message = _error(env={}, overrides={**MINIMAL, "catalog.metadata_revalidate_seconds": -1})
    assert message.startswith("catalog.metadata_revalidate_seconds") and "must not be negative" in message


@pytest.mark.parametrize("key", ["storage.tvf.allowed_object_store_prefixes", "catalog.tvf_prefixes"])
def test_object_store_prefixes_follow_the_one_scheme_rule(key: str) -> None:
    """A prefix is an object-store one when ``sqe.locations.is_object_store`` says so: scheme case and Hadoop's
    aliases do not matter (until this rule was shared, ``S3://`` was refused here but matched like ``s3://`` by the
    file table functions); another scheme, a missing scheme or a missing bucket is refused."""
    from sqe.execution.tvf import TvfPolicy

    config = _load({key: ["S3://lake/raw", "S3A://lake/landing/", "s3n://lake/old"]})
    policy = TvfPolicy.from_config(config)
    for path in ("s3://lake/raw/a.parquet", "s3a://lake/landing/b.csv", "S3N://lake/old/c.json"):
        policy.check_file("read_parquet", path)
    for bad in ("gs://lake/raw", "S3:///raw", "s3:/lake/raw", "file:///lake", "lake/raw"):
        message = _error(env={}, overrides={**MINIMAL, key: [bad]})
        assert message.startswith(f"{key}[0] (set by override") and "must be an object-store prefix" in message


def test_plaintext_workers_on_loopback_and_tls_workers_anywhere_are_accepted() -> None:
    loopback = ("127.0.0.1:1", "localhost:2", "[::1]:3")
    plain = _load({"coordinator.workers": list(loopback), "coordinator.token": SECRETS[4]})
    assert plain.coordinator.workers == loopback and plain.coordinator.tls_ca is None
    remote = ("10.0.0.1:1", "worker-2:2", "[2001:db8::1]:3")
    tls = _load({"coordinator.workers": list(remote), "coordinator.token": SECRETS[4], "coordinator.tls_ca": "/ca"})
    assert tls.coordinator.workers == remote
