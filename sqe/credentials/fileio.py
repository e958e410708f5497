"""``ScopedFileIO``: a pyiceberg FileIO that opens every file with that file's own credential set.

pyiceberg's own FileIO picks one credential per table (by metadata location, raw ``startswith``) and merges
table properties into it. SQE instead resolves each path separately (see :mod:`sqe.credentials.scope`) and
keeps one ``PyArrowFileIO`` per distinct resolved property set, so two prefixes with two key sets each sign
with their own key. Its own ``properties`` are empty: nothing secret is reachable from there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from pyiceberg.io import FileIO, InputFile, OutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO

from sqe.config import SQEConfig
from sqe.credentials.expiry import CredentialSource, usable_until
from sqe.credentials.paths import is_local, is_object_store, scheme_of
from sqe.credentials.scope import (
    ResolvedCredentials,
    StorageCredential,
    VendedSet,
    build_properties,
    parse_response_config,
    parse_storage_credentials,
    select_credential,
    vended_sets,
)
from sqe.errors import CredentialError


def _iso(epoch_seconds: float | None) -> str | None:
    if epoch_seconds is None:
        return None
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds")


class ScopedFileIO(FileIO):
    """Routes each path to the FileIO built for its own credential set. Never pickled (it holds secrets)."""

    def __init__(
        self,
        response_config: Mapping[str, str],
        storage_credentials: Sequence[StorageCredential],
        config: SQEConfig,
        *,
        received_at: float | None = None,
        location: str | None = None,
    ) -> None:
        """``location`` (the table location), when given, is resolved now so a table without the credentials
        it needs fails at load time rather than mid-scan."""
        super().__init__(properties={})
        self._response_config = dict(response_config)
        self._credentials = tuple(storage_credentials)
        self._config = config
        self.received_at = time.time() if received_at is None else received_at
        self._vended = vended_sets(self._response_config, self._credentials, config)
        self._lock = threading.Lock()
        self._resolved: dict[tuple[int, bool], ResolvedCredentials] = {}
        self._file_ios: dict[frozenset[tuple[str, str]], PyArrowFileIO] = {}
        if location is not None:
            self.resolve(location)

    @classmethod
    def from_response(
        cls,
        response: Mapping[str, Any],
        config: SQEConfig,
        *,
        received_at: float | None = None,
        location: str | None = None,
    ) -> ScopedFileIO:
        """From a raw load-table (or create-table) JSON response."""
        return cls(
            parse_response_config(response.get("config")),
            parse_storage_credentials(response.get("storage-credentials")),
            config,
            received_at=received_at,
            location=location,
        )

    # -------------------------------------------------------------------------------------- resolution

    def resolve(self, location: str) -> ResolvedCredentials:
        """The credential set (and FileIO properties) ``location`` is read or written with."""
        object_store = is_object_store(location)
        if not object_store and not is_local(location):
            raise CredentialError(
                f"unsupported storage scheme {scheme_of(location)!r} in {location}: SQE reads Iceberg data "
                "only from s3://, s3a://, s3n:// and file:// locations"
            )
        matched = select_credential(location, self._credentials)
        index = next((i for i, cred in enumerate(self._credentials) if cred is matched), -1)
        key = (index, object_store)
        with self._lock:
            cached = self._resolved.get(key)
        if cached is not None:
            return cached
        resolved = build_properties(location, self._response_config, self._credentials, self._config)
        with self._lock:
            return self._resolved.setdefault(key, resolved)

    def _file_io_for(self, location: str) -> PyArrowFileIO:
        resolved = self.resolve(location)
        with self._lock:
            file_io = self._file_ios.get(resolved.cache_key)
            if file_io is None:
                file_io = PyArrowFileIO(properties=dict(resolved.properties))
                self._file_ios[resolved.cache_key] = file_io
            return file_io

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
        """ "vended" if the catalog vended any usable set, else "static" (static pair in use) or "none"."""
        if self._vended:
            return "vended"
        return "static" if self._static_in_use else "none"

    @property
    def _static_in_use(self) -> bool:
        return self._config.static_key_pair() is not None and not self._config.catalog.require_vended_credentials

    @property
    def expires_at(self) -> float | None:
        """Earliest expiry (epoch seconds) among the vended sets that name one."""
        expiries = [v.expires_at_ms / 1000.0 for v in self._vended if v.expires_at_ms is not None]
        return min(expiries, default=None)

    @property
    def usable_until(self) -> float | None:
        """Epoch seconds after which this FileIO must not be used (reload the table); None: no limit."""
        points = [self._usable_until(v) for v in self._vended]
        return min((p for p in points if p is not None), default=None)

    def is_usable(self, now: float | None = None) -> bool:
        limit = self.usable_until
        return limit is None or (time.time() if now is None else now) < limit

    def _usable_until(self, vended: VendedSet) -> float | None:
        max_age = float(self._config.catalog.credential_max_age_seconds)
        return usable_until(vended.expires_at_ms, self.received_at, max_age_seconds=max_age)

    def describe(self) -> list[dict[str, Any]]:
        """One row per credential scope, for EXPLAIN: prefix, source, expiry. Never a secret."""
        rows: list[dict[str, Any]] = []
        for cred in self._credentials:
            if not cred.is_usable:
                continue
            vended = next((v for v in self._vended if v.prefix == cred.prefix), None)
            rows.append(self._describe_row(cred.prefix, vended, "static"))
        config_set = next((v for v in self._vended if v.prefix is None), None)
        fallback: CredentialSource = "static" if self._static_in_use else "none"
        rows.append(self._describe_row("*", config_set, fallback))
        return rows

    def _describe_row(self, prefix: str, vended: VendedSet | None, otherwise: CredentialSource) -> dict[str, Any]:
        if vended is None:
            return {"prefix": prefix, "source": otherwise, "expires_at": None, "usable_until": None}
        expires = None if vended.expires_at_ms is None else vended.expires_at_ms / 1000.0
        return {
            "prefix": prefix,
            "source": "vended",
            "expires_at": _iso(expires),
            "usable_until": _iso(self._usable_until(vended)),
        }

    # ------------------------------------------------------------------------------------------ safety

    def __reduce__(self) -> NoReturn:
        raise TypeError("ScopedFileIO holds credentials and cannot be pickled; ship a scan ticket instead")

    def __copy__(self) -> ScopedFileIO:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ScopedFileIO:
        return self

    def __repr__(self) -> str:
        scopes = sum(1 for cred in self._credentials if cred.is_usable)
        return (
            f"ScopedFileIO(source={self.source!r}, scoped_prefixes={scopes}, usable_until={_iso(self.usable_until)!r})"
        )
