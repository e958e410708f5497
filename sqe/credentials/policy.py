"""``StoragePolicy``: the small, frozen local rules a credential-scoped FileIO applies on top of catalog sets.

It is built from the engine config in one place (:meth:`StoragePolicy.from_config`); the scan worker uses
:meth:`StoragePolicy.for_worker` (only the ticket's sets, no static pair, no ambient chain). Nothing else about
the engine config reaches credential handling.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import NoReturn

from sqe.config import SQEConfig, StorageConfig
from sqe.credentials.model import CredentialSet, StorageSettings

STATIC_PREFIX = "s3://"  # the static pair covers every S3 path


def _pair_digest(pair: tuple[str, str]) -> str:
    return hashlib.sha256("\0".join(pair).encode()).hexdigest()


@dataclass(frozen=True)
class StoragePolicy:
    """Local settings that win over the catalog's, and which keys may be used at all.

    ``static`` is the ``[storage]`` pair, present only in static mode. ``require_vended``: an object-store path
    with no set handed to the FileIO (catalog-vended, or a ticket's) fails; no static or ambient key is used.
    A catalog set equal to the configured pair (known by digest only) is SQE's own key, never "vended".
    """

    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    default_region: str = StorageConfig.DEFAULT_REGION
    static: CredentialSet | None = field(default=None, repr=False)
    require_vended: bool = False
    max_age_seconds: float = 900.0
    static_pair_digest: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, config: SQEConfig) -> StoragePolicy:
        """The one place the engine config becomes credential policy."""
        storage, catalog = config.storage, config.catalog
        pair = config.static_key_pair()
        policy = cls(
            endpoint=storage.endpoint or None,
            region=storage.region or None,
            path_style=storage.path_style,
            default_region=storage.DEFAULT_REGION,
            require_vended=catalog.require_vended_credentials,
            max_age_seconds=float(catalog.credential_max_age_seconds),
            static_pair_digest=_pair_digest(pair) if pair is not None else None,
        )
        if pair is None or catalog.require_vended_credentials:
            return policy
        static = CredentialSet(
            prefix=STATIC_PREFIX,
            access_key_id=pair[0],
            secret_access_key=pair[1],
            session_token=storage.session_token_value() or None,
            source="static",
            settings=policy.local_settings(StorageSettings()),
        )
        return dataclasses.replace(policy, static=static)

    @classmethod
    def for_worker(cls) -> StoragePolicy:
        """A scan worker: the ticket's sets only (the ticket carries the coordinator's settings)."""
        return cls(require_vended=True)

    def local_settings(self, catalog: StorageSettings) -> StorageSettings:
        """The catalog's settings with SQE's own on top; the region is always set."""
        return catalog.overlay(
            StorageSettings(
                endpoint=self.endpoint,
                region=self.region or catalog.region or self.default_region,
                path_style=self.path_style,
            )
        )

    def is_static_pair(self, credentials: CredentialSet) -> bool:
        """Whether a catalog set is really SQE's own ``[storage]`` pair (then it is never treated as vended)."""
        return self.static_pair_digest is not None and _pair_digest(credentials.pair) == self.static_pair_digest

    def __reduce__(self) -> NoReturn:
        raise TypeError("StoragePolicy may hold the static key and cannot be pickled")
