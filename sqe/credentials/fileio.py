"""``ScopedFileIO``: a pyiceberg FileIO that opens every file with that file's own credential set.

pyiceberg's own FileIO picks one credential per table (by metadata location, raw ``startswith``) and merges
table properties into it. SQE instead resolves each path separately (see :mod:`sqe.credentials.scope`) and
opens it through the FileIO of that exact resolved set, so two prefixes with two key sets each sign with their own
key. Those FileIOs (and their pyarrow filesystems, clients and sockets) belong to the process-wide pool of
:mod:`sqe.credentials.pool`, which releases them when their credential expires: a ScopedFileIO keeps none of
its own, so a lease object kept somewhere (a cached table, an idle session) never keeps a connection pool alive.
Its own ``properties`` are empty: nothing secret is reachable from there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyiceberg.io import FileIO, InputFile, OutputFile

from sqe._text import iso_utc
from sqe._unpicklable import Unpicklable
from sqe.credentials.expiry import CredentialSource, is_expired, usable_until
from sqe.credentials.model import CatalogCredentials, CredentialSet, StorageSettings, parse_catalog_credentials
from sqe.credentials.paths import covered_by_any, has_dot_segment
from sqe.credentials.policy import STATIC_PREFIX, StoragePolicy
from sqe.credentials.pool import FILE_IOS, PooledFileIO
from sqe.credentials.scope import ResolvedCredentials, build_properties, config_set, select_credential, vended_sets
from sqe.errors import CredentialError, CredentialExpiredError
from sqe.locations import is_local, is_object_store, scheme_of

# Fetches the table's current credentials from the catalog, as the same user (credentials endpoint or reload).
Refresher = Callable[[], CatalogCredentials]


class ScopedFileIO(Unpicklable, FileIO):
    """Routes each path to the FileIO built for its own credential set. Never pickled (it holds secrets)."""

    _pickle_refusal = "ScopedFileIO holds credentials and cannot be pickled; ship a scan ticket instead"

    def __init__(
        self,
        sets: Sequence[CredentialSet],
        policy: StoragePolicy,
        *,
        settings: StorageSettings | None = None,
        received_at: float | None = None,
        location: str | None = None,
        refresher: Refresher | None = None,
    ) -> None:
        """``settings``: the response-wide (or ticket-wide) settings under every set's own. ``location`` (the
        table location), when given, is resolved now so a table without the credentials it needs fails at load
        time rather than mid-scan. ``refresher``: how to fetch new sets once one in use reaches its usable point
        (a long scan); without it, a file is never opened with an expired set (``CredentialExpiredError``)."""
        super().__init__(properties={})
        self._catalog = CatalogCredentials(settings or StorageSettings(), tuple(sets))
        self._policy = policy
        self.received_at = time.time() if received_at is None else received_at
        self._vended = vended_sets(self._catalog, policy)
        self._location = location
        self._refresher = refresher
        self._refresh_lock = threading.Lock()  # one refresh at a time (single flight)
        self._lock = threading.Lock()
        self._resolved: dict[tuple[int, bool], ResolvedCredentials] = {}
        self._identities: set[str] = set()  # of the pooled FileIOs used so far (inspection only)
        # What earlier (since refreshed) vended sets covered; a config-level set covered every S3 path.
        self._once_vended: tuple[str, ...] = ()
        if location is not None:
            self.resolve(location)

    @classmethod
    def from_response(
        cls,
        response: Mapping[str, Any],
        policy: StoragePolicy,
        *,
        received_at: float | None = None,
        location: str | None = None,
        refresher: Refresher | None = None,
    ) -> ScopedFileIO:
        """From a raw load-table (or create-table) JSON response."""
        catalog = parse_catalog_credentials(response)
        return cls(
            catalog.sets,
            policy,
            settings=catalog.settings,
            received_at=received_at,
            location=location,
            refresher=refresher,
        )

    @property
    def settings(self) -> StorageSettings:
        """The response-wide (load-table ``config``) storage settings every set's own go on top of. No secret."""
        with self._lock:
            return self._catalog.settings

    @property
    def credential_sets(self) -> tuple[CredentialSet, ...]:
        """The sets this FileIO reads with, minus any that are SQE's own static pair (config's first)."""
        return self._vended

    # -------------------------------------------------------------------------------------- resolution

    def set_for(self, location: str) -> CredentialSet | None:
        """The set with the longest prefix covering ``location`` (None: only config keys or local ones)."""
        return select_credential(location, self._catalog.sets)

    def resolve(self, location: str) -> ResolvedCredentials:
        """The credential set (and FileIO properties) ``location`` is read or written with."""
        object_store = is_object_store(location)
        if not object_store and not is_local(location):
            raise CredentialError(
                f"unsupported storage scheme {scheme_of(location)!r} in {location}: SQE reads Iceberg data "
                "only from s3://, s3a://, s3n:// and file:// locations"
            )
        if not object_store and self._location is not None and is_object_store(self._location):
            # Paths in manifests are the writer's text: a table in object storage never makes the engine (in
            # ``sqe serve`` the server process) read its own local files.
            raise CredentialError(f"refusing {location}: a local path in a table stored in object storage")
        if object_store and has_dot_segment(location):
            # The store client resolves them, so the object read is not the one the credentials were chosen for.
            raise CredentialError(f"refusing {location}: an object-store path with a '.' or '..' segment")
        # One snapshot of the sets and their resolutions: a refresh swaps both, and an index into one catalog's
        # sets must never key a resolution built from another's.
        with self._lock:
            catalog, resolutions, once_vended = self._catalog, self._resolved, self._once_vended
        matched = select_credential(location, catalog.sets)
        index = next((i for i, found in enumerate(catalog.sets) if found is matched), -1)
        key = (index, object_store)
        with self._lock:
            resolved = resolutions.get(key)
        if resolved is None:
            resolved = build_properties(location, catalog, self._policy)
            with self._lock:
                resolved = resolutions.setdefault(key, resolved)
        if object_store and resolved.source != "vended" and covered_by_any(location, once_vended):
            # A refresh dropped the vended set this path was read with: never go on with other keys.
            raise CredentialError(
                f"the credential refresh returned no credentials for {location}, which the table's earlier "
                "credentials covered"
            )
        return resolved

    def _file_io_for(self, location: str) -> PooledFileIO:
        resolved = self._usable_resolution(location)
        with self._lock:
            self._identities.add(resolved.identity)
        return FILE_IOS.file_io(resolved.identity, resolved.properties, resolved.expires_at)

    def _usable_resolution(self, location: str) -> ResolvedCredentials:
        """``resolve(location)``, refreshed first when its set is past its usable point; never an expired set."""
        resolved = self.resolve(location)
        if self._usable(resolved):
            return resolved
        if self._refresher is not None:
            with self._refresh_lock:
                resolved = self.resolve(location)
                if not self._usable(resolved):  # (unless another reader has just refreshed)
                    self._refresh(self._refresher)
                    resolved = self.resolve(location)
        scope = f"the credentials for {location} (prefix {resolved.prefix or '*'})"
        if is_expired(resolved.expires_at_ms):
            refresh = "even after a refresh" if self._refresher is not None else "and cannot be refreshed here"
            raise CredentialExpiredError(f"{scope} expired at {iso_utc(resolved.expires_at)} {refresh}")
        if self._refresher is not None and not self._usable(resolved):
            raise CredentialExpiredError(f"{scope} are past their usable point even after a refresh")
        return resolved

    def _usable(self, resolved: ResolvedCredentials) -> bool:
        max_age = self._policy.max_age_seconds
        with self._lock:
            received_at = self.received_at
        limit = usable_until(resolved.expires_at_ms, received_at, source=resolved.source, max_age_seconds=max_age)
        return limit is None or time.time() < limit

    def _refresh(self, refresher: Refresher) -> None:
        """Take the catalog's current sets (under the same response settings); a narrower answer fails."""
        received_at = time.time()
        found = refresher()
        catalog = CatalogCredentials(self._catalog.settings.overlay(found.settings), found.sets)
        fresh = vended_sets(catalog, self._policy)
        fresh_config = config_set(fresh) is not None
        for old in self._vended:
            where = old.prefix if old.prefix is not None else self._location
            covered = fresh_config or (where is not None and covered_by_any(where, (f.prefix or "" for f in fresh)))
            if not covered:
                # Reading on would fall back to other keys (or none) for files the old set covered.
                raise CredentialError(
                    f"the credential refresh returned no credentials for {where or 'the table'}, which the "
                    "table's earlier credentials covered"
                )
        earlier = tuple(old.prefix if old.prefix is not None else STATIC_PREFIX for old in self._vended)
        with self._lock:
            self._catalog, self._vended, self.received_at = catalog, fresh, received_at
            self._once_vended = tuple(dict.fromkeys((*self._once_vended, *earlier)))
            self._resolved = {}  # a new map: a resolve still working on the old sets fills the old one

    def pooled_file_ios(self) -> list[PooledFileIO]:
        """The pool's FileIOs this ScopedFileIO has opened files through and that are still pooled."""
        with self._lock:
            identities = sorted(self._identities)
        pooled = (FILE_IOS.peek(identity) for identity in identities)
        return [file_io for file_io in pooled if file_io is not None]

    def new_input(self, location: str) -> InputFile:
        return self._file_io_for(location).new_input(location)

    def new_output(self, location: str) -> OutputFile:
        return self._file_io_for(location).new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        path = location.location if isinstance(location, (InputFile, OutputFile)) else location
        self._file_io_for(path).delete(path)

    # ----------------------------------------------------------------------------------- expiry, EXPLAIN

    @property
    def source(self) -> CredentialSource:
        """ "vended" if any vended set is in use, else "static" (a static set or pair in use) or "none"."""
        if any(s.source == "vended" for s in self._vended):
            return "vended"
        return "static" if self._vended or self._policy.static is not None else "none"

    @property
    def expires_at(self) -> float | None:
        """Earliest expiry (epoch seconds) among the vended sets that name one."""
        return min((s.expires_at for s in self._vended if s.expires_at is not None), default=None)

    @property
    def usable_until(self) -> float | None:
        """Epoch seconds after which this FileIO must not be used (reload the table); None: no limit."""
        points = [self._usable_until(s) for s in self._vended]
        return min((p for p in points if p is not None), default=None)

    def is_usable(self, now: float | None = None) -> bool:
        limit = self.usable_until
        return limit is None or (time.time() if now is None else now) < limit

    def _usable_until(self, found: CredentialSet) -> float | None:
        max_age = self._policy.max_age_seconds
        return usable_until(found.expires_at_ms, self.received_at, source=found.source, max_age_seconds=max_age)

    def describe(self) -> list[dict[str, Any]]:
        """One row per credential scope, for EXPLAIN: prefix, source, expiry. Never a secret."""
        rows: list[dict[str, Any]] = []
        for found in self._catalog.sets:
            if found.prefix is None:
                continue
            used = next((v for v in self._vended if v.prefix == found.prefix), None)
            rows.append(self._describe_row(found.prefix, used, "static"))
        fallback: CredentialSource = "static" if self._policy.static is not None else "none"
        rows.append(self._describe_row("*", config_set(self._vended), fallback))
        return rows

    def _describe_row(self, prefix: str, used: CredentialSet | None, otherwise: CredentialSource) -> dict[str, Any]:
        if used is None:
            return {"prefix": prefix, "source": otherwise, "expires_at": None, "usable_until": None}
        return {
            "prefix": prefix,
            "source": used.source,
            "expires_at": iso_utc(used.expires_at),
            "usable_until": iso_utc(self._usable_until(used)),
        }

    # ------------------------------------------------------------------------------------------ safety

    def __copy__(self) -> ScopedFileIO:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ScopedFileIO:
        return self

    def __repr__(self) -> str:
        scopes = sum(1 for found in self._catalog.sets if found.prefix is not None)
        until = iso_utc(self.usable_until)
        return f"ScopedFileIO(source={self.source!r}, scoped_prefixes={scopes}, usable_until={until!r})"
