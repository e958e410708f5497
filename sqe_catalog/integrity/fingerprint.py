"""A stored metadata file's fingerprint: proof, without parsing and checking it again, that it is the one verified.

A protected table's verified revision may answer a load only while its file in storage is unchanged, so a file
rewritten behind the catalog's back is refused (422) by the very next load, exactly as when every load read and
checked the file. Instead of a GET of the whole file, one HEAD (S3) or hash (local files) per load compares:

- S3: the object's ``ETag`` (the MD5 of a single-part upload's bytes), size, ``Last-Modified`` (set by the store
  on every write, not by the writer) and version id when the bucket keeps versions;
- local files: the SHA-256 of the bytes (reading a local file is cheap; parsing and checking it is the cost).

Any other scheme, or a fingerprint that cannot be taken (missing object, store error), yields None: the caller
then reads and verifies the file itself, so every error surfaces exactly as it would without the cache. The
HEAD is signed with the warehouse's own key, like the catalog's metadata I/O (no static key: botocore's default
credential chain), and errors are never logged or returned (they could name the key id).

The HEAD is one SigV4-signed request on a small urllib3 pool rather than a boto3 ``head_object``: it runs on
every load of a protected table, and boto3's per-call machinery (event hooks, endpoint rules, parameter
validation, response parsing) cost the catalog about a quarter of a load's time. The address is the one
``sqe.credentials.signed_reads`` computes for the engine's reads (endpoint scheme, path or virtual style, AWS
virtual hosts without an endpoint); a location it does not handle gets no fingerprint (the file is read).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

import botocore.session
import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError

from sqe import vocabulary
from sqe.credentials import StorageSettings
from sqe.credentials.signed_reads import s3_address
from sqe_catalog.config import WarehouseConfig
from sqe_catalog.vending import keep_botocore_debug_out_of_logs

__all__ = ["Fingerprint", "storage_fingerprint"]

# location -> fingerprint text, or None when the file's identity cannot be established cheaply
Fingerprint = Callable[[str], str | None]


def storage_fingerprint(warehouse: WarehouseConfig) -> Fingerprint:
    """The fingerprint function for metadata files of ``warehouse``."""
    s3 = _SignedHead(warehouse)

    def fingerprint(location: str) -> str | None:
        parts = urlsplit(location)
        if parts.scheme in vocabulary.OBJECT_STORE_SCHEMES:
            return s3.fingerprint(location)
        if parts.scheme == vocabulary.FILE_SCHEME:
            return _file_fingerprint(parts.path)
        return None

    return fingerprint


def _file_fingerprint(path: str) -> str | None:
    # A local read is cheap (the parse is what the cache saves), and a hash of the bytes has no timestamp
    # granularity for a quick rewrite to hide in.
    try:
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None
    return f"file|{digest}"


class _SignedHead:
    """Signed HEADs of one warehouse's metadata files: credentials resolved on first use, one small pool."""

    # Never a redirect (as botocore): following one would hand the session token, which urllib3 does not strip
    # like Authorization, to the host the answer names; a 3xx is no fingerprint (the file is read instead).
    _RETRY = urllib3.Retry(
        total=1,
        connect=1,
        read=1,
        status=1,
        redirect=False,
        status_forcelist=(500, 502, 503, 504),
        backoff_factor=0.05,
    )
    _TIMEOUT = urllib3.Timeout(connect=5.0, read=5.0)

    def __init__(self, warehouse: WarehouseConfig) -> None:
        self._warehouse = warehouse
        # This store's settings in the engine's model: the address rule is shared.
        self._settings = StorageSettings(
            endpoint=warehouse.endpoint or None, region=warehouse.region, path_style=warehouse.path_style
        )
        self._lock = threading.Lock()
        self._credentials: Credentials | None = None
        self._pool: urllib3.PoolManager | None = None

    def fingerprint(self, location: str) -> str | None:
        address = s3_address(location, self._settings)
        if address is None:
            return None
        try:
            credentials, pool = self._client()
            frozen = credentials.get_frozen_credentials()  # a refreshing chain renews here, before it expires
            if not frozen.access_key or not frozen.secret_key:
                return None
            signing = Credentials(frozen.access_key, frozen.secret_key, frozen.token)
            request = AWSRequest(method="HEAD", url=address.url, headers={})
            S3SigV4Auth(signing, "s3", self._warehouse.region).add_auth(request)
            response = pool.request(
                "HEAD",
                address.url,
                headers=dict(request.headers.items()),
                retries=self._RETRY,
                timeout=self._TIMEOUT,
                redirect=False,
            )
        except (BotoCoreError, urllib3.exceptions.HTTPError, OSError, ValueError):
            return None  # no fingerprint: the caller reads the file (and reports what failed)
        if response.status != 200:
            return None
        headers = response.headers
        etag, modified = headers.get("ETag"), headers.get("Last-Modified")
        if not etag or not modified:
            return None
        return f"s3|{etag}|{headers.get('Content-Length')}|{modified}|{headers.get('x-amz-version-id', '')}"

    def _client(self) -> tuple[Credentials, urllib3.PoolManager]:
        with self._lock:
            if self._credentials is None or self._pool is None:
                keep_botocore_debug_out_of_logs()  # its DEBUG records carry signed request headers
                pair = self._warehouse.static_key_pair()
                found = Credentials(*pair) if pair else botocore.session.get_session().get_credentials()
                if found is None:
                    raise ValueError("no credentials for the warehouse's metadata files")
                self._credentials = found
                self._pool = urllib3.PoolManager(num_pools=4, maxsize=8)
            return self._credentials, self._pool
