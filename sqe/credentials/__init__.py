"""Per-file credential scoping for Iceberg data: which keys open which file, and until when.

``model`` parses a catalog response once into immutable ``CredentialSet`` objects (strict, one completeness
rule); ``policy.StoragePolicy`` holds the local rules (SQE's settings win, static pair only in static mode);
``scope`` builds FileIO properties for one path (allowlist, longest segment-boundary prefix, fixed merge order,
static and vended never mixed); ``fileio.ScopedFileIO`` applies that to every path pyiceberg opens; ``expiry``
says when a set stops being usable.
"""

from typing import TYPE_CHECKING, Any

from sqe.credentials.expiry import CredentialSource, is_expired, usable_until
from sqe.credentials.model import (
    FILEIO_ALLOWLIST,
    VENDED_PARTS,
    CatalogCredentials,
    CredentialSet,
    StorageSettings,
    parse_catalog_credentials,
    parse_settings,
    parse_storage_credentials,
    parse_string_map,
)
from sqe.credentials.paths import covered_by_any, prefix_matches
from sqe.credentials.policy import StoragePolicy
from sqe.credentials.scope import ResolvedCredentials, build_properties, select_credential, vended_sets
from sqe.locations import is_local, is_object_store, normalize_location

# ``ScopedFileIO`` subclasses pyiceberg's FileIO (and imports its pyarrow FileIO): loaded on first access, so the
# credential rules themselves (used by file table functions too) do not import pyiceberg (start-up cost).
if TYPE_CHECKING:
    from sqe.credentials.fileio import ScopedFileIO

__all__ = [
    "FILEIO_ALLOWLIST",
    "VENDED_PARTS",
    "CatalogCredentials",
    "CredentialSet",
    "CredentialSource",
    "ResolvedCredentials",
    "ScopedFileIO",
    "StoragePolicy",
    "StorageSettings",
    "build_properties",
    "covered_by_any",
    "is_expired",
    "is_local",
    "is_object_store",
    "normalize_location",
    "parse_catalog_credentials",
    "parse_settings",
    "parse_storage_credentials",
    "parse_string_map",
    "prefix_matches",
    "select_credential",
    "usable_until",
    "vended_sets",
]


def __getattr__(name: str) -> Any:
    if name == "ScopedFileIO":
        from sqe.credentials.fileio import ScopedFileIO

        return ScopedFileIO
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
