"""Per-file FileIO properties from parsed catalog credentials (the core of SQE's credential handling).

For one data file path the properties are built in a fixed order, from an allowlist of S3 keys only:

1. the response ``config`` settings;
2. the usable ``storage-credentials`` set with the longest prefix covering the path on a segment boundary
   (``s3a://``/``s3n://`` count as ``s3://``); with no match, ``config`` alone stands;
3. SQE's own settings (:class:`~sqe.credentials.policy.StoragePolicy`): endpoint, region (always set), path
   style, and in static mode the ``[storage]`` pair;
4. if a set applies, exactly its keys go on top and every local credential key is removed, so static and
   vended keys never mix; if none does, the catalog's endpoint is dropped (SQE's key goes only to SQE's).

Table metadata properties are not an input at all: a table cannot choose the endpoint, a FileIO class or a
retry class. The key set is taken whole from one source (the matched set, else the ``config`` one), so keys
from two sets never mix either. A catalog set equal to SQE's static pair is treated as static.
"""

from __future__ import annotations

import dataclasses
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import NoReturn

from sqe._unpicklable import Unpicklable
from sqe.credentials.expiry import CredentialSource
from sqe.credentials.model import CREDENTIAL_KEYS, CatalogCredentials, CredentialSet, StorageSettings
from sqe.credentials.paths import prefix_length, prefix_matches
from sqe.credentials.policy import StoragePolicy
from sqe.errors import NoVendedCredentialsError
from sqe.locations import is_object_store
from sqe.vocabulary import S3_ACCESS_KEY_ID

_IDENTITY_KEY = secrets.token_bytes(32)


def credential_identity(prefix: str | None, source: str, properties: Mapping[str, str]) -> str:
    """The pool key of one resolved credential set: equal exactly when every property (keys included) is equal.

    An HMAC under a random per-process key: it reveals nothing about the secret it covers."""
    parts = [prefix or "", source, *(f"{name}={value}" for name, value in sorted(properties.items()))]
    return hmac.new(_IDENTITY_KEY, "\x00".join(parts).encode(), "sha256").hexdigest()


@dataclass(frozen=True)
class ResolvedCredentials(Unpicklable):
    """FileIO properties for one path. ``properties`` holds secrets and stays out of the repr."""

    properties: Mapping[str, str] = field(repr=False)
    source: CredentialSource
    prefix: str | None  # the storage-credentials prefix that matched; None for config or local keys
    expires_at_ms: int | None
    # The non-secret settings ``properties`` were built from, as parsed (readers that sign their own requests
    # address and time out from these, not by reading the properties back).
    settings: StorageSettings = field(repr=False)

    _pickle_refusal = "ResolvedCredentials holds secrets and cannot be pickled"

    @cached_property
    def identity(self) -> str:
        """Names this exact credential set (prefix, source, every property) without holding a secret: the key
        of the FileIO pool and of caches whose entries may serve only reads under that very set."""
        return credential_identity(self.prefix, self.source, self.properties)

    @property
    def expires_at(self) -> float | None:
        """Epoch seconds at which the keys stop working (None: no expiry known)."""
        return None if self.expires_at_ms is None else self.expires_at_ms / 1000.0


def select_credential(path: str, sets: Iterable[CredentialSet]) -> CredentialSet | None:
    """The set with the longest prefix covering ``path``; the first one wins a tie. Config sets never match."""
    covering = [s for s in sets if s.prefix is not None and prefix_matches(path, s.prefix)]
    # max() keeps the first of equally long prefixes.
    return max(covering, key=lambda s: prefix_length(s.prefix or ""), default=None)


def config_set(sets: Iterable[CredentialSet]) -> CredentialSet | None:
    """The set the catalog sent in the response ``config`` (no prefix of its own), if any."""
    return next((s for s in sets if s.prefix is None), None)


def vended_sets(catalog: CatalogCredentials, policy: StoragePolicy) -> tuple[CredentialSet, ...]:
    """Every set of a response (config first), minus those that are really SQE's static pair."""
    return tuple(s for s in catalog.sets if not policy.is_static_pair(s))


def build_properties(path: str, catalog: CatalogCredentials, policy: StoragePolicy) -> ResolvedCredentials:
    """FileIO properties for the data file ``path``, merged in the documented order."""
    matched = select_credential(path, catalog.sets)
    chosen = matched if matched is not None else config_set(catalog.sets)
    was_static_pair = chosen is not None and policy.is_static_pair(chosen)
    applied = None if was_static_pair else chosen
    # (1) response (or ticket) settings, (2) the matched set's own, (3) SQE's own.
    settings = policy.local_settings(
        catalog.settings if matched is None else catalog.settings.overlay(matched.settings)
    )
    if applied is None:
        # SQE's own key (the [storage] pair, or the AWS SDK's chain) is sent only where SQE's config says: a
        # catalog-named endpoint would receive requests signed by the engine (its key id, its session token).
        settings = dataclasses.replace(settings, endpoint=policy.endpoint)
    properties = settings.to_properties()
    if policy.static is not None:
        properties.update(policy.static.keys())
    # (4) the set's keys on top; every local credential key the catalog did not vend goes.
    if applied is not None:
        for key in CREDENTIAL_KEYS:
            properties.pop(key, None)
        properties.update(applied.keys())
    elif policy.require_vended and is_object_store(path):
        _raise_no_vended(path, was_static_pair)
    return ResolvedCredentials(
        properties=MappingProxyType(properties),
        source=_source(applied, properties),
        prefix=applied.prefix if applied is not None else None,
        expires_at_ms=applied.expires_at_ms if applied is not None else None,
        settings=settings,
    )


def _source(applied: CredentialSet | None, properties: Mapping[str, str]) -> CredentialSource:
    if applied is not None:
        return applied.source
    return "static" if S3_ACCESS_KEY_ID in properties else "none"


def _raise_no_vended(path: str, was_static_pair: bool) -> NoReturn:
    if was_static_pair:
        detail = "the catalog returned SQE's own static key, which is never treated as vended"
    else:
        detail = "the catalog vended no usable credentials for this location"
    raise NoVendedCredentialsError(
        f"no vended credentials for {path}: {detail}, and catalog.require_vended_credentials = true forbids "
        "static and ambient AWS credentials (does the catalog vend for this warehouse, and is "
        "access delegation enabled there?)"
    )
