"""The FileIO a fragment reads with: the ticket's credential sets only, checked before every file is opened.

It is the engine's own ``ScopedFileIO`` under the worker's storage policy (the ticket's sets only, no static
pair, no ambient chain): per file the set with the longest prefix covering the path, and a failure when none
does. Before opening a file it checks that set's expiry. Pushed sets replace the current ones between files: a
new ``ScopedFileIO`` serves files opened afterwards, while files already open keep the filesystem (and keys) they
were opened with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from pyiceberg.io import FileIO, InputFile, OutputFile

from sqe._text import iso_utc
from sqe.credentials import (
    CredentialSet,
    ResolvedCredentials,
    ScopedFileIO,
    StoragePolicy,
    StorageSettings,
    is_local,
    normalize_location,
)
from sqe.distributed.protocol.errors import MissingCredentialsError
from sqe.errors import CredentialExpiredError, WorkerError
from sqe.execution.local import QueryCancelledError

_WORKER_POLICY = StoragePolicy.for_worker()

OpenCallback = Callable[[CredentialSet], None]


def _prefix_key(prefix: str | None) -> str:
    return normalize_location(prefix or "").rstrip("/")


def _outlasts(pushed: CredentialSet, current: CredentialSet | None) -> bool:
    """Whether ``pushed`` may replace ``current``: nothing there yet, or it expires no sooner."""
    if current is None or current.expires_at_ms is None or pushed.expires_at_ms is None:
        return True
    return pushed.expires_at_ms >= current.expires_at_ms


class FragmentFileIO(FileIO):
    """Routes each path to its credential set; refuses expired or missing sets. Never pickled."""

    def __init__(
        self,
        credentials: Sequence[CredentialSet],
        storage: StorageSettings,
        *,
        cancel: threading.Event,
        pace_seconds: float = 0.0,
        allow_local: bool = False,
        clock: Callable[[], float] = time.time,
        on_open: OpenCallback | None = None,
    ) -> None:
        super().__init__(properties={})
        self._storage = storage
        self._lock = threading.Lock()  # guards the installed sets: pushes replace them while readers open files
        self._cancel = cancel
        self._pace_seconds = pace_seconds
        self._allow_local = allow_local
        self._clock = clock
        self._on_open = on_open
        self._credentials: tuple[CredentialSet, ...] = ()
        self._secrets: set[str] = set()
        self._scoped = self._install(credentials)

    # ---------------------------------------------------------------------------------------- reading

    def new_input(self, location: str) -> InputFile:
        self._pace()
        scoped, cred = self._covering(location)
        if cred is not None and self._on_open is not None:
            self._on_open(cred)
        return scoped.new_input(location)

    def resolve(self, location: str) -> ResolvedCredentials:
        """The set ``location`` is read with now, checked like ``new_input``. The engine's footer cache keys its
        entries by this set's scope, so a footer kept for one ticket serves only reads under that very set (a
        ticket carries only sets the catalog vended for its query, or the static pair it was given)."""
        scoped, _ = self._covering(location)
        return scoped.resolve(location)

    def _covering(self, location: str) -> tuple[ScopedFileIO, CredentialSet | None]:
        """The current scoped FileIO and the set covering ``location``, checked: never an uncovered object-store
        path, never an expired set (a refreshed set installed between files serves the next file)."""
        with self._lock:
            scoped = self._scoped
        cred = scoped.set_for(location)
        if cred is None:
            self._refuse_uncovered(location)
        else:
            self._check_expiry(cred)
        return scoped, cred

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

    def _check_expiry(self, cred: CredentialSet) -> None:
        if cred.is_expired(self._clock()):
            raise self.expired_error(cred)

    # ------------------------------------------------------------------------------------- refreshing

    def refresh(self, pushed: Sequence[CredentialSet]) -> None:
        """Replace the sets with the same prefixes (add new prefixes); files opened from now on use them.

        A pushed set never replaces one that stays valid longer: pushes can arrive out of order (a catch-up
        push sent before a refresh may land after it), and an older set must not displace a newer one until it
        expires. Merge and install happen under one lock, so two concurrent pushes cannot lose either.
        The caller has checked that every pushed set is complete.
        """
        with self._lock:
            merged = {_prefix_key(cred.prefix): cred for cred in self._credentials}
            for cred in pushed:
                key = _prefix_key(cred.prefix)
                if _outlasts(cred, merged.get(key)):
                    merged[key] = cred
            self._install_locked(list(merged.values()))

    def _install(self, credentials: Sequence[CredentialSet]) -> ScopedFileIO:
        with self._lock:
            return self._install_locked(credentials)

    def _install_locked(self, credentials: Sequence[CredentialSet]) -> ScopedFileIO:
        scoped = ScopedFileIO(credentials, _WORKER_POLICY, settings=self._storage)
        self._credentials = tuple(credentials)
        self._scoped = scoped
        for cred in credentials:
            self._secrets.update(v for v in (cred.access_key_id, cred.secret_access_key, cred.session_token) if v)
        return scoped

    def expired_set(self) -> CredentialSet | None:
        """A set of this fragment that is past its expiry now, if any (to explain a failed read)."""
        now = self._clock()
        with self._lock:
            credentials = self._credentials
        return next((cred for cred in credentials if cred.is_expired(now)), None)

    def expired_error(self, cred: CredentialSet) -> CredentialExpiredError:
        expires = cred.expires_at if cred.expires_at is not None else self._clock()
        return CredentialExpiredError(
            f"credentials for {cred.prefix} expired at {iso_utc(expires)} and no refreshed set arrived"
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
