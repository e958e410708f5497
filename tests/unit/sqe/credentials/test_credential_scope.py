"""Per-file FileIO properties: parsing, selection, merge order, allowlist, static/vended never mixing."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from sqe.config import SQEConfig, load_config
from sqe.credentials import (
    FILEIO_ALLOWLIST,
    CredentialSet,
    ResolvedCredentials,
    StoragePolicy,
    build_properties,
    parse_catalog_credentials,
    parse_storage_credentials,
    parse_string_map,
    select_credential,
    vended_sets,
)
from sqe.credentials.model import has_key_pair
from sqe.distributed.coordinator.credentials import ticket_sets
from sqe.errors import CatalogProtocolError, NoVendedCredentialsError

STATIC_KEY, STATIC_SECRET, STATIC_TOKEN = "AKIASTATIC", "static-secret-4b1", "static-token-8c2"
V1_SECRET, V1_TOKEN = "vended-secret-t1-aa", "vended-token-t1-bb"
V2_SECRET, V2_TOKEN = "vended-secret-t10-cc", "vended-token-t10-dd"
CFG_SECRET = "vended-secret-config-ee"
SECRETS = (STATIC_SECRET, STATIC_TOKEN, V1_SECRET, V1_TOKEN, V2_SECRET, V2_TOKEN, CFG_SECRET)
EXPIRES_MS = "1700003600000"


def _config(**overrides: Any) -> SQEConfig:
    base = {"catalog.uri": "http://127.0.0.1:8181", "catalog.warehouse": "demo"}
    return load_config(env={}, overrides={**base, **overrides})


def _static_config(**overrides: Any) -> SQEConfig:
    return _config(
        **{
            "storage.access_key_id": STATIC_KEY,
            "storage.secret_access_key": STATIC_SECRET,
            "storage.session_token": STATIC_TOKEN,
            **overrides,
        }
    )


def _keys(key: str, secret: str, token: str | None = None, expires: str | None = None) -> dict[str, str]:
    keys = {"s3.access-key-id": key, "s3.secret-access-key": secret}
    if token:
        keys["s3.session-token"] = token
    if expires:
        keys["s3.session-token-expires-at-ms"] = expires
    return keys


Entry = dict[str, Any]  # one raw storage-credentials entry


def _cred(prefix: str, **config: str) -> Entry:
    return {"prefix": prefix, "config": config}


def _parsed(config: dict[str, str], creds: list[Entry]) -> Any:
    return parse_catalog_credentials({"config": config, "storage-credentials": creds})


def _sets(*creds: Entry) -> tuple[CredentialSet, ...]:
    return _parsed({}, list(creds)).sets


def _prefix_of(path: str, *creds: Entry) -> str | None:
    found = select_credential(path, _sets(*creds))
    return None if found is None else found.prefix


def _resolve(path: str, config: dict[str, str], creds: list[Entry], sqe: SQEConfig) -> ResolvedCredentials:
    """Parse once, then resolve one path under the policy built from ``sqe``."""
    return build_properties(path, _parsed(config, creds), StoragePolicy.from_config(sqe))


def _vended(config: dict[str, str], creds: list[Entry], sqe: SQEConfig) -> tuple[CredentialSet, ...]:
    return vended_sets(_parsed(config, creds), StoragePolicy.from_config(sqe))


T1 = _cred("s3://b/t1", **_keys("V1", V1_SECRET, V1_TOKEN, EXPIRES_MS))
T10 = _cred("s3://b/t10/", **_keys("V2", V2_SECRET, V2_TOKEN))


def _props(path: str, config: dict[str, str], creds: list[Entry], sqe: SQEConfig) -> dict[str, str]:
    return dict(_resolve(path, config, creds, sqe).properties)


class TestParsing:
    def test_parses_entries_and_config(self) -> None:
        creds = parse_storage_credentials(
            [
                {"prefix": "s3://b/t1", "config": _keys("V1", V1_SECRET)},
                {"prefix": "s3://b", "config": {}},
            ]
        )
        assert [prefix for prefix, _ in creds] == ["s3://b/t1", "s3://b"]
        assert creds[0][1]["s3.secret-access-key"] == V1_SECRET
        assert parse_storage_credentials(None) == () and parse_string_map(None, "config") == {}
        assert parse_string_map({"s3.region": "x"}, "config") == {"s3.region": "x"}

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            ({"prefix": "s3://b"}, "storage-credentials must be a list"),
            (["s3://b"], "storage-credentials[0] must be an object"),
            (
                [{"config": _keys("V1", V1_SECRET)}],
                "storage-credentials[0].prefix must be a non-empty string",
            ),
            ([{"prefix": "", "config": {}}], "storage-credentials[0].prefix must be a non-empty string"),
            ([{"prefix": 7, "config": {}}], "storage-credentials[0].prefix must be a non-empty string"),
            (
                [{"prefix": "s3://b", "config": [V1_SECRET]}],
                "storage-credentials[0].config must be an object",
            ),
            ([{"prefix": "s3://b"}], "storage-credentials[0].config must be an object"),
            (
                [{"prefix": "s3://a", "config": {}}, {"prefix": "s3://b", "config": {"s3.session-token": 1}}],
                "storage-credentials[1].config must map strings to strings",
            ),
        ],
    )
    def test_malformed_entries_name_the_problem_not_the_values(self, raw: Any, expected: str) -> None:
        with pytest.raises(CatalogProtocolError) as info:
            parse_storage_credentials(raw)
        assert expected in str(info.value)
        assert V1_SECRET not in str(info.value)

    def test_malformed_config(self) -> None:
        with pytest.raises(CatalogProtocolError, match="config must be an object"):
            parse_string_map(["x"], "config")
        with pytest.raises(CatalogProtocolError, match="config must map strings to strings"):
            parse_string_map({"s3.request-timeout": 5}, "config")

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("s3.session-token-expires-at-ms", "soon"),
            ("s3.force-virtual-addressing", "maybe"),
            ("s3.path-style-access", "yes please"),
            ("s3.connect-timeout", "fast"),
            ("s3.request-timeout", "-3"),
        ],
    )
    def test_malformed_values_fail_closed(self, key: str, value: str) -> None:
        cred = _cred("s3://b/t1", **_keys("V1", V1_SECRET, V1_TOKEN), **{key: value})
        # parsed once, strictly: the response fails before any path is resolved
        for call in (
            lambda: _resolve("s3://b/t1/x", {}, [cred], _config()),
            lambda: _vended({}, [cred], _config()),
            lambda: _sets(cred),
        ):
            with pytest.raises(CatalogProtocolError) as info:
                call()
            message = str(info.value)
            assert key in message and "'s3://b/t1'" in message and value not in message
            assert V1_SECRET not in message and V1_TOKEN not in message

    def test_credential_set_repr_hides_keys_and_refuses_pickle(self) -> None:
        (t1,) = _sets(T1)
        assert V1_SECRET not in repr(t1) and V1_TOKEN not in repr(t1) and "s3://b/t1" in repr(t1)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(t1)


class TestSelection:
    def test_longest_prefix_on_segment_boundary(self) -> None:
        bucket = _cred("s3://b", **_keys("VB", "bucket-secret"))
        creds = [bucket, T1, T10]
        assert _prefix_of("s3://b/t1/data/x.parquet", *creds) == "s3://b/t1"
        assert _prefix_of("s3://b/t10/data/x.parquet", *creds) == "s3://b/t10/"
        assert _prefix_of("s3://b/t100/x.parquet", *creds) == "s3://b"
        assert _prefix_of("s3://other/t1/x", *creds) is None

    def test_scheme_aliases_match(self) -> None:
        creds = [_cred("s3a://b/t1/", **_keys("V1", V1_SECRET))]
        assert _prefix_of("s3://b/t1/x", *creds) == "s3a://b/t1/"
        assert _prefix_of("s3n://b/t1/x", T1) == "s3://b/t1"

    @pytest.mark.parametrize(
        "config",
        [
            {},  # keyless
            {"s3.endpoint": "http://127.0.0.1:1"},  # endpoint-only
            {"s3.access-key-id": "VX"},  # no secret
            {"s3.access-key-id": "", "s3.secret-access-key": ""},
            {"fs.s3a.access.key": "VX", "fs.s3a.secret.key": "x"},  # Hadoop-style
            {"gcs.oauth2.token": "x"},
            {"adls.sas-token.account": "x"},
            {"client.access-key-id": "VX", "client.secret-access-key": "x"},
        ],
    )
    def test_unusable_entries_never_shadow_a_usable_one(self, config: dict[str, str]) -> None:
        shadow = _cred("s3://b/t1/data", **config)
        assert not has_key_pair(shadow["config"])
        assert _prefix_of("s3://b/t1/data/x.parquet", T1, shadow) == "s3://b/t1"
        assert _prefix_of("s3://b/t1/data/x.parquet", shadow) is None

    def test_token_is_optional_for_usability(self) -> None:
        assert len(_sets(_cred("s3://b", **_keys("K", "S")))) == 1  # R2/MinIO vend static keys without a token

    def test_equal_prefixes_with_different_keys_are_a_protocol_error(self) -> None:
        # Which one the catalog meant is unknowable; picking one would read with keys it may not have meant.
        a = _cred("s3://b/t1", **_keys("VA", "a-secret", "a-token"))
        b = _cred("s3a://b/t1/", **_keys("VB", "b-secret", "b-token"))
        with pytest.raises(CatalogProtocolError, match=r"storage-credentials\[1\].*same prefix") as raised:
            _sets(a, b)
        assert not any(secret in str(raised.value) for secret in ("a-secret", "b-secret", "a-token", "b-token"))
        same_key_new_token = _cred("s3://b/t1/", **_keys("VA", "a-secret", "other-token"))
        with pytest.raises(CatalogProtocolError):
            _sets(a, same_key_new_token)

    def test_equal_prefixes_with_the_same_keys_are_one_set(self) -> None:
        a = _cred("s3://b/t1", **_keys("VA", "a-secret", "a-token", EXPIRES_MS))
        again = _cred("s3a://b/t1/", **_keys("VA", "a-secret", "a-token", EXPIRES_MS))
        assert select_credential("s3://b/t1/x", _sets(a, again)) == _sets(a)[0]


class TestMergeOrder:
    def test_step1_response_config_alone(self) -> None:
        config = {
            "s3.endpoint": "http://catalog-store:9000",
            "s3.region": "eu-west-1",
            "s3.path-style-access": "true",
            **_keys("VC", CFG_SECRET, "cfg-token"),
        }
        resolved = _resolve("s3://b/t1/x", config, [], _config())
        assert dict(resolved.properties) == {
            "s3.endpoint": "http://catalog-store:9000",
            "s3.region": "eu-west-1",
            "s3.force-virtual-addressing": "false",
            **_keys("VC", CFG_SECRET, "cfg-token"),
        }
        assert (resolved.source, resolved.prefix) == ("vended", None)

    def test_step2_matched_credential_overrides_config(self) -> None:
        config = {"s3.endpoint": "http://config:1", "s3.region": "eu-west-1", **_keys("VC", CFG_SECRET)}
        cred = _cred(
            "s3://b/t1",
            **{
                "s3.endpoint": "http://cred:2",
                "client.region": "ap-south-1",
                "s3.force-virtual-addressing": "TRUE",
                **_keys("V1", V1_SECRET, V1_TOKEN),
            },
        )
        props = _props("s3://b/t1/x", config, [cred], _config())
        assert props["s3.endpoint"] == "http://cred:2"
        assert props["s3.region"] == "ap-south-1"  # the entry's region (client.region alias) is more specific
        assert props["s3.force-virtual-addressing"] == "true"
        assert props["s3.access-key-id"] == "V1" and props["s3.session-token"] == V1_TOKEN

    def test_s3_region_beats_client_region_alias_in_one_map(self) -> None:
        config = {"client.region": "ap-south-1", "s3.region": "eu-west-1"}
        assert _props("s3://b/x", config, [], _config())["s3.region"] == "eu-west-1"

    def test_no_match_leaves_config_alone(self) -> None:
        config = {"s3.endpoint": "http://config:1", **_keys("VC", CFG_SECRET)}
        resolved = _resolve("s3://b/t2/x", config, [T1], _config())
        assert resolved.properties["s3.access-key-id"] == "VC" and resolved.source == "vended"
        assert resolved.properties["s3.endpoint"] == "http://config:1"

    def test_vended_set_is_taken_whole_from_one_source(self) -> None:
        # The matched entry has no token: the config's token must not be combined with the entry's key.
        config = _keys("VC", CFG_SECRET, "cfg-token", EXPIRES_MS)
        cred = _cred("s3://b/t1", **_keys("V1", V1_SECRET))
        resolved = _resolve("s3://b/t1/x", config, [cred], _config())
        assert "s3.session-token" not in resolved.properties
        assert resolved.expires_at_ms is None and resolved.prefix == "s3://b/t1"

    @pytest.mark.parametrize("static", [False, True])
    def test_one_credential_sent_in_config_and_storage_credentials_stays_vended_and_whole(self, static: bool) -> None:
        # A stage-create answer (and every Polaris answer) carries its one credential in both places: the same
        # keys twice, neither mixed with SQE's static pair nor dropped as a conflict.
        config = {"s3.endpoint": "http://config:1", **T1["config"]}
        resolved = _resolve("s3://b/t1/x", config, [T1], _static_config() if static else _config())
        assert (resolved.source, resolved.prefix, resolved.expires_at_ms) == ("vended", "s3://b/t1", int(EXPIRES_MS))
        credential = {k: v for k, v in resolved.properties.items() if k in _keys("k", "s", "t")}
        assert credential == _keys("V1", V1_SECRET, V1_TOKEN)
        policy = StoragePolicy.from_config(_config())
        tickets = ticket_sets(_parsed(config, [T1]).sets, "s3://b/t1", policy, 0.0, "load-table")
        # Both travel (as locally, config's keys serve what the entry does not cover): same keys, two prefixes.
        assert [c.prefix for c in tickets.credentials] == ["s3://", "s3://b/t1"] and not tickets.dropped
        assert {c.access_key_id for c in tickets.credentials} == {"V1"}

    def test_step3_sqe_settings_win(self) -> None:
        config = {"s3.endpoint": "http://config:1", "s3.region": "eu-west-1", "s3.path-style-access": "false"}
        cred = _cred("s3://b/t1", **{"s3.endpoint": "http://cred:2", **_keys("V1", V1_SECRET)})
        sqe = _config(
            **{
                "storage.endpoint": "http://127.0.0.1:9000",
                "storage.region": "us-west-2",
                "storage.path_style": True,
            }
        )
        props = _props("s3://b/t1/x", config, [cred], sqe)
        assert props["s3.endpoint"] == "http://127.0.0.1:9000"
        assert props["s3.region"] == "us-west-2"
        assert props["s3.force-virtual-addressing"] == "false"

    def test_step3_region_is_always_set(self) -> None:
        assert _props("s3://b/t1/x", {}, [], _config())["s3.region"] == "us-east-1"
        assert _props("file:///tmp/x", {}, [], _config())["s3.region"] == "us-east-1"
        assert _props("s3://b/t1/x", {"client.region": "eu-north-1"}, [], _config())["s3.region"] == "eu-north-1"

    def test_step3_static_pair_in_static_mode(self) -> None:
        resolved = _resolve("s3://b/t2/x", {}, [T1], _static_config())
        assert dict(resolved.properties) == {
            "s3.region": "us-east-1",
            **_keys(STATIC_KEY, STATIC_SECRET, STATIC_TOKEN),
        }
        assert (resolved.source, resolved.expires_at_ms) == ("static", None)

    @pytest.mark.parametrize("static", [True, False])
    def test_sqe_own_key_never_goes_to_a_catalog_named_endpoint(self, static: bool) -> None:
        # No [storage] endpoint (AWS): a catalog's s3.endpoint (config or an entry's) must not receive requests
        # signed with the [storage] pair, nor with the SDK's own chain when SQE has no pair.
        config = {"s3.endpoint": "http://catalog-chosen:1", "s3.region": "eu-west-1"}
        entry = _cred("s3://b/t2", **{"s3.endpoint": "http://entry-chosen:2", **_keys(STATIC_KEY, STATIC_SECRET)})
        sqe = _static_config() if static else _config()
        paths = ["s3://b/t3/x", "s3://b/t2/x"] if static else ["s3://b/t3/x"]  # no entry; one holding SQE's pair
        for path in paths:
            resolved = _resolve(path, config, [T1, entry], sqe)
            assert resolved.source == ("static" if static else "none")
            assert "s3.endpoint" not in resolved.properties and resolved.settings.endpoint is None
            assert resolved.properties["s3.region"] == "eu-west-1"  # where the bucket is: harmless to take
        # The catalog's own keys still go where the catalog says.
        assert _props("s3://b/t1/x", config, [T1], sqe)["s3.endpoint"] == "http://catalog-chosen:1"

    def test_step4_vended_keys_on_top_and_static_token_removed(self) -> None:
        cred = _cred("s3://b/t1", **_keys("V1", V1_SECRET))  # no session token (R2/MinIO style)
        resolved = _resolve("s3://b/t1/x", {}, [cred], _static_config())
        assert dict(resolved.properties) == {"s3.region": "us-east-1", **_keys("V1", V1_SECRET)}
        assert resolved.source == "vended"
        assert STATIC_TOKEN not in resolved.properties.values()

    def test_expiry_comes_from_the_vended_set_used(self) -> None:
        resolved = _resolve("s3://b/t1/x", {}, [T1, T10], _config())
        assert resolved.expires_at_ms == int(EXPIRES_MS)
        assert "s3.session-token-expires-at-ms" not in resolved.properties  # metadata, not a pyarrow key
        assert _resolve("s3://b/t10/x", {}, [T1, T10], _config()).expires_at_ms is None


class TestAllowlist:
    HOSTILE = {
        "py-io-impl": "sqe_probe.Probe",
        "s3.retry-strategy-impl": "sqe_probe.Retry",
        "s3.proxy-uri": "http://attacker.invalid:3128",
        "s3.signer": "S3V4RestSigner",
        "s3.signer.uri": "http://attacker.invalid",
        "s3.signer.endpoint": "v1/sign",
        "s3.role-arn": "arn:aws:iam::1:role/x",
        "s3.role-session-name": "x",
        "s3.anonymous": "true",
        "s3.profile-name": "default",
        "s3.resolve-region": "true",
        "s3.sse-kms-key-id": "k",
        "client.access-key-id": "CLIENTKEY",
        "client.secret-access-key": "client-secret",
        "client.session-token": "client-token",
        "client.role-arn": "arn:aws:iam::1:role/y",
        "header.Authorization": "Bearer stolen",
        "token": "catalog-token",
        "credential": "id:secret",
        "write.data.path": "s3://elsewhere",
    }

    def test_hostile_keys_never_pass(self) -> None:
        cred = _cred("s3://b/t1", **self.HOSTILE, **_keys("V1", V1_SECRET))
        for creds in ([cred], []):
            props = _props("s3://b/t1/x", {**self.HOSTILE, **_keys("VC", CFG_SECRET)}, creds, _config())
            assert set(props) <= FILEIO_ALLOWLIST
            assert not set(props) & set(self.HOSTILE)

    def test_allowlist_is_s3_only(self) -> None:
        assert {
            "s3.access-key-id",
            "s3.secret-access-key",
            "s3.session-token",
            "s3.endpoint",
            "s3.region",
            "s3.force-virtual-addressing",
            "s3.connect-timeout",
            "s3.request-timeout",
        } == FILEIO_ALLOWLIST

    def test_timeouts_pass_through(self) -> None:
        props = _props("s3://b/x", {"s3.connect-timeout": "5", "s3.request-timeout": "30.5"}, [], _config())
        assert (props["s3.connect-timeout"], props["s3.request-timeout"]) == ("5", "30.5")


class TestStaticAndVendedNeverMix:
    def test_vended_pair_equal_to_static_pair_is_static(self) -> None:
        cred = _cred("s3://b/t1", **_keys(STATIC_KEY, STATIC_SECRET, "passthrough-token", EXPIRES_MS))
        resolved = _resolve("s3://b/t1/x", {}, [cred], _static_config())
        assert resolved.source == "static" and resolved.expires_at_ms is None and resolved.prefix is None
        assert resolved.properties["s3.session-token"] == STATIC_TOKEN
        assert _vended({}, [cred], _static_config()) == ()

    def test_same_key_id_with_another_secret_is_still_vended(self) -> None:
        cred = _cred("s3://b/t1", **_keys(STATIC_KEY, V1_SECRET))
        assert _resolve("s3://b/t1/x", {}, [cred], _static_config()).source == "vended"

    def test_static_pair_in_response_config_is_static(self) -> None:
        resolved = _resolve("s3://b/x", _keys(STATIC_KEY, STATIC_SECRET), [], _static_config())
        assert resolved.source == "static"

    def test_without_static_pair_nothing_vended_means_ambient_chain(self) -> None:
        resolved = _resolve("s3://b/t2/x", {}, [T1], _config())
        assert resolved.source == "none" and "s3.access-key-id" not in resolved.properties


class TestRequireVended:
    def _required(self) -> SQEConfig:
        return _static_config(**{"catalog.require_vended_credentials": True})

    def test_static_pair_never_placed(self) -> None:
        cred = _cred("s3://b/t1", **_keys("V1", V1_SECRET))
        props = _props("s3://b/t1/x", {}, [cred], self._required())
        assert props == {"s3.region": "us-east-1", **_keys("V1", V1_SECRET)}

    def test_nothing_vended_for_the_path_fails_clearly(self) -> None:
        with pytest.raises(NoVendedCredentialsError) as info:
            _resolve("s3://b/t10/data/x.parquet", {}, [T1], self._required())
        message = str(info.value)
        assert "s3://b/t10/data/x.parquet" in message and "require_vended_credentials" in message
        for secret in SECRETS:
            assert secret not in message

    def test_static_pair_vended_back_fails_and_says_why(self) -> None:
        config = _keys(STATIC_KEY, STATIC_SECRET, "passthrough-token")
        with pytest.raises(NoVendedCredentialsError, match="SQE's own static key"):
            _resolve("s3a://b/t1/x", config, [], self._required())

    def test_unusable_entry_does_not_count_as_vended(self) -> None:
        keyless = _cred("s3://b/t1", **{"s3.endpoint": "http://127.0.0.1:1"})
        with pytest.raises(NoVendedCredentialsError):
            _resolve("s3://b/t1/x", {}, [keyless], self._required())

    def test_local_files_need_no_credentials(self) -> None:
        resolved = _resolve("file:///tmp/wh/t1/x.parquet", {}, [], self._required())
        assert resolved.source == "none" and "s3.access-key-id" not in resolved.properties


def test_resolved_credentials_repr_and_pickle() -> None:
    resolved = _resolve("s3://b/t1/x", {}, [T1], _static_config())
    text = repr(resolved) + str(resolved)
    for secret in SECRETS:
        assert secret not in text
    assert "vended" in text and "s3://b/t1" in text
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(resolved)
    (vended,) = _vended({}, [T1], _config())
    assert V1_SECRET not in repr(vended)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(vended)


def test_resolved_properties_are_read_only() -> None:
    resolved = _resolve("s3://b/t1/x", {}, [T1], _config())
    with pytest.raises(TypeError):
        resolved.properties["s3.endpoint"] = "http://attacker.invalid"  # type: ignore[index]
