"""Addressing and secret hygiene of sqe.credentials.signed_reads (the wire behaviour is in tests/e2e)."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import quote

import pytest

from sqe.credentials import (
    CatalogCredentials,
    CredentialSet,
    ResolvedCredentials,
    StoragePolicy,
    StorageSettings,
    build_properties,
    parse_settings,
)
from sqe.credentials.signed_reads import SignedObject, close_pool, s3_address, signed_object
from sqe.vocabulary import (
    S3_ACCESS_KEY_ID,
    S3_CONNECT_TIMEOUT,
    S3_ENDPOINT,
    S3_FORCE_VIRTUAL_ADDRESSING,
    S3_REGION,
    S3_REQUEST_TIMEOUT,
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
)

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEXAMPLE-session-token-value"
KEYS = {S3_ACCESS_KEY_ID: "AKIAEXAMPLE", S3_SECRET_ACCESS_KEY: SECRET, S3_SESSION_TOKEN: TOKEN}
MOTO = {S3_ENDPOINT: "http://127.0.0.1:5000", S3_REGION: "us-east-1", **KEYS}


def resolved(properties: Mapping[str, str], settings: StorageSettings | None = None) -> ResolvedCredentials:
    """A resolved set whose settings are these FileIO properties, parsed by the one parser (or ``settings``)."""
    parsed = settings if settings is not None else parse_settings(properties, "test properties")
    return ResolvedCredentials(MappingProxyType(dict(properties)), "vended", None, None, parsed)


@pytest.mark.parametrize(
    ("location", "settings", "url"),
    [
        # An endpoint: path style unless virtual addressing is forced, the endpoint's own scheme.
        ("s3://b/t/f.parquet", {}, "http://127.0.0.1:5000/b/t/f.parquet"),
        ("s3://b/t/f.parquet", {S3_FORCE_VIRTUAL_ADDRESSING: "false"}, "http://127.0.0.1:5000/b/t/f.parquet"),
        ("s3://b/t/f.parquet", {S3_FORCE_VIRTUAL_ADDRESSING: "true"}, "http://b.127.0.0.1:5000/t/f.parquet"),
        ("s3a://b/t/f.parquet", {}, "http://127.0.0.1:5000/b/t/f.parquet"),
        ("S3N://b/t/f.parquet", {}, "http://127.0.0.1:5000/b/t/f.parquet"),
        # No scheme on the endpoint: https, as pyarrow's default.
        ("s3://b/k", {S3_ENDPOINT: "store.example:9000"}, "https://store.example:9000/b/k"),
        ("s3://b/k", {S3_ENDPOINT: "HTTPS://store.example/"}, "https://store.example/b/k"),
        # Keys are percent-encoded once, slashes kept (the canonical URI SigV4 signs for S3).
        ("s3://b/a b/ä+c&d~e=f.avro", {}, "http://127.0.0.1:5000/b/a%20b/%C3%A4%2Bc%26d~e%3Df.avro"),
        # No endpoint: AWS itself, virtual hosts in the set's region.
        ("s3://b/t/f", {S3_ENDPOINT: "", S3_REGION: "eu-west-1"}, "https://b.s3.eu-west-1.amazonaws.com/t/f"),
        ("s3://b/t/f", {S3_ENDPOINT: "", S3_REGION: "us-gov-west-1"}, "https://b.s3.us-gov-west-1.amazonaws.com/t/f"),
        ("s3://b/t/f", {S3_ENDPOINT: "", S3_REGION: "ap-southeast-5"}, "https://b.s3.ap-southeast-5.amazonaws.com/t/f"),
    ],
)
def test_addresses_what_pyarrow_addresses(location: str, settings: dict[str, str], url: str) -> None:
    address = s3_address(location, resolved({**MOTO, **settings}).settings)
    assert address is not None and address.url == url
    assert address.bucket == location.split("://")[1].split("/")[0]


@pytest.mark.parametrize(
    ("catalog_config", "policy", "url"),
    [
        ({"s3.path-style-access": "false"}, StoragePolicy(), "http://b.127.0.0.1:5000/t/f"),
        ({"s3.path-style-access": "true"}, StoragePolicy(), "http://127.0.0.1:5000/b/t/f"),
        ({"s3.force-virtual-addressing": "true"}, StoragePolicy(path_style=True), "http://127.0.0.1:5000/b/t/f"),
        ({}, StoragePolicy(path_style=False), "http://b.127.0.0.1:5000/t/f"),
    ],
)
def test_path_style_is_the_one_parsed_by_the_credential_model(
    catalog_config: dict[str, str], policy: StoragePolicy, url: str
) -> None:
    # Iceberg Java's s3.path-style-access is understood by the model only: a signed read takes the parsed value.
    config = {S3_ENDPOINT: "http://127.0.0.1:5000", **catalog_config}
    vended = CredentialSet(None, "AKIAEXAMPLE", SECRET, TOKEN, None, settings=parse_settings(config, "config"))
    scope = build_properties("s3://b/t/f", CatalogCredentials(vended.settings, (vended,)), policy)
    found = signed_object("s3://b/t/f", scope)
    assert found is not None and found.address.url == url


@pytest.mark.parametrize(
    ("location", "settings"),
    [
        ("file:///tmp/t/f.parquet", {}),  # not S3
        ("gs://b/t/f.parquet", {}),
        ("s3://b", {}),  # no key
        ("s3://b/t/f?versionId=1", {}),  # pyiceberg would drop the query: leave it to that path
        ("s3://b/t/f#x", {}),
        ("s3://b/t/f", {S3_REGION: ""}),  # no region to sign for
        ("s3://b/t/f", {S3_ENDPOINT: "http://proxy.example/s3"}),  # an endpoint with a path of its own
        ("s3://b/t/f", {S3_ENDPOINT: "ftp://store.example"}),
        ("s3://my.bucket/f", {S3_ENDPOINT: "", S3_REGION: "eu-west-1"}),  # dotted bucket on an AWS virtual host
        ("s3://b/f", {S3_ENDPOINT: "", S3_REGION: "cn-north-1"}),  # another domain
        # Other partitions' domains too (c2s.ic.gov, sc2s.sgov.gov, cloud.adc-e.uk, csp.hci.ic.gov, amazonaws.eu):
        # an amazonaws.com host there does not exist, where pyarrow reads.
        ("s3://b/f", {S3_ENDPOINT: "", S3_REGION: "us-iso-east-1"}),
        ("s3://b/f", {S3_ENDPOINT: "", S3_REGION: "us-isob-east-1"}),
        ("s3://b/f", {S3_ENDPOINT: "", S3_REGION: "eu-isoe-west-1"}),
        ("s3://b/f", {S3_ENDPOINT: "", S3_REGION: "us-isof-south-1"}),
        ("s3://b/f", {S3_ENDPOINT: "", S3_REGION: "eusc-de-east-1"}),
    ],
)
def test_cases_it_does_not_handle_keep_the_pyarrow_path(location: str, settings: dict[str, str]) -> None:
    assert s3_address(location, resolved({**MOTO, **settings}).settings) is None
    assert signed_object(location, resolved({**MOTO, **settings})) is None


VIRTUAL = {S3_FORCE_VIRTUAL_ADDRESSING: "true"}
AWS = {S3_ENDPOINT: "", S3_REGION: "eu-west-1"}


@pytest.mark.parametrize(
    ("location", "settings"),
    [
        # A bucket (a manifest writer's text) or a region (the catalog's) is put into a host name: characters
        # urllib3 reads as the end of the host or as a user name would send the signed request elsewhere.
        ("s3://evil.example:9000\\/k", VIRTUAL),
        ("s3://u@evil.example:9000\\b/k", VIRTUAL),
        ("s3://evil:80\\/k", AWS),
        ("s3://2130706433:80\\/k", AWS),
        ("s3://b/k", {**AWS, S3_REGION: "x@evil.example\\"}),
        ("s3://B/k", VIRTUAL),  # no S3 bucket: a host name would fold it into another bucket's
    ],
)
def test_no_host_is_made_from_what_is_not_a_bucket_or_region_name(location: str, settings: dict[str, str]) -> None:
    assert s3_address(location, resolved({**MOTO, **settings}).settings) is None
    assert signed_object(location, resolved({**MOTO, **settings})) is None


def test_path_style_quotes_any_bucket_into_the_path() -> None:
    address = s3_address("s3://evil.example:9000\\/k", resolved(MOTO).settings)
    assert address is not None and address.url == "http://127.0.0.1:5000/evil.example%3A9000%5C/k"


@pytest.mark.parametrize("missing", [S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY])
def test_no_key_pair_no_signed_reader(missing: str) -> None:
    assert signed_object("s3://b/t/f", resolved({k: v for k, v in MOTO.items() if k != missing})) is None


def test_a_signed_reader_shows_and_pickles_no_secret() -> None:
    found = signed_object("s3://b/t/f.parquet", resolved(MOTO))
    assert isinstance(found, SignedObject)
    shown = repr(found) + repr(found.address) + str(vars(found).get("_credentials"))
    assert SECRET not in shown and TOKEN not in shown and "t/f.parquet" in shown
    with pytest.raises(TypeError):
        pickle.dumps(found)


def test_error_text_is_scrubbed_and_one_line() -> None:
    found = signed_object("s3://b/t/f.parquet", resolved(MOTO))
    assert found is not None
    error = found._failure(OSError, f"echoed {SECRET} and {TOKEN}\nsecond line")
    assert SECRET not in str(error) and TOKEN not in str(error) and "\n" not in str(error)
    assert str(error).startswith("When reading from key 't/f.parquet' in bucket 'b': echoed [redacted]")


def test_error_text_quoting_the_keys_as_a_url_does_or_cut_short_shows_none_of_them() -> None:
    # a store or proxy may echo the request's URL (keys percent-encoded) or a token cut to a length
    found = signed_object("s3://b/t/f.parquet", resolved(MOTO))
    assert found is not None
    detail = f"GET /?X-Amz-Security-Token={quote(TOKEN, safe='')}&sig={quote(SECRET, safe='')} token {TOKEN[:-6]}..."
    text = str(found._failure(OSError, detail))
    for secret in (SECRET, TOKEN):
        assert secret[:16] not in text and quote(secret, safe="")[:16] not in text
    assert "X-Amz-Security-Token=[redacted]" in text and "token [redacted]" in text


def test_timeouts_come_from_the_settings_and_fall_back_on_nonsense() -> None:
    timed = signed_object("s3://b/k", resolved({**MOTO, S3_CONNECT_TIMEOUT: "2.5", S3_REQUEST_TIMEOUT: "7"}))
    assert timed is not None and (timed._connect_timeout, timed._read_timeout) == (2.5, 7.0)
    nonsense = dataclasses.replace(resolved(MOTO).settings, connect_timeout="soon", request_timeout="-1")
    default = signed_object("s3://b/k", resolved(MOTO, nonsense))  # the model refuses these; never trusted here
    fallback = signed_object("s3://b/k", resolved(MOTO))
    assert default is not None and fallback is not None
    assert (default._connect_timeout, default._read_timeout) == (fallback._connect_timeout, fallback._read_timeout)


def test_an_empty_range_sends_nothing() -> None:
    # The endpoint is unroutable: any request would fail, so success proves no request was made.
    found = signed_object("s3://b/k", resolved({**MOTO, S3_ENDPOINT: "http://127.0.0.1:1"}))
    assert found is not None and found.read_at(0, 10) == b""
    close_pool()
    close_pool()  # idempotent


@pytest.mark.parametrize(
    ("status", "code", "error_class"),
    [
        (404, "NoSuchKey", FileNotFoundError),
        (403, "AccessDenied", PermissionError),
        (403, "InvalidAccessKeyId", PermissionError),
        (400, "ExpiredToken", OSError),  # S3 answers an expired session token with 400, pyarrow with an OSError
        (416, "InvalidRange", OSError),
        (503, "SlowDown", OSError),  # after the retries
    ],
)
def test_store_answers_map_to_the_os_error_classes_of_the_pyarrow_path(
    status: int, code: str, error_class: type[OSError]
) -> None:
    found = signed_object("s3://b/t/f.parquet", resolved(MOTO))
    assert found is not None
    body = (
        f"<Error><Code>{code}</Code><Message>told you</Message><StringToSign>AWS4 {TOKEN}</StringToSign>"
        f"<RequestId>1</RequestId></Error>"
    ).encode()
    with pytest.raises(OSError) as failure:
        found._raise_for(status, body)
    assert type(failure.value) is error_class
    assert str(failure.value) == f"When reading from key 't/f.parquet' in bucket 'b': HTTP {status} {code}: told you"


def test_an_address_shows_no_password_of_a_catalog_sent_endpoint() -> None:
    # The catalog chooses the endpoint; one holding a user and password must not reach a repr through the URL.
    address = s3_address("s3://b/t/f", resolved({**MOTO, S3_ENDPOINT: "http://alice:PW-123@127.0.0.1:5000"}).settings)
    assert address is not None and "PW-123" not in repr(address) and "t/f" in repr(address)
