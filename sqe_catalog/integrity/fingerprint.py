"""A stored metadata file's fingerprint: proof, without parsing and checking it again, that it is the one verified.

A protected table's verified revision may answer a load only while its file in storage is unchanged, so a file
rewritten behind the catalog's back is refused (422) by the very next load, exactly as when every load read and
checked the file. Instead of a GET of the whole file, one HEAD (S3) or hash (local files) per load compares:

- S3: the object's ``ETag`` (the MD5 of a single-part upload's bytes), size, ``Last-Modified`` (set by the store
  on every write, not by the writer) and version id when the bucket keeps versions;
- local files: the SHA-256 of the bytes (reading a local file is cheap; parsing and checking it is the cost).

Any other scheme, or a fingerprint that cannot be taken (missing object, store error), yields None: the caller
then reads and verifies the file itself, so every error surfaces exactly as it would without the cache. The S3
client signs with the warehouse's own key, like the catalog's metadata I/O; errors are never logged or returned
(they could name the key id).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from sqe import vocabulary
from sqe_catalog.config import WarehouseConfig
from sqe_catalog.vending import keep_botocore_debug_out_of_logs

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["Fingerprint", "storage_fingerprint"]

# location -> fingerprint text, or None when the file's identity cannot be established cheaply
Fingerprint = Callable[[str], str | None]


def storage_fingerprint(warehouse: WarehouseConfig) -> Fingerprint:
    """The fingerprint function for metadata files of ``warehouse``."""
    s3 = _LazyS3(warehouse)

    def fingerprint(location: str) -> str | None:
        parts = urlsplit(location)
        if parts.scheme in vocabulary.OBJECT_STORE_SCHEMES:
            return _s3_fingerprint(s3.client(), parts.netloc, parts.path.lstrip("/"))
        if parts.scheme == "file":
            return _file_fingerprint(parts.path)
        return None

    return fingerprint


def _s3_fingerprint(client: S3Client, bucket: str, key: str) -> str | None:
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except (BotoCoreError, ClientError):  # no fingerprint: the caller reads the file (and reports what failed)
        return None
    etag, modified = head.get("ETag"), head.get("LastModified")
    if not etag or modified is None:
        return None
    return f"s3|{etag}|{head.get('ContentLength')}|{modified.isoformat()}|{head.get('VersionId', '')}"


def _file_fingerprint(path: str) -> str | None:
    # A local read is cheap (the parse is what the cache saves), and a hash of the bytes has no timestamp
    # granularity for a quick rewrite to hide in.
    try:
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None
    return f"file|{digest}"


class _LazyS3:
    """One S3 client per warehouse, made on first use (a file:// warehouse never makes one)."""

    def __init__(self, warehouse: WarehouseConfig) -> None:
        self._warehouse = warehouse
        self._lock = threading.Lock()
        self._client: S3Client | None = None

    def client(self) -> S3Client:
        with self._lock:
            if self._client is None:
                self._client = self._make()
            return self._client

    def _make(self) -> S3Client:
        keep_botocore_debug_out_of_logs()  # its DEBUG records carry signed request headers
        w = self._warehouse
        key_id, secret = w.static_key_pair() or (None, None)
        config = Config(
            retries={"mode": "standard", "max_attempts": 2},
            connect_timeout=5,
            read_timeout=5,
            s3={"addressing_style": "path" if w.path_style else "virtual"},
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=w.endpoint or None,
            region_name=w.region,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            config=config,
        )
