"""``sqe stack up --store external``: the stack's catalog (and whatever else ``up`` starts) against an S3 + STS
store that is already running — rustack, LocalStack, MinIO, Ceph RGW, AWS — instead of starting one.

The store is never started, stopped or configured here beyond creating the bucket when it is missing: ``stack
down`` stops only the processes ``up`` recorded, and the external store is not one of them.

The catalog's own key pair comes from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` in the environment of
``sqe stack up``, or from a key file (``--key-file``: ``KEY=VALUE`` lines, the env-file format docker compose
reads too). The role it assumes for vending comes from ``--role-arn``. Like the other stores, the key ends up
only in the 0600 ``catalog.toml``; it never reaches ``stack.json``, a log line or an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from sqe_stack.provision import StackError, StoreHandle

KIND = "external"
ACCESS_KEY_VAR = "AWS_ACCESS_KEY_ID"
SECRET_KEY_VAR = "AWS_SECRET_ACCESS_KEY"
# An IAM role ARN: partition, service iam, empty region, account (Ceph RGW leaves it empty), role path/name.
_ROLE_ARN = re.compile(r"^arn:[a-z-]+:iam::\d*:role/[\w+=,.@/-]+$")


@dataclass(frozen=True)
class ExternalStore:
    """Where the running store answers, the role the catalog assumes, and the catalog's own key pair."""

    s3_endpoint: str
    sts_endpoint: str
    role_arn: str
    access_key_id: str
    secret_access_key: str = field(repr=False)

    def handle(self) -> StoreHandle:
        """The store as the rest of ``stack up`` sees it: no daemons, so ``down`` has nothing of it to stop."""
        return StoreHandle(
            kind=KIND,
            s3_endpoint=self.s3_endpoint,
            sts_endpoint=self.sts_endpoint,
            role_arn=self.role_arn,
            access_key_id=self.access_key_id,
            secret_access_key=self.secret_access_key,
            daemons=(),
        )


def _check_endpoint(flag: str, url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise StackError(f"{flag} must be an http:// or https:// URL, got {url[:80]!r}")
    return url.rstrip("/")


def _check_role_arn(role_arn: str | None) -> str:
    if not role_arn:
        raise StackError("--store external needs --role-arn ARN (the role the catalog assumes to vend credentials)")
    if not _ROLE_ARN.match(role_arn):
        raise StackError(f"--role-arn {role_arn[:100]!r} is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)")
    return role_arn


def read_key_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (blank lines and ``#`` comments ignored, optional quotes); values never echoed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise StackError(f"cannot read key file {path}: {exc.strerror or 'unreadable'}") from None
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not name.strip():
            raise StackError(f"key file {path}, line {number}: expected NAME=VALUE")
        values[name.strip()] = value.strip().strip("'\"")
    return values


def catalog_key(environ: Mapping[str, str], key_file: Path | None) -> tuple[str, str]:
    """The catalog's key pair: from ``key_file`` when given, else from the environment. Both parts required."""
    source = read_key_file(key_file) if key_file is not None else environ
    where = f"key file {key_file}" if key_file is not None else "the environment"
    access_key, secret_key = source.get(ACCESS_KEY_VAR, ""), source.get(SECRET_KEY_VAR, "")
    if not access_key or not secret_key:
        missing = [n for n, v in ((ACCESS_KEY_VAR, access_key), (SECRET_KEY_VAR, secret_key)) if not v]
        raise StackError(f"--store external needs the catalog's key: {' and '.join(missing)} not set in {where}")
    return access_key, secret_key


def external_store(
    s3_endpoint: str | None,
    *,
    sts_endpoint: str | None = None,
    role_arn: str | None = None,
    key_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> ExternalStore:
    """Validate the flags of ``--store external`` into an :class:`ExternalStore` (one-line StackError)."""
    if not s3_endpoint:
        raise StackError("--store external needs --s3-endpoint URL (the running S3 store)")
    s3 = _check_endpoint("--s3-endpoint", s3_endpoint)
    sts = _check_endpoint("--sts-endpoint", sts_endpoint) if sts_endpoint else s3
    role = _check_role_arn(role_arn)
    access_key, secret_key = catalog_key(os.environ if environ is None else environ, key_file)
    return ExternalStore(
        s3_endpoint=s3,
        sts_endpoint=sts,
        role_arn=role,
        access_key_id=access_key,
        secret_access_key=secret_key,
    )
