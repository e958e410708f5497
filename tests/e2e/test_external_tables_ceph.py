"""On Ceph RGW, a mount's keys that cannot write cannot be used to write.

The key is a real RGW read-only key: a subuser of the bucket owner created with ``--access=read`` (RGW applies
a subuser's permission mask to its S3 requests). With that key as the mount's own (sealed) keys:

- SQE reads the partitioned mount, partition values included;
- SQE refuses an INSERT (and a DELETE) into the external table with a typed error: it has no write path;
- RGW itself denies a PUT signed directly with the same key, so the key really is read-only.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from cryptography.fernet import Fernet

import sqe.api
from sqe.errors import ExternalAccessError
from sqe_stack import StackInfo, admin_s3_client

pytestmark = [pytest.mark.e2e, pytest.mark.ceph]
KEY_ENV = "SQE_EXTERNAL_TABLES_KEY"


def read_only_key(stack: StackInfo) -> tuple[str, str]:
    """A new S3 key of a read-only subuser of the bucket owner (radosgw-admin generates it: no secret on argv)."""
    subuser = f"catalog:ro{uuid.uuid4().hex[:6]}"
    conf = stack.dir / "ceph" / "ceph.conf"
    command = ["radosgw-admin", "-c", str(conf), "subuser", "create", "--uid=catalog", f"--subuser={subuser}"]
    out = subprocess.run(
        [*command, "--access=read", "--key-type=s3", "--gen-access-key", "--gen-secret"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    key = next(k for k in json.loads(out)["keys"] if k["user"] == subuser)
    return str(key["access_key"]), str(key["secret_key"])


def s3_with(stack: StackInfo, access_key: str, secret_key: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=stack.s3_endpoint,
        region_name=stack.region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def put_mount_files(stack: StackInfo) -> str:
    """A fresh bucket owned by the catalog user: ``sales/region=<r>/part-0.parquet`` (eu: ids 1, 2; us: 3)."""
    admin = admin_s3_client(stack)
    bucket = f"mount-{uuid.uuid4().hex[:8]}"
    admin.create_bucket(Bucket=bucket)
    for region, ids in (("eu", [1, 2]), ("us", [3])):
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": ids}), buffer)
        admin.put_object(Bucket=bucket, Key=f"sales/region={region}/part-0.parquet", Body=buffer.getvalue())
    return bucket


def put_status(client: Any, bucket: str, key: str) -> int:
    try:
        client.put_object(Bucket=bucket, Key=key, Body=b"x")
    except ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return 200


def test_a_read_only_rgw_key_reads_a_mount_and_cannot_write_through_it(
    ceph_stack: StackInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_ENV, Fernet.generate_key().decode())
    bucket = put_mount_files(ceph_stack)
    access_key, secret_key = read_only_key(ceph_stack)
    config = tmp_path / "sqe.toml"  # the writer's config, here: the definitions file is created beside it
    shutil.copy(ceph_stack.principal_config("writer"), config)
    config.chmod(0o600)
    location = f"s3://{bucket}/sales"
    with sqe.api.connect(config) as s:
        s.sql(
            f"CREATE EXTERNAL TABLE ext.ro (id BIGINT) STORED AS PARQUET LOCATION '{location}' "
            f"PARTITIONED BY (region VARCHAR) WITH (access_key_id = '{access_key}', secret_access_key = '{secret_key}')"
        )
        got = s.sql("SELECT id, region FROM ext.ro ORDER BY id").arrow().to_pylist()
        assert got == [{"id": 1, "region": "eu"}, {"id": 2, "region": "eu"}, {"id": 3, "region": "us"}]
        with pytest.raises(ExternalAccessError, match=r"ext\.ro is an external table: SQE reads mounts only"):
            s.sql("INSERT INTO ext.ro VALUES (4, 'eu')")
        with pytest.raises(ExternalAccessError, match="never writes to them"):
            s.sql("DELETE FROM ext.ro WHERE id = 1")
        assert s.sql("SELECT count(*) AS n FROM ext.ro").arrow().to_pylist() == [{"n": 3}]
    read_only = s3_with(ceph_stack, access_key, secret_key)
    assert read_only.get_object(Bucket=bucket, Key="sales/region=us/part-0.parquet")["Body"].read()
    assert put_status(read_only, bucket, "sales/region=eu/part-1.parquet") == 403, "RGW must deny the write"
    admin = admin_s3_client(ceph_stack)
    listed = admin.list_objects_v2(Bucket=bucket, Prefix="sales/")
    assert sorted(o["Key"] for o in listed["Contents"]) == [
        "sales/region=eu/part-0.parquet",
        "sales/region=us/part-0.parquet",
    ], "nothing was written"
    assert secret_key.encode() not in (tmp_path / "sqe-external-tables.db").read_bytes()
    assert secret_key not in caplog.text
