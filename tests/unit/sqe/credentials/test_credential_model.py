"""CredentialSet: parsed once and strictly, one completeness rule, and the source kept through the wire codec."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from sqe.credentials import CredentialSet, ScopedFileIO, StoragePolicy, StorageSettings, parse_catalog_credentials
from sqe.distributed.protocol._proto import worker_pb2 as pb
from sqe.distributed.protocol.ticket import credentials_from_proto, credentials_to_proto
from sqe.errors import CatalogProtocolError

SECRET, TOKEN = "model-secret-5f1", "model-token-9a3"
PREFIX = "s3://b/wh/ns/t"


def _entry(**config: str) -> dict[str, Any]:
    keys = {"s3.access-key-id": "AKIAMODEL", "s3.secret-access-key": SECRET, "s3.session-token": TOKEN}
    return {"prefix": PREFIX, "config": {**keys, **config}}


def _one(**config: str) -> CredentialSet:
    (found,) = parse_catalog_credentials({"storage-credentials": [_entry(**config)]}).sets
    return found


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("s3.session-token-expires-at-ms", "tomorrow"),
        ("s3.force-virtual-addressing", "sometimes"),
        ("s3.path-style-access", ""),
        ("s3.connect-timeout", "0"),
        ("s3.request-timeout", "slow"),
    ],
)
def test_each_malformed_field_fails_naming_the_field_never_a_value(key: str, value: str) -> None:
    with pytest.raises(CatalogProtocolError) as info:
        _one(**{key: value})
    message = str(info.value)
    assert key in message and repr(PREFIX) in message
    assert SECRET not in message and TOKEN not in message and (not value or value not in message)


def test_the_credentials_endpoint_answer_is_named_in_errors() -> None:
    with pytest.raises(CatalogProtocolError, match=r"^credentials response: storage-credentials must be a list"):
        parse_catalog_credentials({"storage-credentials": {}}, "credentials response")


def test_settings_merge_config_under_the_entry_and_understand_both_spellings() -> None:
    response = {
        "config": {"s3.endpoint": "http://config:1", "client.region": "r-config", "s3.path-style-access": "true"},
        "storage-credentials": [_entry(**{"s3.force-virtual-addressing": "true", "s3.region": "r-entry"})],
    }
    catalog = parse_catalog_credentials(response)
    assert catalog.settings == StorageSettings("http://config:1", "r-config", True)
    assert catalog.sets[0].settings == StorageSettings("http://config:1", "r-entry", False)


def test_complete_vended_set_needs_key_secret_token_and_expiry() -> None:
    assert _one(**{"s3.session-token-expires-at-ms": "1700000000000"}).missing_parts() == []
    # a set without expiry is not complete for a push, and no expiry is made up for it
    no_expiry = _one()
    assert no_expiry.expires_at_ms is None and no_expiry.missing_parts() == ["expiry"]
    no_token = parse_catalog_credentials(
        {"config": {"s3.access-key-id": "K", "s3.secret-access-key": SECRET}}
    ).for_location(PREFIX)[0]
    assert no_token.prefix == PREFIX and no_token.missing_parts() == ["session token", "expiry"]


def test_static_sets_need_only_key_and_secret() -> None:
    static = CredentialSet("s3://", "AKIASTATIC", SECRET, source="static")
    assert static.missing_parts() == []
    assert CredentialSet("s3://", "AKIASTATIC", "", source="static").missing_parts() == ["secret access key"]


def test_keyless_entries_never_become_sets() -> None:
    response = {"storage-credentials": [{"prefix": PREFIX, "config": {"s3.endpoint": "http://x:1"}}]}
    assert parse_catalog_credentials(response).sets == ()


@pytest.mark.parametrize("source", ["static", "vended"])
def test_the_codec_keeps_the_source(source: str) -> None:
    original = CredentialSet(
        PREFIX, "AKIAWIRE", SECRET, TOKEN, 1_700_000_000_000, source, StorageSettings("http://s:1", "r", True)
    )  # type: ignore[arg-type]
    wire = pb.CredentialSet.FromString(credentials_to_proto(original).SerializeToString())
    decoded = credentials_from_proto(wire)
    assert decoded == original and decoded.source == source


def test_repr_hides_keys_and_pickling_is_refused() -> None:
    found = _one(**{"s3.session-token-expires-at-ms": "1700000000000"})
    assert "AKIAMODEL" not in repr(found) and SECRET not in repr(found) and TOKEN not in repr(found)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(found)


@pytest.mark.parametrize("value", ["1700000000", "-1700000000000", "0"])
def test_an_expiry_in_seconds_or_not_positive_is_a_protocol_error(value: str) -> None:
    # Read as milliseconds, 1700000000 is January 1970: "already expired" would hide the catalog's mistake.
    with pytest.raises(CatalogProtocolError, match="epoch milliseconds") as info:
        _one(**{"s3.session-token-expires-at-ms": value})
    assert value not in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "253402300800000",
        "99999999999999999999",
        "1_800_000_000_000",
        "+1800000000000",
        "\uff11\uff18" + "\uff10" * 11,
        "1" * 5000,  # past int()'s 4300-digit limit: its ValueError escaped, untyped
        "-" + "1" * 5000,
    ],
)
def test_an_expiry_no_date_or_no_plain_integer_is_a_protocol_error(value: str) -> None:
    # Year 10000 and later crashed EXPLAIN and the FileIO's repr (datetime's range); past int64, a ticket too.
    with pytest.raises(CatalogProtocolError, match=r"s3\.session-token-expires-at-ms must be") as info:
        _one(**{"s3.session-token-expires-at-ms": value})
    assert value not in str(info.value)


@pytest.mark.parametrize("zeros", [1, 5000])
def test_leading_zeros_of_an_expiry_are_read_past_ints_digit_limit(zeros: int) -> None:
    assert _one(**{"s3.session-token-expires-at-ms": "0" * zeros + "1800000000000"}).expires_at_ms == 1800000000000


def test_the_latest_expiry_a_date_can_show_is_taken_and_shown() -> None:
    found = _one(**{"s3.session-token-expires-at-ms": "253402300799999"})
    assert found.expires_at_ms == 253402300799999
    file_io = ScopedFileIO([found], StoragePolicy(), location=PREFIX)
    assert "9999-12-31T23:54:59" in repr(file_io) and file_io.describe()[0]["expires_at"].startswith("9999-12-31")


def test_a_catalog_sent_endpoint_is_shown_without_its_password() -> None:
    """The catalog's ``s3.endpoint`` is used as sent (unless the config sets one); a password in it never shows."""
    found = _one(**{"s3.endpoint": "http://user:endpoint-pw-77c@127.0.0.1:9?token=endpoint-tok-31"})
    shown = f"{found!r} {found.settings!r}"
    assert "http://user:***@127.0.0.1:9?token=***" in shown and "region=" in shown, shown
    assert "endpoint-pw-77c" not in shown and "endpoint-tok-31" not in shown
    assert found.settings.endpoint == "http://user:endpoint-pw-77c@127.0.0.1:9?token=endpoint-tok-31"  # used as sent
