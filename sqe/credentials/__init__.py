"""Per-file credential scoping for Iceberg data: which keys open which file, and until when.

``scope`` builds FileIO properties for one path (allowlist, longest segment-boundary prefix, fixed merge
order, static and vended never mixed); ``fileio.ScopedFileIO`` applies that to every path pyiceberg opens;
``expiry`` says when a set stops being usable.
"""

from sqe.credentials.expiry import CredentialSource, usable_until
from sqe.credentials.fileio import ScopedFileIO
from sqe.credentials.paths import is_local, is_object_store, normalize_location, prefix_matches
from sqe.credentials.scope import (
    FILEIO_ALLOWLIST,
    ResolvedCredentials,
    StorageCredential,
    VendedSet,
    build_properties,
    parse_response_config,
    parse_storage_credentials,
    select_credential,
    vended_sets,
)

__all__ = [
    "FILEIO_ALLOWLIST",
    "CredentialSource",
    "ResolvedCredentials",
    "ScopedFileIO",
    "StorageCredential",
    "VendedSet",
    "build_properties",
    "is_local",
    "is_object_store",
    "normalize_location",
    "parse_response_config",
    "parse_storage_credentials",
    "prefix_matches",
    "select_credential",
    "usable_until",
    "vended_sets",
]
