"""The default (flow-tier) object store: one moto server process speaking S3 + STS + IAM on loopback.

moto runs from the project's own virtualenv (no root, no apt). It issues real-looking STS session credentials
and S3 accepts them, but it evaluates neither the AssumeRole session policy nor token expiry: use the Ceph
store to test enforcement.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import boto3

from sqe_stack.provision import LOOPBACK, Daemon, StoreHandle, free_port, http_status, spawn, wait_until

ACCOUNT_ID = "123456789012"  # moto's default account
CATALOG_USER = "catalog"
ROLE_NAME = "lakehouse"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT_ID}:role/{ROLE_NAME}"
REGION = "us-east-1"


def _start_server(logs: Path, started: list[Daemon]) -> tuple[Daemon, str]:
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)]
    daemon = spawn("moto", argv, logs / "moto.log", markers=("moto.server", "-p", str(port)))
    started.append(daemon)
    endpoint = f"http://{LOOPBACK}:{port}"
    wait_until(
        lambda: http_status(f"{endpoint}/moto-api/") == 200,
        "moto server",
        timeout=60,
        watch=[daemon],
        log_hint=f" (see {logs / 'moto.log'})",
    )
    return daemon, endpoint


def _create_user_and_role(endpoint: str) -> tuple[str, str]:
    """IAM user ``catalog`` with a key (the catalog signs S3 and STS calls with it) and the role it assumes.

    With IAM auth off (moto's default) neither is checked, but creating them keeps the stack shaped like a
    real account, and the same setup keeps working if auth is switched on.
    """
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )
    iam.create_user(UserName=CATALOG_USER)
    iam.put_user_policy(
        UserName=CATALOG_USER,
        PolicyName="all",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        ),
    )
    key = iam.create_access_key(UserName=CATALOG_USER)["AccessKey"]
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT_ID}:user/{CATALOG_USER}"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=json.dumps(trust), MaxSessionDuration=43200)
    iam.put_role_policy(
        RoleName=ROLE_NAME,
        PolicyName="s3all",
        PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        ),
    )
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def start_moto(logs: Path, started: list[Daemon]) -> StoreHandle:
    """Start moto; the daemon is appended to ``started`` at once so a failed set-up can stop it."""
    daemon, endpoint = _start_server(logs, started)
    access_key, secret_key = _create_user_and_role(endpoint)
    return StoreHandle(
        kind="moto",
        s3_endpoint=endpoint,
        sts_endpoint=endpoint,
        role_arn=ROLE_ARN,
        access_key_id=access_key,
        secret_access_key=secret_key,
        daemons=(daemon,),
    )
