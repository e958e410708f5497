"""Pure tests for sqe_catalog.vending: the session policy JSON, VendedCredential, and the cache rules.

STS is replaced by an in-memory fake so the cache, single-flight and error mapping run in milliseconds;
the real boto3/STS path is covered by tests/e2e/test_vending_moto.py.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import pickle
import re
import threading
import time
from typing import TYPE_CHECKING, Any, cast

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from sqe_catalog.config import WarehouseConfig
from sqe_catalog.errors import BadRequestError, ServiceUnavailableError
from sqe_catalog.vending import CredentialVendor, VendedCredential, role_session_name, session_policy

if TYPE_CHECKING:
    from mypy_boto3_sts import STSClient

ROLE_ARN = "arn:aws:iam:::role/lakehouse"
STATIC_SECRET = "static-secret-never-logged"
T0 = 1_800_000_000.0

# --------------------------------------------------------------------------------------------------- policy

READ_LOCATIONS = ["s3://warehouse/db/tbl/", "s3://warehouse/db/tbl/data", "s3a://warehouse/meta/tbl"]
READ_POLICY = (
    '{"Version":"2012-10-17","Statement":['
    '{"Effect":"Allow","Action":["s3:GetObject","s3:GetObjectVersion"],'
    '"Resource":["arn:aws:s3:::warehouse/db/tbl/*","arn:aws:s3:::warehouse/meta/tbl/*"]},'
    '{"Effect":"Allow","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::warehouse"],'
    '"Condition":{"StringLike":{"s3:prefix":["db/tbl/*","meta/tbl/*"]}}},'
    '{"Effect":"Allow","Action":["s3:GetBucketLocation"],"Resource":["arn:aws:s3:::warehouse"]}]}'
)

WRITE_LOCATIONS = ["s3://wh/ns/t", "s3n://archive/t/data/", "s3://wh/ns/t/metadata"]
WRITE_POLICY = (
    '{"Version":"2012-10-17","Statement":['
    '{"Effect":"Allow","Action":["s3:GetObject","s3:GetObjectVersion","s3:PutObject","s3:DeleteObject"],'
    '"Resource":["arn:aws:s3:::archive/t/data/*","arn:aws:s3:::wh/ns/t/*"]},'
    '{"Effect":"Allow","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::archive"],'
    '"Condition":{"StringLike":{"s3:prefix":["t/data/*"]}}},'
    '{"Effect":"Allow","Action":["s3:GetBucketLocation"],"Resource":["arn:aws:s3:::archive"]},'
    '{"Effect":"Allow","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::wh"],'
    '"Condition":{"StringLike":{"s3:prefix":["ns/t/*"]}}},'
    '{"Effect":"Allow","Action":["s3:GetBucketLocation"],"Resource":["arn:aws:s3:::wh"]}]}'
)


def test_read_policy_is_exact_compact_json() -> None:
    assert session_policy(READ_LOCATIONS, write=False) == READ_POLICY


def test_write_policy_is_exact_compact_json() -> None:
    assert session_policy(WRITE_LOCATIONS, write=True) == WRITE_POLICY


def test_policy_does_not_depend_on_location_order() -> None:
    assert session_policy(list(reversed(WRITE_LOCATIONS)), write=True) == WRITE_POLICY


def test_sibling_with_common_string_prefix_is_not_treated_as_nested() -> None:
    policy = session_policy(["s3://b/ns/t", "s3://b/ns/t2", "s3://b/ns/t-x/y"], write=False)
    assert '"s3:prefix":["ns/t/*","ns/t-x/y/*","ns/t2/*"]' in policy


def test_iam_wildcards_in_paths_are_escaped() -> None:
    policy = session_policy(["s3://b/we*ird?$dir"], write=False)
    assert '"Resource":["arn:aws:s3:::b/we${*}ird${?}${$}dir/*"]' in policy
    assert '"s3:prefix":["we${*}ird${?}${$}dir/*"]' in policy


def test_bucket_root_covers_the_whole_bucket_and_absorbs_nested_paths() -> None:
    policy = session_policy(["s3://b/x/y", "s3://b/"], write=False)
    assert '"Resource":["arn:aws:s3:::b/*"]' in policy
    assert '"s3:prefix":["*"]' in policy


@pytest.mark.parametrize("location", ["file:///tmp/wh/t", "gs://b/t", "s3:/b/t", "b/t", "s3:///t", "s3://b*d/t", ""])
def test_non_s3_or_malformed_location_is_rejected(location: str) -> None:
    with pytest.raises(ValueError, match="location"):
        session_policy(["s3://ok/t", location], write=False)


def test_empty_location_list_is_rejected() -> None:
    with pytest.raises(ValueError, match="no locations"):
        session_policy([], write=True)


# ------------------------------------------------------------------------------------------ VendedCredential

FULL = VendedCredential("ASIAKEY", "vended-secret", "vended-token", 1_800_000_060_000)


def test_to_config_with_session_token_and_expiry() -> None:
    assert FULL.to_config() == {
        "s3.access-key-id": "ASIAKEY",
        "s3.secret-access-key": "vended-secret",
        "s3.session-token": "vended-token",
        "s3.session-token-expires-at-ms": "1800000060000",
    }


def test_to_config_of_static_key_has_no_token_or_expiry() -> None:
    static = VendedCredential("AKIAKEY", "static-secret", None, None)
    assert static.to_config() == {"s3.access-key-id": "AKIAKEY", "s3.secret-access-key": "static-secret"}


def test_repr_hides_secret_and_token() -> None:
    text = repr(FULL) + str(FULL)
    assert "ASIAKEY" in text
    assert "vended-secret" not in text
    assert "vended-token" not in text


def test_credential_refuses_pickling_but_copies() -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(FULL)
    with pytest.raises(TypeError):
        pickle.dumps({"nested": [FULL]})
    assert copy.deepcopy(FULL) == FULL
    assert copy.copy(FULL) is FULL


def test_role_session_name_is_sanitised_and_bounded() -> None:
    assert role_session_name("alice") == "sqe-alice"
    assert role_session_name("a b/c:d@e.f+g=h,i_j-k") == "sqe-a_b_c_d@e.f_g=h,i_j-k"
    assert role_session_name("élan") == "sqe-_lan"
    assert len(role_session_name("x" * 200)) == 64


def test_role_session_name_carries_the_end_user_and_the_reader_within_sts_limits() -> None:
    assert role_session_name("alice", "sqe-engine") == "sqe-alice=sqe-engine"
    assert role_session_name("alice", None) == role_session_name("alice", "") == "sqe-alice"
    long = role_session_name("u" * 100, "r" * 100)
    assert len(long) == 64 and long == "sqe-" + "u" * 31 + "=" + "r" * 28, "both names survive, each cut"
    assert role_session_name("a b", "é/x") == "sqe-a_b=__x"
    assert all(
        re.fullmatch(r"[\w+=,.@-]{2,64}", role_session_name(u, r)) for u in ("a", "x" * 90) for r in ("b", "y" * 90)
    )


# ----------------------------------------------------------------------------------------- CredentialVendor


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class FakeSTS:
    """Answers AssumeRole like STS: a fresh key each time, expiring ``lifetime`` seconds after ``clock``."""

    def __init__(self, clock: FakeClock, lifetime: float | None = None) -> None:
        self.clock = clock
        self.lifetime = lifetime  # None: honour DurationSeconds
        self.requests: list[dict[str, Any]] = []
        self.error: Exception | None = None
        self.release: threading.Event | None = None
        self._lock = threading.Lock()

    def assume_role(self, **request: Any) -> dict[str, Any]:
        with self._lock:
            self.requests.append(request)
            n = len(self.requests)
        if self.release is not None:
            self.release.wait(5)
        if self.error is not None:
            raise self.error
        lifetime = self.lifetime if self.lifetime is not None else request["DurationSeconds"]
        expiration = dt.datetime.fromtimestamp(self.clock() + lifetime, dt.UTC)
        return {
            "Credentials": {
                "AccessKeyId": f"ASIA{n:04d}",
                "SecretAccessKey": f"sts-secret-{n}",
                "SessionToken": f"sts-token-{n}",
                "Expiration": expiration,
            }
        }


def make_vendor(
    lifetime: int = 100, clock: FakeClock | None = None, sts: FakeSTS | None = None, **overrides: Any
) -> tuple[CredentialVendor, FakeSTS, FakeClock]:
    clock = clock or FakeClock()
    sts = sts or FakeSTS(clock)
    settings: dict[str, Any] = {
        "name": "demo",
        "location": "s3://warehouse/demo",
        "role_arn": ROLE_ARN,
        "credential_lifetime_seconds": lifetime,
        "access_key_id": "CATALOGKEY",
        "secret_access_key": STATIC_SECRET,
    }
    settings.update(overrides)
    vendor = CredentialVendor(WarehouseConfig(**settings), clock=clock, sts_client=cast("STSClient", sts))
    return vendor, sts, clock


LOC = ["s3://warehouse/demo/ns/t"]


def test_assume_role_request_carries_policy_duration_session_name_and_external_id() -> None:
    vendor, sts, _ = make_vendor(lifetime=5, external_id="ext-42")
    cred = vendor.vend("alice smith", "demo.ns.t", LOC, write=True)
    assert sts.requests == [
        {
            "RoleArn": ROLE_ARN,
            "RoleSessionName": "sqe-alice_smith",
            "DurationSeconds": 5,
            "Policy": session_policy(LOC, write=True),
            "ExternalId": "ext-42",
        }
    ]
    assert cred == VendedCredential("ASIA0001", "sts-secret-1", "sts-token-1", int((T0 + 5) * 1000))
    assert vendor.assume_role_calls == 1


def test_external_id_is_omitted_when_not_configured() -> None:
    vendor, sts, _ = make_vendor()
    vendor.vend("alice", "demo.ns.t", LOC, write=False)
    assert "ExternalId" not in sts.requests[0]


def test_credential_is_reused_only_while_more_than_half_its_lifetime_remains() -> None:
    vendor, _, clock = make_vendor(lifetime=100)
    first = vendor.vend("alice", "demo.ns.t", LOC, write=False)
    clock.now = T0 + 49.9
    assert vendor.vend("alice", "demo.ns.t", LOC, write=False) is first
    assert vendor.assume_role_calls == 1
    clock.now = T0 + 50.0  # exactly half left: no longer "more than half"
    second = vendor.vend("alice", "demo.ns.t", LOC, write=False)
    assert second != first
    assert vendor.assume_role_calls == 2
    clock.now = T0 + 99.0  # half-life counts from the second credential's issue time
    assert vendor.vend("alice", "demo.ns.t", LOC, write=False) is second
    assert vendor.assume_role_calls == 2


def test_half_life_uses_the_lifetime_sts_actually_granted() -> None:
    clock = FakeClock()
    vendor, _, _ = make_vendor(lifetime=100, clock=clock, sts=FakeSTS(clock, lifetime=20))
    vendor.vend("alice", "demo.ns.t", LOC, write=False)
    clock.now = T0 + 10.5
    vendor.vend("alice", "demo.ns.t", LOC, write=False)
    assert vendor.assume_role_calls == 2


def test_half_life_never_exceeds_the_requested_lifetime() -> None:
    clock = FakeClock()  # an STS clock running ahead reports a later expiry than we asked for
    vendor, _, _ = make_vendor(lifetime=100, clock=clock, sts=FakeSTS(clock, lifetime=1000))
    vendor.vend("alice", "demo.ns.t", LOC, write=False)
    clock.now = T0 + 50.0
    vendor.vend("alice", "demo.ns.t", LOC, write=False)
    assert vendor.assume_role_calls == 2


def test_entries_past_their_half_life_are_dropped_when_another_is_stored() -> None:
    vendor, _, clock = make_vendor(lifetime=100)
    vendor.vend("alice", "demo.ns.t", LOC, write=False)
    vendor.vend("alice", "demo.ns.u", LOC, write=False)
    clock.now = T0 + 60
    vendor.vend("bob", "demo.ns.t", LOC, write=False)
    assert [key[:2] for key in vendor._cache] == [("bob", "demo.ns.t")]


@pytest.mark.parametrize(
    ("principal", "table", "locations", "write"),
    [
        ("bob", "demo.ns.t", LOC, False),
        ("alice", "demo.ns.u", LOC, False),
        ("alice", "demo.ns.t", LOC, True),
        ("alice", "demo.ns.t", [*LOC, "s3://warehouse/demo/elsewhere"], False),
    ],
)
def test_cache_key_separates_principal_table_mode_and_locations(
    principal: str, table: str, locations: list[str], write: bool
) -> None:
    vendor, _, _ = make_vendor()
    first = vendor.vend("alice", "demo.ns.t", LOC, write=False)
    other = vendor.vend(principal, table, locations, write)
    assert other != first
    assert vendor.assume_role_calls == 2


def test_concurrent_callers_for_one_key_share_a_single_assume_role() -> None:
    vendor, sts, _ = make_vendor()
    sts.release = threading.Event()
    results: list[VendedCredential] = []
    start = threading.Barrier(8)

    def call() -> None:
        start.wait()
        results.append(vendor.vend("alice", "demo.ns.t", LOC, write=False))

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.1)  # long enough for every thread to reach STS if single-flight were broken
    sts.release.set()
    for t in threads:
        t.join(5)
    assert len(sts.requests) == 1
    assert len(results) == 8
    assert all(r is results[0] for r in results)


def test_concurrent_callers_share_the_failure_and_the_next_call_retries() -> None:
    vendor, sts, _ = make_vendor()
    sts.release = threading.Event()
    sts.error = EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
    errors: list[BaseException] = []

    def call() -> None:
        try:
            vendor.vend("alice", "demo.ns.t", LOC, write=False)
        except ServiceUnavailableError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    sts.release.set()
    for t in threads:
        t.join(5)
    assert len(errors) == 4
    assert len(sts.requests) == 1
    sts.error = None
    assert vendor.vend("alice", "demo.ns.t", LOC, write=False).session_token == "sts-token-2"


def _client_error(status: int, code: str | None) -> ClientError:
    error = {"Message": f"denied for policy {session_policy(LOC, False)}"}
    if code is not None:
        error["Code"] = code
    return ClientError(
        {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}},  # type: ignore[typeddict-item]
        "AssumeRole",
    )


@pytest.mark.parametrize(
    ("error", "detail"),
    [
        (_client_error(403, "AccessDenied"), "HTTP 403 AccessDenied"),
        (_client_error(400, None), "HTTP 400 Unknown"),  # Ceph RGW: botocore cannot parse the code
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), "EndpointConnectionError"),
    ],
)
def test_sts_errors_become_503_naming_warehouse_and_status_but_no_secret(error: Exception, detail: str) -> None:
    vendor, sts, _ = make_vendor()
    sts.error = error
    with pytest.raises(ServiceUnavailableError) as info:
        vendor.vend("alice", "demo.ns.t", LOC, write=False)
    message = info.value.message
    assert message == f"STS AssumeRole failed for warehouse 'demo': {detail}"
    assert info.value.status == 503
    assert STATIC_SECRET not in message
    assert "Statement" not in message


def test_failures_are_not_cached() -> None:
    vendor, sts, _ = make_vendor()
    sts.error = _client_error(503, "ServiceUnavailable")
    with pytest.raises(ServiceUnavailableError):
        vendor.vend("alice", "demo.ns.t", LOC, write=False)
    sts.error = None
    vendor.vend("alice", "demo.ns.t", LOC, write=False)
    assert vendor.assume_role_calls == 2


def test_malformed_sts_response_is_a_503() -> None:
    vendor, sts, _ = make_vendor()
    sts.assume_role = lambda **_: {"Credentials": {"AccessKeyId": "x"}}  # type: ignore[method-assign]
    with pytest.raises(ServiceUnavailableError, match="malformed AssumeRole response"):
        vendor.vend("alice", "demo.ns.t", LOC, write=False)


def test_missing_role_arn_is_a_503_without_an_sts_call() -> None:
    vendor, sts, _ = make_vendor(role_arn="")
    with pytest.raises(ServiceUnavailableError, match="'demo' has no role_arn"):
        vendor.vend("alice", "demo.ns.t", LOC, write=False)
    assert sts.requests == []


def test_location_outside_s3_is_a_400_without_an_sts_call() -> None:
    vendor, sts, _ = make_vendor()
    with pytest.raises(BadRequestError, match="not an s3:// location: 'gs://b/t'"):
        vendor.vend("alice", "demo.ns.t", ["gs://b/t"], write=False)
    assert sts.requests == []
    assert vendor.assume_role_calls == 0


def test_sts_unavailable_returns_the_static_key_without_token_expiry_or_sts_call() -> None:
    vendor, sts, _ = make_vendor(sts_unavailable=True, role_arn="")
    cred = vendor.vend("alice", "demo.ns.t", LOC, write=True)
    assert cred == VendedCredential("CATALOGKEY", STATIC_SECRET, None, None)
    assert set(cred.to_config()) == {"s3.access-key-id", "s3.secret-access-key"}
    assert sts.requests == []
    assert vendor.assume_role_calls == 0


def test_sts_unavailable_without_a_static_key_is_a_503() -> None:
    vendor, _, _ = make_vendor(sts_unavailable=True, access_key_id="", secret_access_key="")
    with pytest.raises(ServiceUnavailableError, match="no static access key"):
        vendor.vend("alice", "demo.ns.t", LOC, write=False)


def test_debug_log_names_principal_table_mode_cache_and_expiry_but_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="sqe_catalog.vending")
    vendor, sts, _ = make_vendor()
    vendor.vend("alice", "demo.ns.t", LOC, write=True)
    vendor.vend("alice", "demo.ns.t", LOC, write=True)
    sts.error = _client_error(403, "AccessDenied")
    with pytest.raises(ServiceUnavailableError):
        vendor.vend("bob", "demo.ns.t", LOC, write=False)
    messages = [r.getMessage() for r in caplog.records if r.name == "sqe_catalog.vending"]
    expiry = int((T0 + 100) * 1000)
    assert messages[:2] == [
        f"vend warehouse=demo principal=alice table=demo.ns.t write=True cache=miss expires_at_ms={expiry}",
        f"vend warehouse=demo principal=alice table=demo.ns.t write=True cache=hit expires_at_ms={expiry}",
    ]
    assert "HTTP 403 AccessDenied" in messages[2]
    for secret in ("sts-secret-1", "sts-token-1", STATIC_SECRET):
        assert secret not in caplog.text
