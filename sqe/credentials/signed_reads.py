"""Signed S3 GETs of a whole object or one byte range, without the HEAD pyarrow sends before every open.

pyarrow's Python API opens an S3 file by path alone, and every such open costs the store a HEAD (for the size).
Where SQE already knows what to read (a manifest list or manifest read whole on a cache miss; a byte range of a
data file whose size the manifest gives) it reads through :class:`SignedObject` instead: one GET per read,
signed with botocore's SigV4 signer and sent on the process's one bounded urllib3 pool.

**Addressing.** A :class:`SignedObject` is built from the same resolved set the pyarrow path gets
(:class:`sqe.credentials.scope.ResolvedCredentials`): the keys of its ``properties`` and the settings those
properties were built from (``settings``, parsed once in :mod:`sqe.credentials.model`; no setting is read back
out of the properties). It addresses what pyarrow's ``S3FileSystem`` addresses for those properties: the
endpoint (its scheme, else https), the region, path style unless the settings turn it off (pyarrow then gets
``s3.force-virtual-addressing`` true; virtual hosts when no endpoint is set: AWS itself), the session token in
the signed headers. Anything else (another scheme, no key pair, no region, a location with a query or fragment,
a dotted bucket on an AWS virtual host, a bucket or region that is no S3 name where it would be part of a host
name) gets no :class:`SignedObject`, and the caller keeps the pyarrow path.

**Errors** are the ``OSError`` classes the pyarrow path raises for the same answer, so every caller classifies
them as today: 404 → ``FileNotFoundError``, 403 → ``PermissionError``, anything else (400 ``ExpiredToken``,
5xx after retries, timeouts, a short body) → ``OSError``. 5xx, 429 and connection errors are retried twice
with a short backoff (pyarrow's S3 client makes three attempts too), honouring ``Retry-After``. A message
names the bucket, key, status and the store's error code and message only; the store's error body (which can
echo the signed headers) is otherwise never shown, and nothing here logs.

**Secrets.** The keys live in a botocore ``Credentials`` object inside the :class:`SignedObject`; its repr shows
the location only and it refuses pickling. Signed headers exist only for the one request being sent. botocore's
signer logs the canonical request (with the session token) at DEBUG: a filter on its logger drops the records
made while this module signs (other botocore users in the process keep theirs).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import quote

from sqe._text import SCRUBBED, first_line, without_secrets
from sqe.locations import normalize_location
from sqe.vocabulary import S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN

if TYPE_CHECKING:
    import urllib3
    from botocore.credentials import Credentials

    from sqe.credentials.model import StorageSettings
    from sqe.credentials.scope import ResolvedCredentials

__all__ = ["S3Address", "SignedObject", "close_pool", "s3_address", "signed_object"]

# The pool: at most this many connections per host at once (a read waits for a free one, at most its read
# timeout), and at most this many hosts (endpoints or virtual-host buckets) kept at once. pyarrow's S3 client
# allows 25 per client; these are shared by every credential set of the process.
POOL_CONNECTIONS_PER_HOST = 32
POOL_HOSTS = 16
RETRIES = 2  # three attempts in all, as pyarrow's S3 client makes
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
BACKOFF_SECONDS = 0.05
# Used when the settings name no timeout. Generous: a 2-core machine under load can be slow to accept.
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_READ_TIMEOUT = 60.0
_ERROR_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_ERROR_MESSAGE = re.compile(rb"<Message>([^<]{1,300})</Message>")
# What may become part of a host name. A bucket in a virtual host, or a region in AWS's, is the writer's or the
# catalog's text: ``@``, ``:`` or ``\`` there would make urllib3 send the signed request (key id, session token)
# to another host (``s3://evil.example:9000\/k`` -> ``http://evil.example:9000\.store/k``).
# S3 bucket names (one character too, as test stores allow):
_DNS_BUCKET = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?")
# Regions whose S3 hosts are under amazonaws.com: AWS's own partition and GovCloud (the partitions' region
# patterns). China (amazonaws.com.cn), the ISO partitions (c2s.ic.gov, sc2s.sgov.gov, ...), the European
# Sovereign Cloud (amazonaws.eu) and any region not known here keep the pyarrow path, which knows their domains.
_AMAZONAWS_COM_REGION = re.compile(r"(?:(?:us|eu|ap|sa|ca|me|af|il|mx)-[a-z]+|us-gov-[a-z]+)-[0-9]{1,2}")


# ------------------------------------------------------------------------------------------- addressing


@dataclass(frozen=True)
class S3Address:
    """Where one object is read from: the URL a request goes to, and the bucket and key for messages."""

    url: str = field(repr=False)  # path style or virtual host, as pyarrow addresses it; its endpoint may hold a user
    bucket: str
    key: str


def s3_address(location: str, settings: StorageSettings) -> S3Address | None:
    """The URL pyarrow's ``S3FileSystem`` would read ``location`` from under the FileIO properties of these
    settings, or None when this module does not handle the case (the caller then reads through pyarrow)."""
    normalized = normalize_location(location)
    scheme, sep, rest = normalized.partition("://")
    if scheme != "s3" or not sep or "?" in rest or "#" in rest:
        return None
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        return None
    region = settings.region
    if not region:
        return None
    quoted = quote(key, safe="/~")
    if settings.endpoint:
        # Virtual hosts only when path style is turned off: pyarrow's default for an endpoint is path style.
        return _endpoint_address(settings.endpoint, bucket, key, quoted, virtual=settings.path_style is False)
    if "." in bucket:
        return None  # a dotted bucket fails TLS on a virtual host
    if not _DNS_BUCKET.fullmatch(bucket) or not _AMAZONAWS_COM_REGION.fullmatch(region):
        return None  # not a host name part (see _DNS_BUCKET), or a region with a domain of its own
    return S3Address(f"https://{bucket}.s3.{region}.amazonaws.com/{quoted}", bucket, key)


def _endpoint_address(endpoint: str, bucket: str, key: str, quoted: str, virtual: bool) -> S3Address | None:
    """pyarrow takes the scheme from the endpoint when it has one (https otherwise), and addresses path style
    unless virtual addressing is forced."""
    url_scheme, sep, host = endpoint.partition("://")
    if not sep:
        url_scheme, host = "https", endpoint
    url_scheme = url_scheme.lower()
    if url_scheme not in ("http", "https") or not host or "/" in host.rstrip("/"):
        return None  # an endpoint with a path of its own: leave it to pyarrow
    host = host.rstrip("/")
    if virtual:
        if not _DNS_BUCKET.fullmatch(bucket):
            return None  # not a host name part (see _DNS_BUCKET)
        return S3Address(f"{url_scheme}://{bucket}.{host}/{quoted}", bucket, key)
    return S3Address(f"{url_scheme}://{host}/{quote(bucket, safe='')}/{quoted}", bucket, key)


def _timeout(text: str | None, default: float) -> float:
    """pyiceberg hands ``s3.connect-timeout`` / ``s3.request-timeout`` (seconds) to pyarrow as floats."""
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if value > 0 else default


# ------------------------------------------------------------------------------------------------ reads


class SignedObject:
    """One S3 object read under one credential set: whole (:meth:`read_all`) or by range (:meth:`read_at`).

    Thread-safe (each read signs and sends its own request). Never pickled; the repr names the object only."""

    def __init__(self, address: S3Address, credentials: ResolvedCredentials) -> None:
        from botocore.credentials import Credentials

        settings, keys = credentials.settings, credentials.properties
        if not settings.region:
            raise ValueError("a signed read needs a region to sign for")
        self.address = address
        self._region = settings.region
        self._credentials: Credentials = Credentials(
            keys[S3_ACCESS_KEY_ID], keys[S3_SECRET_ACCESS_KEY], keys.get(S3_SESSION_TOKEN) or None
        )
        self._secrets = tuple(
            value for value in (keys.get(k) for k in (S3_SECRET_ACCESS_KEY, S3_SESSION_TOKEN)) if value
        )
        self._connect_timeout = _timeout(settings.connect_timeout, DEFAULT_CONNECT_TIMEOUT)
        self._read_timeout = _timeout(settings.request_timeout, DEFAULT_READ_TIMEOUT)

    def read_all(self, limit: int | None = None) -> bytes:
        """The whole object, in one GET; with ``limit``, at most its first ``limit`` bytes (the rest unread)."""
        return self._get({}, expected=200, length=None, limit=limit)

    def read_at(self, length: int, offset: int) -> bytes:
        """``length`` bytes at ``offset`` in one ranged GET (pyarrow's ``NativeFile.read_at`` argument order)."""
        if length <= 0:
            return b""
        headers = {"Range": f"bytes={offset}-{offset + length - 1}"}
        return self._get(headers, expected=206, length=length)

    def close(self) -> None:
        """Nothing to release: connections belong to the process's pool."""

    def _get(self, headers: dict[str, str], *, expected: int, length: int | None, limit: int | None = None) -> bytes:
        import urllib3

        signed = self._signed_headers(headers)
        timeout = urllib3.Timeout(connect=self._connect_timeout, read=self._read_timeout)
        try:
            response = _pool().request(
                "GET",
                self.address.url,
                headers=signed,
                retries=_retry_policy(),
                timeout=timeout,
                pool_timeout=self._read_timeout,
                preload_content=limit is None,
                decode_content=False,  # the stored bytes exactly, as pyarrow reads them
            )
            data = response.data if limit is None else _read_at_most(response, limit)
        except urllib3.exceptions.HTTPError as exc:
            raise self._failure(OSError, f"request failed after retries ({_cause(exc)})") from None
        if response.status != expected:
            self._raise_for(response.status, data)
        if length is not None and len(data) != length:
            raise self._failure(OSError, f"expected {length} bytes, the store sent {len(data)}")
        return data

    def _signed_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """SigV4 (S3 flavour: unsigned payload over https) for one GET; the token goes in the signed headers."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method="GET", url=self.address.url, headers=headers)
        _quiet_signer_log()
        _signing.active = True
        try:
            S3SigV4Auth(self._credentials, "s3", self._region).add_auth(request)
        finally:
            _signing.active = False
        return dict(request.headers.items())

    def _raise_for(self, status: int, body: bytes) -> NoReturn:
        code, message = _error_parts(body)
        text = f"HTTP {status} {code}: {message}" if code else f"HTTP {status}"
        error_class: type[OSError] = OSError
        if status == 404:
            error_class = FileNotFoundError
        elif status == 403:
            error_class = PermissionError
        raise self._failure(error_class, text)

    def _failure(self, error_class: type[OSError], detail: str) -> OSError:
        detail = without_secrets(detail, self._secrets, marker=SCRUBBED)  # also as a URL's query quotes it
        where = f"When reading from key '{self.address.key}' in bucket '{self.address.bucket}'"
        return error_class(f"{where}: {first_line(detail)}")

    def __repr__(self) -> str:
        return f"SignedObject(bucket={self.address.bucket!r}, key={self.address.key!r})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("a SignedObject holds credentials and cannot be pickled")


def _read_at_most(response: urllib3.BaseHTTPResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of a streamed body. A body read to its end returns its connection to the pool; one
    cut short closes it (the rest is never read)."""
    try:
        data: bytes = response.read(limit, decode_content=False)
        if response.read(1, decode_content=False):
            response.close()
        return data
    finally:
        response.release_conn()


def signed_object(location: str, credentials: ResolvedCredentials) -> SignedObject | None:
    """A signed reader of ``location`` under this resolved set, or None to keep the pyarrow path (no key pair,
    or an addressing case this module leaves to pyarrow)."""
    keys = credentials.properties
    if not keys.get(S3_ACCESS_KEY_ID) or not keys.get(S3_SECRET_ACCESS_KEY):
        return None
    address = s3_address(location, credentials.settings)
    return None if address is None else SignedObject(address, credentials)


def _error_parts(body: bytes) -> tuple[str, str]:
    """The S3 error document's ``Code`` and ``Message`` only (its other fields can echo the signed request)."""
    return _element(_ERROR_CODE, body), _element(_ERROR_MESSAGE, body)


def _element(pattern: re.Pattern[bytes], body: bytes) -> str:
    found = pattern.search(body or b"")
    return found.group(1).decode("utf-8", "replace").strip() if found else ""


def _cause(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return type(reason).__name__ if isinstance(reason, BaseException) else type(exc).__name__


# ------------------------------------------------------------------------------------------ signer log

_signing = threading.local()  # .active: this thread is inside add_auth for this module
_filter_lock = threading.Lock()
_filter_installed: list[bool] = []


class _DropOwnSigningRecords(logging.Filter):
    """Drops botocore.auth records made while this module signs: they print the canonical request, whose
    signed headers hold the session token."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_signing, "active", False)


def _quiet_signer_log() -> None:
    with _filter_lock:
        if not _filter_installed:
            logging.getLogger("botocore.auth").addFilter(_DropOwnSigningRecords())
            _filter_installed.append(True)


# ------------------------------------------------------------------------------------------------- pool

_pool_lock = threading.Lock()
_pool_state: dict[str, object] = {}  # "pool": the PoolManager, "pid": the process that made it


def _pool() -> urllib3.PoolManager:
    """The process's one pool (a new one after a fork: sockets are never shared across processes)."""
    import urllib3

    with _pool_lock:
        pool = _pool_state.get("pool")
        if not isinstance(pool, urllib3.PoolManager) or _pool_state.get("pid") != os.getpid():
            from sqe.credentials._quick_ack import POOL_CLASSES

            pool = urllib3.PoolManager(num_pools=POOL_HOSTS, maxsize=POOL_CONNECTIONS_PER_HOST, block=True)
            pool.pool_classes_by_scheme = POOL_CLASSES  # no 40 ms stall behind a Nagle-bound store (see there)
            _pool_state.update(pool=pool, pid=os.getpid())
        return pool


def _retry_policy() -> urllib3.Retry:
    import urllib3

    return urllib3.Retry(
        total=RETRIES,
        redirect=0,
        status_forcelist=RETRY_STATUSES,
        allowed_methods=frozenset({"GET"}),
        backoff_factor=BACKOFF_SECONDS,
        respect_retry_after_header=True,
        raise_on_status=False,  # the last answer is classified like any other
        raise_on_redirect=False,
    )


def close_pool() -> None:
    """Close the pool's kept connections (at exit; a later read opens a new pool)."""
    with _pool_lock:
        pool = _pool_state.pop("pool", None)
        _pool_state.pop("pid", None)
    clear = getattr(pool, "clear", None)
    if clear is not None:
        clear()


atexit.register(close_pool)
