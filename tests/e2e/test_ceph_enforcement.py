"""Enforcement tier: Ceph RGW really applies the catalog's per-table session policies and token expiry.

Clients hold no static S3 key: pyiceberg's RestCatalog and the raw REST calls authenticate to sqe-catalog as
the demo principals, and every S3 request below is signed with a credential the catalog vended for one table.
The writer creates two tables; the analyst (read grants only) and the writer then probe the store directly.
Vended credentials live 5 s (see ``ceph_stack`` in conftest.py).
"""

from __future__ import annotations

import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import requests
from botocore.config import Config
from botocore.exceptions import ClientError
from pyiceberg.catalog.rest import RestCatalog

from sqe.vocabulary import (
    ACCESS_DELEGATION_HEADER,
    ACCESS_TOKEN_TYPE,
    CAPABILITIES_HEADER,
    READ_RESTRICTIONS_V1,
    TOKEN_EXCHANGE_GRANT,
    VENDED_CREDENTIALS,
)
from sqe_stack import StackInfo
from sqe_stack.catalog import PrincipalSpec, create_principal

pytestmark = [pytest.mark.e2e, pytest.mark.ceph]

TABLES = ("orders", "salaries")
# What SQE sends: vended credentials, and the read-restrictions capability (a restricted table needs it).
GOVERNED = {ACCESS_DELEGATION_HEADER: VENDED_CREDENTIALS, CAPABILITIES_HEADER: READ_RESTRICTIONS_V1}
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["a", "b", "c"], pa.string())})


@dataclass(frozen=True)
class VendedTable:
    """What one loadTable with ``X-Iceberg-Access-Delegation: vended-credentials`` gave one principal."""

    bucket: str
    prefix: str  # the table location's key prefix, no trailing slash
    metadata_key: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False)
    expires_at_ms: int


def _rest_catalog(stack: StackInfo, principal: str) -> RestCatalog:
    creds = stack.principal_credentials(principal)
    return RestCatalog(
        f"sqe-{principal}",
        uri=stack.catalog_uri,
        credential=creds.credential,
        scope="PRINCIPAL_ROLE:ALL",
        warehouse=stack.warehouse,
    )


def _split(location: str) -> tuple[str, str]:
    parsed = urllib.parse.urlparse(location)
    return parsed.netloc, parsed.path.strip("/")


def _token(stack: StackInfo, principal: str) -> str:
    creds = stack.principal_credentials(principal)
    resp = requests.post(
        f"{stack.catalog_uri}/v1/oauth/tokens",
        timeout=10,
        data={
            "grant_type": "client_credentials",
            "client_id": creds.client_id,
            "client_secret": creds.client_secret,
            "scope": "PRINCIPAL_ROLE:ALL",
        },
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["access_token"])


def _table_url(stack: StackInfo, auth: dict[str, str], namespace: str, table: str) -> str:
    config = requests.get(
        f"{stack.catalog_uri}/v1/config", params={"warehouse": stack.warehouse}, headers=auth, timeout=10
    ).json()
    prefix = {**config.get("defaults", {}), **config.get("overrides", {})}["prefix"]
    return f"{stack.catalog_uri}/v1/{urllib.parse.quote(prefix, safe='')}/namespaces/{namespace}/tables/{table}"


def _vend(stack: StackInfo, principal: str, namespace: str, table: str, token: str = "") -> VendedTable:
    """Load ``table`` as ``principal`` (or with ``token``, e.g. a delegated one) asking for vended credentials."""
    auth = {"Authorization": f"Bearer {token or _token(stack, principal)}"}
    resp = requests.get(_table_url(stack, auth, namespace, table), headers={**auth, **GOVERNED}, timeout=10)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    bucket, table_prefix = _split(body["metadata"]["location"])
    _, metadata_key = _split(body["metadata-location"])
    cred = body["storage-credentials"][0]["config"]
    return VendedTable(
        bucket=bucket,
        prefix=table_prefix,
        metadata_key=metadata_key,
        access_key_id=cred["s3.access-key-id"],
        secret_access_key=cred["s3.secret-access-key"],
        session_token=cred["s3.session-token"],
        expires_at_ms=int(cred["s3.session-token-expires-at-ms"]),
    )


def _s3(stack: StackInfo, vended: VendedTable) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=stack.s3_endpoint,
        region_name=stack.region,
        aws_access_key_id=vended.access_key_id,
        aws_secret_access_key=vended.secret_access_key,
        aws_session_token=vended.session_token,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def _status(call: Callable[[], object]) -> int:
    """HTTP status of one S3 call: 200 when it succeeds, else the store's error status."""
    try:
        call()
    except ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return 200


@pytest.fixture(scope="module")
def namespace(ceph_stack: StackInfo) -> str:
    """A fresh namespace with two tables (no restrictions), created and filled by the writer through pyiceberg."""
    writer = _rest_catalog(ceph_stack, "writer")
    name = f"enf_{uuid.uuid4().hex[:8]}"
    writer.create_namespace(name)
    for table in TABLES:
        writer.create_table((name, table), schema=ROWS.schema).append(ROWS)
    return name


def test_writer_appends_and_analyst_reads_through_vended_credentials(ceph_stack: StackInfo, namespace: str) -> None:
    for principal in ("writer", "analyst"):
        table = _rest_catalog(ceph_stack, principal).load_table((namespace, "orders"))
        assert table.scan().to_arrow().sort_by("id").equals(ROWS)


def test_analyst_credential_cannot_write_its_own_table(ceph_stack: StackInfo, namespace: str) -> None:
    vended = _vend(ceph_stack, "analyst", namespace, "orders")
    s3 = _s3(ceph_stack, vended)
    assert _status(lambda: s3.get_object(Bucket=vended.bucket, Key=vended.metadata_key)["Body"].read()) == 200
    put_key = f"{vended.prefix}/data/analyst-was-here.parquet"
    assert _status(lambda: s3.put_object(Bucket=vended.bucket, Key=put_key, Body=b"x")) == 403
    assert _status(lambda: s3.delete_object(Bucket=vended.bucket, Key=vended.metadata_key)) == 403


def test_analyst_credential_cannot_read_another_tables_prefix(ceph_stack: StackInfo, namespace: str) -> None:
    other = _vend(ceph_stack, "analyst", namespace, "salaries")
    own = _vend(ceph_stack, "analyst", namespace, "orders")  # vended last: it is used at once, it lives 5 s
    s3 = _s3(ceph_stack, own)
    assert _status(lambda: s3.list_objects_v2(Bucket=own.bucket, Prefix=f"{own.prefix}/")) == 200
    assert _status(lambda: s3.get_object(Bucket=own.bucket, Key=other.metadata_key)["Body"].read()) == 403
    assert _status(lambda: s3.list_objects_v2(Bucket=own.bucket, Prefix=f"{other.prefix}/")) == 403
    assert _status(lambda: s3.list_objects_v2(Bucket=own.bucket)) == 403


def test_writer_credential_writes_only_under_its_table(ceph_stack: StackInfo, namespace: str) -> None:
    other = _vend(ceph_stack, "writer", namespace, "salaries")
    own = _vend(ceph_stack, "writer", namespace, "orders")  # vended last: it is used at once, it lives 5 s
    s3 = _s3(ceph_stack, own)
    own_key = f"{own.prefix}/data/writer-probe.bin"
    assert _status(lambda: s3.put_object(Bucket=own.bucket, Key=own_key, Body=b"ok")) == 200
    assert _status(lambda: s3.delete_object(Bucket=own.bucket, Key=own_key)) in (200, 204)
    other_key = f"{other.prefix}/data/writer-probe.bin"
    assert _status(lambda: s3.put_object(Bucket=own.bucket, Key=other_key, Body=b"no")) == 403
    assert _status(lambda: s3.get_object(Bucket=own.bucket, Key=other.metadata_key)["Body"].read()) == 403


def test_five_second_credential_is_rejected_once_expired(ceph_stack: StackInfo, namespace: str) -> None:
    vended = _vend(ceph_stack, "analyst", namespace, "orders")
    remaining_s = vended.expires_at_ms / 1000 - time.time()
    assert 0 < remaining_s <= 5.5  # a 5-second credential (possibly a cached one, past half its life)
    s3 = _s3(ceph_stack, vended)
    assert _status(lambda: s3.get_object(Bucket=vended.bucket, Key=vended.metadata_key)["Body"].read()) == 200
    time.sleep(remaining_s + 2)
    assert _status(lambda: s3.get_object(Bucket=vended.bucket, Key=vended.metadata_key)["Body"].read()) == 403


# ---------------------------------------------------------------------------------------------------------
# Governed access: credentials vended to a delegated token (the analyst, acting through a trusted reader)


def _admin(stack: StackInfo, *args: str) -> str:
    """``sqe-catalog admin ARGS`` against the stack's catalog, in-process (the command line's own code)."""
    import contextlib
    import io

    from sqe_catalog.cli import main as catalog_cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = catalog_cli(["admin", "--config", str(stack.catalog_config), *args])
    assert code == 0, err.getvalue()
    return out.getvalue()


def _delegated_token(stack: StackInfo, user: str, reader_id: str, reader_secret: str) -> str:
    """``user``'s token exchanged (RFC 8693) with the reader's: subject = the user, actor = the reader."""
    reader = requests.post(
        f"{stack.catalog_uri}/v1/oauth/tokens",
        timeout=10,
        data={
            "grant_type": "client_credentials",
            "client_id": reader_id,
            "client_secret": reader_secret,
            "scope": "PRINCIPAL_ROLE:ALL",
        },
    )
    assert reader.status_code == 200, reader.text
    reply = requests.post(
        f"{stack.catalog_uri}/v1/oauth/tokens",
        timeout=10,
        data={
            "grant_type": TOKEN_EXCHANGE_GRANT,
            "subject_token": _token(stack, user),
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "actor_token": reader.json()["access_token"],
            "actor_token_type": ACCESS_TOKEN_TYPE,
        },
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["access_token"])


# Ceph RGW accepts RoleSessionName only as [A-Za-z0-9_=,.@-]+ (no '+', unlike AWS): the catalog joins end
# user and reader with '=' (sqe_catalog.vending.role_session_name), so this also proves RGW takes the name.
def test_credentials_vended_to_a_delegated_token_read_only_the_tables_prefix_and_cannot_write(
    ceph_stack: StackInfo, tmp_path: Path
) -> None:
    writer = _rest_catalog(ceph_stack, "writer")
    namespace = f"gov_{uuid.uuid4().hex[:8]}"
    writer.create_namespace(namespace)
    for table in TABLES:
        writer.create_table((namespace, table), schema=ROWS.schema).append(ROWS)
    rules = tmp_path / "mask.json"
    rules.write_text('{"required-column-projections": [{"field-id": 2, "action": "mask-alphanum"}]}')
    target = ["--warehouse", ceph_stack.warehouse, "--namespace", namespace, "--table", "orders"]
    _admin(ceph_stack, "set-restrictions", *target, "--principal", "analyst", "--file", str(rules))
    reader = create_principal(
        ceph_stack.catalog_config, PrincipalSpec(f"ceph_reader_{uuid.uuid4().hex[:6]}", reader=True)
    )
    # The analyst's own token no longer gets the restricted table; the delegated one does.
    auth = {"Authorization": f"Bearer {_token(ceph_stack, 'analyst')}"}
    url = _table_url(ceph_stack, auth, namespace, "orders")
    refused = requests.get(url, headers={**auth, **GOVERNED}, timeout=10)
    assert refused.status_code == 403 and "s3.secret-access-key" not in refused.text
    token = _delegated_token(ceph_stack, "analyst", reader.client_id, reader.client_secret)
    other = _vend(ceph_stack, "writer", namespace, "salaries")
    own = _vend(ceph_stack, "analyst", namespace, "orders", token=token)  # vended last: it lives 5 s
    s3 = _s3(ceph_stack, own)
    assert _status(lambda: s3.get_object(Bucket=own.bucket, Key=own.metadata_key)["Body"].read()) == 200
    assert _status(lambda: s3.list_objects_v2(Bucket=own.bucket, Prefix=f"{own.prefix}/")) == 200
    assert _status(lambda: s3.get_object(Bucket=own.bucket, Key=other.metadata_key)["Body"].read()) == 403
    assert _status(lambda: s3.list_objects_v2(Bucket=own.bucket, Prefix=f"{other.prefix}/")) == 403
    assert _status(lambda: s3.put_object(Bucket=own.bucket, Key=f"{own.prefix}/data/x.parquet", Body=b"x")) == 403
    assert _status(lambda: s3.delete_object(Bucket=own.bucket, Key=own.metadata_key)) == 403
