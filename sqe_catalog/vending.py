"""STS credential vending with Polaris-shaped inline session policies.

Public contract used by ``sqe_catalog.api``:

- ``session_policy(locations, write) -> str``: the compact-JSON inline session policy (shape below).
- ``VendedCredential``: frozen dataclass (access_key_id, secret_access_key, session_token | None,
  expires_at_ms | None); ``.to_config()`` gives the Iceberg REST ``s3.*`` keys. Secrets stay out of its repr,
  and it refuses to be pickled.
- ``CredentialVendor(warehouse, *, clock=time.time, record_expiry=None)``
    ``.vend(principal, table_key, locations, write, reader=None) -> VendedCredential``: STS AssumeRole scoped to
    the locations, cached per (principal, table_key, write, locations, reader) while more than half its lifetime
    remains. The role session name names the end user and, for a delegated token, the reader acting for it
    (``role_session_name``), so store-side logs (CloudTrail, Ceph ops log) attribute every credential.
    STS failures raise ``ServiceUnavailableError`` (503) without any secret in the message. Each new
    credential's expiry (the ``Expiration`` STS answered) goes to ``record_expiry`` before the credential is
    handed out: reservations of places last until the credentials vended for them have expired.
    ``.assume_role_calls``: how many AssumeRole requests were made (benchmarks and tests).

A warehouse configured ``sts_unavailable = true`` gets no STS call at all: ``vend`` returns the warehouse's
static key pair (no session token, no expiry). That **gives up per-table scoping**: every client that may
read any table of the warehouse receives a key that can reach everything the static key can.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from sqe import vocabulary
from sqe.credentials.paths import prefix_matches
from sqe_catalog.config import WarehouseConfig
from sqe_catalog.errors import BadRequestError, ServiceUnavailableError

if TYPE_CHECKING:
    from mypy_boto3_sts import STSClient

__all__ = ["CredentialVendor", "VendedCredential", "session_policy"]

log = logging.getLogger("sqe_catalog.vending")

_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# IAM treats these as wildcards / policy variables in Resource and StringLike values; Polaris escapes them.
_IAM_ESCAPES = str.maketrans({"*": "${*}", "?": "${?}", "$": "${$}"})
# What both AWS STS and Ceph RGW accept in a RoleSessionName (RGW refuses "+", which AWS allows).
_SESSION_NAME_INVALID = re.compile(r"[^\w=,.@-]", re.ASCII)
_SESSION_NAME_MAX = 64
_READ_ACTIONS = ("s3:GetObject", "s3:GetObjectVersion")
_WRITE_ACTIONS = ("s3:PutObject", "s3:DeleteObject")


# ----------------------------------------------------------------------------------------------------
# Session policy


def _split_s3_location(location: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``; s3a/s3n count as s3; anything else is a ValueError."""
    scheme, sep, rest = location.partition("://")
    if not sep or scheme.lower() not in vocabulary.OBJECT_STORE_SCHEMES:
        raise ValueError(f"not an s3:// location: {location!r}")
    bucket, _, path = rest.partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"invalid bucket in location {location!r}")
    return bucket, path.rstrip("/")


def _is_within(path: str, parent: str) -> bool:
    """Bucket-relative paths: "" is the whole bucket."""
    return parent == "" or prefix_matches(path, parent)


def _outermost_by_bucket(locations: Sequence[str]) -> dict[str, list[str]]:
    """Bucket -> sorted paths, with duplicates and locations nested inside another location dropped."""
    by_bucket: dict[str, list[str]] = {}
    for bucket, path in sorted({_split_s3_location(loc) for loc in locations}):
        kept = by_bucket.setdefault(bucket, [])
        # Sorted order puts every parent before its children, so one look at the kept paths suffices.
        if not any(_is_within(path, parent) for parent in kept):
            kept.append(path)
    return by_bucket


def _wildcard_under(path: str) -> str:
    escaped = path.translate(_IAM_ESCAPES)
    return f"{escaped}/*" if escaped else "*"


def session_policy(locations: Sequence[str], write: bool) -> str:
    """The inline STS session policy for ``locations``, as compact JSON (Ceph RGW rejects any other spacing).

    Each location ``s3://bucket/path`` (s3a/s3n accepted) loses its trailing ``/``; duplicates and locations
    nested inside another are dropped. The IAM wildcard characters ``*``, ``?``, ``$`` in paths are escaped as
    ``${*}``, ``${?}``, ``${$}`` (as Polaris does). Exact shape, statements in this order::

        {"Version":"2012-10-17","Statement":[
          {"Effect":"Allow","Action":["s3:GetObject","s3:GetObjectVersion"(,"s3:PutObject","s3:DeleteObject")],
           "Resource":["arn:aws:s3:::<bucket>/<path>/*", ...every location, sorted by (bucket, path)]},
          then for each bucket, sorted by name:
          {"Effect":"Allow","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::<bucket>"],
           "Condition":{"StringLike":{"s3:prefix":["<path>/*", ...sorted]}}},
          {"Effect":"Allow","Action":["s3:GetBucketLocation"],"Resource":["arn:aws:s3:::<bucket>"]}
        ]}

    The write actions appear only when ``write`` is true. A bucket-root location ``s3://bucket`` yields
    ``arn:aws:s3:::<bucket>/*`` and the prefix ``*``.

    Raises ValueError for an empty list, a non-S3 location or an invalid bucket name.
    """
    if not locations:
        raise ValueError("no locations to scope the credential to")
    by_bucket = _outermost_by_bucket(locations)
    actions = [*_READ_ACTIONS, *_WRITE_ACTIONS] if write else list(_READ_ACTIONS)
    objects = [f"arn:aws:s3:::{b}/{_wildcard_under(p)}" for b, paths in by_bucket.items() for p in paths]
    statements: list[dict[str, Any]] = [{"Effect": "Allow", "Action": actions, "Resource": objects}]
    for bucket, paths in by_bucket.items():
        bucket_arn = f"arn:aws:s3:::{bucket}"
        prefixes = [_wildcard_under(p) for p in paths]
        statements.append(
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": prefixes}},
            }
        )
        statements.append({"Effect": "Allow", "Action": ["s3:GetBucketLocation"], "Resource": [bucket_arn]})
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, separators=(",", ":"))


# ----------------------------------------------------------------------------------------------------
# Credentials


@dataclass(frozen=True)
class VendedCredential:
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(repr=False)
    expires_at_ms: int | None

    def to_config(self) -> dict[str, str]:
        """The Iceberg REST ``storage-credentials[].config`` keys; token and expiry only when present."""
        config = {
            vocabulary.S3_ACCESS_KEY_ID: self.access_key_id,
            vocabulary.S3_SECRET_ACCESS_KEY: self.secret_access_key,
        }
        if self.session_token is not None:
            config[vocabulary.S3_SESSION_TOKEN] = self.session_token
        if self.expires_at_ms is not None:
            config[vocabulary.S3_SESSION_TOKEN_EXPIRES_AT_MS] = str(self.expires_at_ms)
        return config

    def __reduce__(self) -> NoReturn:
        # A pickle would carry the secret to wherever the bytes go (caches, queues, crash dumps).
        raise TypeError("VendedCredential holds secrets and cannot be pickled")

    def __copy__(self) -> VendedCredential:
        return self  # immutable, so copying is free and never goes through __reduce__

    def __deepcopy__(self, memo: dict[int, Any]) -> VendedCredential:
        return self


@dataclass(frozen=True)
class _CacheEntry:
    credential: VendedCredential
    reuse_until: float  # clock() seconds: issue time + half the lifetime


_CacheKey = tuple[str, str, bool, tuple[str, ...], str]  # (principal, table, write, locations, reader or "")
# With a reader, at most this much of the 64 characters goes to the reader's name, so the end user keeps room.
_SESSION_READER_MAX = 28


def role_session_name(principal: str, reader: str | None = None) -> str:
    """``sqe-<principal>`` or ``sqe-<principal>=<reader>`` made valid for both AWS STS and Ceph RGW
    (``[\\w=,.@-]{2,64}``): other characters become ``_``; a long end-user name is cut first, the reader's after
    28 characters. Principal names cannot contain ``=``, so the separator is unambiguous."""
    user = _SESSION_NAME_INVALID.sub("_", f"sqe-{principal}")
    if not reader:
        return user[:_SESSION_NAME_MAX]
    actor = _SESSION_NAME_INVALID.sub("_", reader)[:_SESSION_READER_MAX]
    return f"{user[: _SESSION_NAME_MAX - 1 - len(actor)]}={actor}"


def keep_botocore_debug_out_of_logs() -> None:
    # botocore's DEBUG records include raw STS response bodies, i.e. the vended secret key and session token.
    # Unless an operator configured the botocore logger explicitly, cap it at INFO so that running the catalog
    # with a DEBUG root logger cannot leak them.
    botocore_log = logging.getLogger("botocore")
    if botocore_log.level == logging.NOTSET:
        botocore_log.setLevel(logging.INFO)


class CredentialVendor:
    """Vends per-table STS credentials for one warehouse; thread-safe, one AssumeRole per key in flight.

    ``clock`` returns epoch seconds; it must agree with the STS server's clock because the cache compares it
    with the ``Expiration`` STS returns. ``sts_client`` replaces the boto3 client (tests only). ``record_expiry``
    gets each new credential's expiry (epoch ms) before it is handed out; an exception from it fails the vend.
    """

    def __init__(
        self,
        warehouse: WarehouseConfig,
        *,
        clock: Callable[[], float] = time.time,
        sts_client: STSClient | None = None,
        record_expiry: Callable[[int], None] | None = None,
    ) -> None:
        self._warehouse = warehouse
        self._clock = clock
        self._record_expiry = record_expiry
        self._lock = threading.Lock()
        self._cache: dict[_CacheKey, _CacheEntry] = {}
        self._in_flight: dict[_CacheKey, Future[VendedCredential]] = {}
        self._assume_role_calls = 0
        self._sts = sts_client
        if sts_client is None and not warehouse.sts_unavailable and warehouse.role_arn:
            self._sts = self._make_sts_client()

    @property
    def assume_role_calls(self) -> int:
        with self._lock:
            return self._assume_role_calls

    def vend(
        self, principal: str, table_key: str, locations: Sequence[str], write: bool, *, reader: str | None = None
    ) -> VendedCredential:
        """A credential limited to ``locations`` (read, or read+write), reused from the cache while fresh.

        ``reader``: the reader acting for ``principal`` (a delegated token); it joins the role session name and
        the cache key, so a credential vended through one reader is never handed to another caller.

        With ``sts_unavailable`` the warehouse's static key pair comes back instead (no scoping, no expiry).
        Raises BadRequestError for a location the policy cannot express (not s3://), ServiceUnavailableError
        when STS fails or the warehouse cannot vend.
        """
        if self._warehouse.sts_unavailable:
            return self._static_credential(principal, table_key, write)
        key: _CacheKey = (principal, table_key, write, tuple(locations), reader or "")
        with self._lock:
            entry = self._cache.get(key)
            fresh = entry is not None and self._clock() < entry.reuse_until
            if entry is not None and fresh and self._warehouse.credential_cache:
                self._log_vend(principal, table_key, write, "hit", entry.credential, reader)
                return entry.credential
            pending = self._in_flight.get(key)
            leader = pending is None
            if pending is None:
                pending = Future()
                self._in_flight[key] = pending
        if not leader:
            credential = pending.result()  # the leader's AssumeRole, or its exception
            self._log_vend(principal, table_key, write, "joined", credential, reader)
            return credential
        return self._lead_assume_role(key, pending)

    # -- internals --------------------------------------------------------------------------------

    def _make_sts_client(self) -> STSClient:
        keep_botocore_debug_out_of_logs()
        w = self._warehouse
        config = Config(
            parameter_validation=False,  # boto3 refuses DurationSeconds < 900; Ceph/moto tests need seconds
            retries={"mode": "standard", "max_attempts": 3},
            connect_timeout=5,
            read_timeout=5,
        )
        key_id, secret = w.static_key_pair() or (None, None)
        session = boto3.session.Session()
        return session.client(
            "sts",
            endpoint_url=w.sts_endpoint or w.endpoint or None,
            region_name=w.region,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=config,
        )

    def _static_credential(self, principal: str, table_key: str, write: bool) -> VendedCredential:
        w = self._warehouse
        pair = w.static_key_pair()
        if pair is None:
            raise ServiceUnavailableError(
                f"warehouse {w.name!r} has sts_unavailable = true but no static access key configured"
            )
        credential = VendedCredential(pair[0], pair[1], None, None)
        self._log_vend(principal, table_key, write, "static", credential)
        return credential

    def _lead_assume_role(self, key: _CacheKey, pending: Future[VendedCredential]) -> VendedCredential:
        principal, table_key, write, locations, reader = key
        try:
            issued_at = self._clock()
            credential = self._assume_role(principal, locations, write, reader)
            if self._record_expiry is not None and credential.expires_at_ms is not None:
                self._record_expiry(credential.expires_at_ms)
            entry = _CacheEntry(credential, self._reuse_until(issued_at, credential))
            with self._lock:
                self._drop_stale_entries()
                self._cache[key] = entry
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._in_flight[key]
        pending.set_result(credential)
        self._log_vend(principal, table_key, write, "miss", credential, reader)
        return credential

    def _reuse_until(self, issued_at: float, credential: VendedCredential) -> float:
        if credential.expires_at_ms is None:
            return issued_at  # unknown lifetime: never reuse
        # Lifetime as observed here, never longer than requested (guards against STS clocks running ahead).
        observed = credential.expires_at_ms / 1000 - issued_at
        lifetime = max(0.0, min(observed, float(self._warehouse.credential_lifetime_seconds)))
        return issued_at + lifetime / 2

    def _drop_stale_entries(self) -> None:
        now = self._clock()
        for stale in [k for k, e in self._cache.items() if e.reuse_until <= now]:
            del self._cache[stale]

    def _assume_role(self, principal: str, locations: Sequence[str], write: bool, reader: str) -> VendedCredential:
        w = self._warehouse
        if not w.role_arn or self._sts is None:
            raise ServiceUnavailableError(f"warehouse {w.name!r} has no role_arn configured for credential vending")
        try:
            policy = session_policy(locations, write)
        except ValueError as exc:
            raise BadRequestError(f"cannot vend credentials for warehouse {w.name!r}: {exc}") from None
        request: dict[str, Any] = {
            "RoleArn": w.role_arn,
            "RoleSessionName": role_session_name(principal, reader),
            "DurationSeconds": w.credential_lifetime_seconds,
            "Policy": policy,
        }
        if w.external_id:
            request["ExternalId"] = w.external_id
        with self._lock:
            self._assume_role_calls += 1
        try:
            response = self._sts.assume_role(**request)
            creds = response["Credentials"]
            return VendedCredential(
                access_key_id=creds["AccessKeyId"],
                secret_access_key=creds["SecretAccessKey"],
                session_token=creds["SessionToken"],
                expires_at_ms=int(creds["Expiration"].timestamp() * 1000),
            )
        except ClientError as exc:
            raise self._sts_failure(_describe_client_error(exc)) from None
        except BotoCoreError as exc:
            raise self._sts_failure(type(exc).__name__) from None
        except (KeyError, TypeError, AttributeError):
            raise self._sts_failure("malformed AssumeRole response") from None

    def _sts_failure(self, detail: str) -> ServiceUnavailableError:
        log.warning("STS AssumeRole failed for warehouse %s: %s", self._warehouse.name, detail)
        return ServiceUnavailableError(f"STS AssumeRole failed for warehouse {self._warehouse.name!r}: {detail}")

    def _log_vend(
        self,
        principal: str,
        table_key: str,
        write: bool,
        cache: str,
        credential: VendedCredential,
        reader: str | None = None,
    ) -> None:
        log.debug(
            "vend warehouse=%s principal=%s%s table=%s write=%s cache=%s expires_at_ms=%s",
            self._warehouse.name,
            principal,
            f" reader={reader}" if reader else "",
            table_key,
            write,
            cache,
            credential.expires_at_ms,
        )


def _describe_client_error(exc: ClientError) -> str:
    # Only the status and code: the server's message text may echo request parameters such as the policy.
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    code = exc.response.get("Error", {}).get("Code") or "Unknown"
    return f"HTTP {status} {code}"
