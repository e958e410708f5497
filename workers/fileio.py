"""The FileIO a fragment reads with: the ticket's credential sets only, checked before every file is opened.

Per file it picks the set with the longest prefix covering the path (``sqe.credentials``, as on the coordinator)
and fails when none does: there is no fallback to ambient credentials. Before opening a file it checks that set's
expiry. Pushed sets replace the current ones between files: a new ``ScopedFileIO`` serves files opened afterwards,
while files already open keep the filesystem (and keys) they were opened with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import NoReturn

from pyiceberg.io import FileIO, InputFile, OutputFile

from sqe.config import CatalogConfig, SQEConfig
from sqe.credentials import ScopedFileIO, StorageCredential, is_local, normalize_location, select_credential
from sqe.errors import CredentialExpiredError, WorkerError
from sqe.execution.local import QueryCancelledError
from workers.errors import MissingCredentialsError
from workers.ticket import StorageOptions, TicketCredentials

# sqe.credentials needs an engine config: the worker's has no static key and requires vended-style key sets,
# so nothing but the ticket's sets can ever reach a FileIO.
_WORKER_CONFIG = SQEConfig(catalog=CatalogConfig(uri="sqe-worker:", warehouse="", require_vended_credentials=True))

OpenCallback = Callable[[TicketCredentials], None]


def _iso(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds")


def _prefix_key(prefix: str) -> str:
    return normalize_location(prefix).rstrip("/")


class FragmentFileIO(FileIO):
    """Routes each path to its credential set; refuses expired or missing sets. Never pickled."""

    def __init__(
        self,
        credentials: Sequence[TicketCredentials],
        storage: StorageOptions,
        *,
        cancel: threading.Event,
        pace_seconds: float = 0.0,
        allow_local: bool = False,
        clock: Callable[[], float] = time.time,
        on_open: OpenCallback | None = None,
    ) -> None:
        super().__init__(properties={})
        self._storage_config = storage.to_config()
        self._cancel = cancel
        self._pace_seconds = pace_seconds
        self._allow_local = allow_local
        self._clock = clock
        self._on_open = on_open
        self._lock = threading.Lock()
        self._credentials: tuple[TicketCredentials, ...] = ()
        self._storage_credentials: tuple[StorageCredential, ...] = ()
        self._secrets: set[str] = set()
        self._scoped = self._install(credentials)

    # ---------------------------------------------------------------------------------------- reading

    def new_input(self, location: str) -> InputFile:
        self._pace()
        with self._lock:
            scoped, credentials, storage_credentials = self._scoped, self._credentials, self._storage_credentials
        matched = select_credential(location, storage_credentials)
        if matched is None:
            self._refuse_uncovered(location)
        else:
            cred = credentials[storage_credentials.index(matched)]
            self._check_expiry(cred)
            if self._on_open is not None:
                self._on_open(cred)
        return scoped.new_input(location)

    def new_output(self, location: str) -> OutputFile:
        raise WorkerError("scan workers never write files")

    def delete(self, location: str | InputFile | OutputFile) -> None:
        raise WorkerError("scan workers never delete files")

    def _pace(self) -> None:
        """Test-only pacing: a pause before each file that a cancel interrupts."""
        if self._pace_seconds > 0 and self._cancel.wait(self._pace_seconds):
            raise QueryCancelledError()

    def _refuse_uncovered(self, location: str) -> None:
        if is_local(location) and self._allow_local:
            return
        raise MissingCredentialsError(
            f"no credential set in the ticket covers {location}; a worker never uses ambient credentials"
        )

    def _check_expiry(self, cred: TicketCredentials) -> None:
        if cred.is_expired(self._clock()):
            raise self.expired_error(cred)

    # ------------------------------------------------------------------------------------- refreshing

    def refresh(self, pushed: Sequence[TicketCredentials]) -> None:
        """Replace the sets with the same prefixes (add new prefixes); files opened from now on use them.

        The caller has checked that every pushed set is complete.
        """
        with self._lock:
            merged = {_prefix_key(cred.prefix): cred for cred in self._credentials}
        merged.update({_prefix_key(cred.prefix): cred for cred in pushed})
        self._install(list(merged.values()))

    def _install(self, credentials: Sequence[TicketCredentials]) -> ScopedFileIO:
        storage_credentials = tuple(cred.storage_credential() for cred in credentials)
        scoped = ScopedFileIO(self._storage_config, storage_credentials, _WORKER_CONFIG)
        with self._lock:
            self._credentials = tuple(credentials)
            self._storage_credentials = storage_credentials
            self._scoped = scoped
            for cred in credentials:
                self._secrets.update(v for v in (cred.access_key_id, cred.secret_access_key, cred.session_token) if v)
        return scoped

    def expired_set(self) -> TicketCredentials | None:
        """A set of this fragment that is past its expiry now, if any (to explain a failed read)."""
        now = self._clock()
        with self._lock:
            credentials = self._credentials
        return next((cred for cred in credentials if cred.is_expired(now)), None)

    def expired_error(self, cred: TicketCredentials) -> CredentialExpiredError:
        expires = cred.expires_at if cred.expires_at is not None else self._clock()
        return CredentialExpiredError(
            f"credentials for {cred.prefix} expired at {_iso(expires)} and no refreshed set arrived"
        )

    def secret_values(self) -> frozenset[str]:
        """Every key id, secret and token this FileIO has held, to scrub from error text (never to log)."""
        with self._lock:
            return frozenset(self._secrets)

    # ------------------------------------------------------------------------------------------ safety

    def __reduce__(self) -> NoReturn:
        raise TypeError("FragmentFileIO holds credentials and cannot be pickled")

    def __repr__(self) -> str:
        with self._lock:
            count = len(self._credentials)
        return f"FragmentFileIO(credential_sets={count})"
