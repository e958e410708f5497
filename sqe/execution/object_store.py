"""pyarrow file systems for the paths that do not go through an Iceberg catalog (file table functions, external
tables, compaction outputs): built from one ``CredentialSet`` of the one credential model, never from ambient
AWS credentials.

The static ``[storage]`` pair becomes a ``CredentialSet`` with source ``static`` here (:func:`static_set`), with
SQE's endpoint / region / path-style settings from ``StoragePolicy``; a mount's own keys become one with the
same settings. Paths handed to pyarrow are ``bucket/key`` (no scheme): ``s3a://``/``s3n://`` are normalised first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from sqe.credentials import CredentialSet, StoragePolicy, StorageSettings, normalize_location
from sqe.credentials.policy import STATIC_PREFIX
from sqe.errors import CredentialError
from sqe.locations import is_object_store

if TYPE_CHECKING:
    from sqe.config import SQEConfig

__all__ = ["filesystem_for", "keyed_set", "object_path", "static_set"]

STATIC_PAIR_MISSING = (
    "no [storage] access_key_id/secret_access_key is configured: {what} read with the engine's static key only"
)


def keyed_set(
    policy: StoragePolicy, access_key_id: str, secret_access_key: str, session_token: str | None = None
) -> CredentialSet:
    """A key pair SQE holds itself (the ``[storage]`` pair or a mount's own), with SQE's storage settings."""
    return CredentialSet(
        prefix=STATIC_PREFIX,
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        session_token=session_token or None,
        source="static",
        settings=policy.local_settings(StorageSettings()),
    )


def static_set(config: SQEConfig, what: str) -> CredentialSet:
    """The ``[storage]`` pair as a credential set, whatever ``require_vended_credentials`` says (that setting is
    about Iceberg data; these paths have nothing to vend). Missing pair: CredentialError naming ``what``."""
    pair = config.static_key_pair()
    if pair is None:
        raise CredentialError(STATIC_PAIR_MISSING.format(what=what))
    policy = StoragePolicy.from_config(config)
    return keyed_set(policy, pair[0], pair[1], config.storage.session_token_value())


def filesystem_for(credentials: CredentialSet) -> pafs.S3FileSystem:
    """An S3 file system signing with exactly ``credentials`` (no ambient chain, no region discovery)."""
    settings = credentials.settings
    endpoint = settings.endpoint
    scheme = "https"
    if endpoint and "://" in endpoint:
        scheme, _, endpoint = endpoint.partition("://")
    return pafs.S3FileSystem(
        access_key=credentials.access_key_id,
        secret_key=credentials.secret_access_key,
        session_token=credentials.session_token,
        region=settings.region,
        endpoint_override=endpoint or None,
        scheme=scheme,
        force_virtual_addressing=settings.path_style is False,
        check_directory_existence_before_creation=False,
    )


def object_path(location: str) -> str:
    """``s3://bucket/key`` (or s3a/s3n) as pyarrow's ``bucket/key``."""
    normalized = normalize_location(location)
    if not is_object_store(normalized):
        raise CredentialError(f"{location} is not an s3:// location")
    return normalized.partition("://")[2]
