"""The default (flow-tier) object store: one moto server process speaking S3 + STS + IAM on loopback.

moto comes with the ``stack`` extra (``pip install 'sqe[stack]'``) and runs from the project's own virtualenv
(no root, no apt). It issues real-looking STS session credentials and S3 accepts them, but it evaluates neither
the AssumeRole session policy nor token expiry: use the Ceph store to test enforcement.

``sqe stack up`` leaves moto's IAM auth off (its default); the test session turns it on with
:func:`enable_iam_auth` after set-up, so that only the keys created here (and vended ones) work.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from sqe._protogen import release_of
from sqe_stack.provision import (
    LOOPBACK,
    Daemon,
    MissingExtraError,
    StoreHandle,
    free_port,
    http_status,
    spawn,
    wait_until,
)

ACCOUNT_ID = "123456789012"  # moto's default account
CATALOG_USER = "catalog"
ROLE_NAME = "lakehouse"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT_ID}:role/{ROLE_NAME}"
REGION = "us-east-1"
# Kept equal to the `stack` extra in pyproject.toml: [lowest allowed, first refused).
MOTO_VERSION_RANGE = ((5, 2, 5), (6,))
INSTALL_HINT = "pip install 'sqe[stack]'"
_ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
_ALLOW_S3 = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


def moto_requirement() -> str:
    """The pip requirement the moto store needs, as the ``stack`` extra declares it."""
    low, high = MOTO_VERSION_RANGE
    return f"moto[server]>={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"


def check_moto_version(installed: str | None) -> None:
    """Fail with one line naming the extra when moto is missing (None) or outside the supported range."""
    low, high = MOTO_VERSION_RANGE
    if installed is None:
        raise MissingExtraError(f"the moto store needs {moto_requirement()} (not installed): {INSTALL_HINT}")
    if not low <= release_of(installed) < high:
        raise MissingExtraError(f"the moto store needs {moto_requirement()}, found moto {installed}: {INSTALL_HINT}")


def require_moto() -> None:
    """:func:`check_moto_version` for the moto installed in this environment."""
    try:
        installed: str | None = importlib.metadata.version("moto")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    check_moto_version(installed)


def launch_moto(log_path: Path, started: list[Daemon]) -> tuple[Daemon, str]:
    """Start ``python -m moto.server`` on a free loopback port; returns it and its endpoint once it answers.

    The daemon is appended to ``started`` at once, so a failed set-up can stop it.
    """
    require_moto()
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)]
    daemon = spawn("moto", argv, log_path, markers=("moto.server", "-p", str(port)))
    started.append(daemon)
    endpoint = f"http://{LOOPBACK}:{port}"
    wait_until(
        lambda: http_status(f"{endpoint}/moto-api/") == 200,
        "moto server",
        timeout=60,
        watch=[daemon],
        log_hint=f" (see {log_path})",
    )
    return daemon, endpoint


def _bootstrap_client(endpoint: str, service: str) -> Any:
    import boto3

    # Any key works while IAM auth is off, which it is until enable_iam_auth.
    return boto3.client(
        service,  # type: ignore[call-overload]
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="bootstrap",
        aws_secret_access_key="bootstrap",
    )


def create_catalog_identity(endpoint: str) -> tuple[str, str]:
    """IAM user ``catalog`` with a key (the catalog signs S3 and STS calls with it) and the role it assumes.

    With IAM auth off neither is checked, but creating them keeps the stack shaped like a real account, and the
    same setup keeps working once auth is switched on. Returns the user's access key id and secret.
    """
    iam = _bootstrap_client(endpoint, "iam")
    iam.create_user(UserName=CATALOG_USER)
    iam.put_user_policy(UserName=CATALOG_USER, PolicyName="all", PolicyDocument=json.dumps(_ALLOW_ALL))
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
    iam.put_role_policy(RoleName=ROLE_NAME, PolicyName="s3all", PolicyDocument=json.dumps(_ALLOW_S3))
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def enable_iam_auth(endpoint: str) -> None:
    """From now on moto authenticates and authorises every request (only keys it issued work)."""
    # A raw body, not a form: moto's reset-auth endpoint reads the text as the number of requests to skip.
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
    )
    with urllib.request.urlopen(request, timeout=10):
        pass


def start_moto(log_path: Path, started: list[Daemon]) -> StoreHandle:
    """Start moto with the catalog's user, key and role; the daemon is appended to ``started`` at once."""
    daemon, endpoint = launch_moto(log_path, started)
    return StoreHandle.one_endpoint("moto", endpoint, ROLE_ARN, create_catalog_identity(endpoint), (daemon,))
