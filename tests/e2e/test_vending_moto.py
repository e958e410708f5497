"""CredentialVendor against a real moto server (S3 + STS + IAM, IAM auth on) on a free loopback port.

Flow tier only: moto honours DurationSeconds and records the session policy, but does not enforce it (the
Ceph tier does). The half-life rule is driven by a clock shifted ahead of real time, so nothing sleeps.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from sqe_catalog.config import WarehouseConfig
from sqe_catalog.errors import ServiceUnavailableError
from sqe_catalog.vending import CredentialVendor, VendedCredential, session_policy
from tests.conftest import MOTO_ACCOUNT, MotoServer, free_loopback_port, start_moto

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.e2e

BUCKET = "warehouse"
ROLE_ARN = f"arn:aws:iam::{MOTO_ACCOUNT}:role/lakehouse"
LIFETIME = 60  # below STS's 900 s minimum: proves parameter_validation=False and that moto honours it
TABLE = ["s3://warehouse/demo/ns/t1"]


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A moto server of this module's own (not the session's): the tests read moto's recorded AssumeRole calls
    from ``/moto-api/data.json``, which moto cannot serialise once other tests have stored objects."""
    with start_moto(tmp_path_factory.mktemp("vending-moto") / "moto.log") as server:
        yield server


def _s3(moto: MotoServer, key_id: str, secret: str, token: str | None = None) -> S3Client:
    return boto3.client(
        "s3",
        endpoint_url=moto.url,
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def _warehouse(moto: MotoServer, **overrides: Any) -> WarehouseConfig:
    settings: dict[str, Any] = {
        "name": "demo",
        "location": "s3://warehouse/demo",
        "endpoint": moto.url,
        "role_arn": ROLE_ARN,
        "credential_lifetime_seconds": LIFETIME,
        "access_key_id": moto.access_key_id,
        "secret_access_key": moto.secret_access_key,
    }
    settings.update(overrides)
    return WarehouseConfig(**settings)


def _recorded_assumed_role(moto: MotoServer, access_key_id: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{moto.url}/moto-api/data.json", timeout=5) as resp:
        data = json.load(resp)
    roles = [r for r in data["sts"]["AssumedRole"] if r["access_key_id"] == access_key_id]
    assert len(roles) == 1
    return dict(roles[0])


class ShiftedClock:
    """Real time plus an offset: agrees with moto's Expiration, but the test can jump ahead."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _s3_with(moto: MotoServer, cred: VendedCredential) -> S3Client:
    return _s3(moto, cred.access_key_id, cred.secret_access_key, cred.session_token)


def test_vended_write_and_read_credentials_work_on_s3(moto: MotoServer) -> None:
    vendor = CredentialVendor(_warehouse(moto))
    before_ms = time.time() * 1000
    writer = vendor.vend("writer", "demo.ns.t1", TABLE, write=True)
    reader = vendor.vend("analyst", "demo.ns.t1", TABLE, write=False)
    assert writer.access_key_id.startswith("ASIA")
    assert writer.session_token and reader.session_token
    assert writer.access_key_id != reader.access_key_id
    assert writer.expires_at_ms is not None
    assert before_ms + (LIFETIME - 2) * 1000 <= writer.expires_at_ms <= before_ms + (LIFETIME + 2) * 1000

    _s3_with(moto, writer).put_object(Bucket=BUCKET, Key="demo/ns/t1/data/f.txt", Body=b"vended")
    body = _s3_with(moto, reader).get_object(Bucket=BUCKET, Key="demo/ns/t1/data/f.txt")["Body"]
    assert body.read() == b"vended"
    assert vendor.assume_role_calls == 2


def test_a_credential_without_its_session_token_is_refused(moto: MotoServer) -> None:
    # Shows IAM auth is really on, so the flow test above proves the vended token is what gets accepted.
    cred = CredentialVendor(_warehouse(moto)).vend("analyst", "demo.ns.t1", TABLE, write=False)
    broken = VendedCredential(cred.access_key_id, cred.secret_access_key, None, cred.expires_at_ms)
    with pytest.raises(ClientError) as info:
        _s3_with(moto, broken).list_objects_v2(Bucket=BUCKET, Prefix="demo/ns/t1/")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_moto_records_the_exact_session_policy_session_name_and_external_id(moto: MotoServer) -> None:
    vendor = CredentialVendor(_warehouse(moto, external_id="ext-7"))
    locations = [*TABLE, "s3://warehouse/demo/ns/t1/data", "s3://warehouse/meta/t1/"]
    cred = vendor.vend("writer@corp", "demo.ns.t1", locations, write=True)
    recorded = _recorded_assumed_role(moto, cred.access_key_id)
    assert recorded["policy"] == session_policy(locations, write=True)
    assert recorded["session_name"] == "sqe-writer@corp"
    assert recorded["role_arn"] == ROLE_ARN
    assert recorded["external_id"] == "ext-7"


def test_cache_reuses_within_half_life_and_assumes_again_after(moto: MotoServer) -> None:
    clock = ShiftedClock()
    vendor = CredentialVendor(_warehouse(moto), clock=clock)
    first = vendor.vend("analyst", "demo.ns.t1", TABLE, write=False)
    assert vendor.vend("analyst", "demo.ns.t1", TABLE, write=False) is first
    clock.offset = LIFETIME / 2 - 5
    assert vendor.vend("analyst", "demo.ns.t1", TABLE, write=False) is first
    assert vendor.assume_role_calls == 1

    vendor.vend("analyst", "demo.ns.t1", TABLE, write=True)  # another mode is another credential
    assert vendor.assume_role_calls == 2

    clock.offset = LIFETIME / 2 + 1
    renewed = vendor.vend("analyst", "demo.ns.t1", TABLE, write=False)
    assert renewed.access_key_id != first.access_key_id
    assert vendor.assume_role_calls == 3


def test_wrong_catalog_secret_is_a_503_without_secrets(moto: MotoServer) -> None:
    vendor = CredentialVendor(_warehouse(moto, secret_access_key="wrong-secret-value"))
    with pytest.raises(ServiceUnavailableError) as info:
        vendor.vend("analyst", "demo.ns.t1", TABLE, write=False)
    assert info.value.status == 503
    assert info.value.message == "STS AssumeRole failed for warehouse 'demo': HTTP 403 SignatureDoesNotMatch"
    assert "wrong-secret-value" not in info.value.message
    assert moto.access_key_id not in info.value.message


def test_unreachable_sts_endpoint_is_a_503(moto: MotoServer) -> None:
    warehouse = _warehouse(moto, sts_endpoint=f"http://127.0.0.1:{free_loopback_port()}")
    with pytest.raises(ServiceUnavailableError, match="'demo': EndpointConnectionError"):
        CredentialVendor(warehouse).vend("analyst", "demo.ns.t1", TABLE, write=False)


def test_debug_logs_of_a_vend_hold_no_key_secret_or_token(moto: MotoServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # root at DEBUG, as an operator running the catalog with debug logs
    vendor = CredentialVendor(_warehouse(moto))
    cred = vendor.vend("analyst", "demo.ns.t1", TABLE, write=False)
    vendor.vend("analyst", "demo.ns.t1", TABLE, write=False)
    ours = [r.getMessage() for r in caplog.records if r.name == "sqe_catalog.vending"]
    assert any("principal=analyst table=demo.ns.t1 write=False cache=miss" in m for m in ours)
    assert any("cache=hit" in m for m in ours)
    assert cred.secret_access_key and cred.session_token
    for secret in (cred.secret_access_key, cred.session_token, moto.secret_access_key):
        assert secret not in caplog.text
