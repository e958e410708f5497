"""Credential refresh for distributed scans: reload as the querying user before the usable point, then push.

One *lease* per (user, table) holds the table's current vended credential sets, their usable point
(``sqe.credentials.usable_until``) and the running fragments ("holders") that read with them. A single timer
thread wakes before the earliest usable point among leases that have holders and hands the lease to a small
pool; a lease is refreshed by one job at a time (single flight), however many files, fragments and workers
read the table. The job calls the lease's reloader (bound to the querying user's catalog session: the
credentials endpoint when the catalog advertises it, else a load-table that bypasses the metadata cache) and:

- a new complete set: the lease takes it and pushes it to every holder's worker (one call per worker and query);
- the same set again (the catalog served it from its own cache): nothing is pushed, the usable point moves on;
- no complete set, or any error (a revoked grant answers 403): nothing is pushed and refreshing stops for the
  lease; its workers keep their keys and fail cleanly once those expire.

Nothing here logs or reprs a key, a secret or a token: sets are named by prefix and a short key fingerprint.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqe._counters import Counters
from sqe._text import short_identity
from sqe.errors import SQEError

if TYPE_CHECKING:
    from sqe.catalog.base import TableIdent
    from sqe.credentials import CredentialSet

log = logging.getLogger(__name__)

# Refresh this far ahead of the usable point: a quarter of the time the set had left when it arrived, at least
# MIN_LEAD_SECONDS and at most MAX_LEAD_SECONDS (a one-hour STS set: one minute before its usable point).
LEAD_FRACTION = 0.25
MIN_LEAD_SECONDS = 0.2
MAX_LEAD_SECONDS = 60.0
# Generations whose keys a lease remembers for scrubbing worker text: far more refreshes than one fragment lives
# through with any real credential lifetime (a one-hour set refreshes about hourly), yet bounded for a lease that
# lives as long as the server.
HELD_GENERATIONS = 64


@dataclass(frozen=True)
class IncompleteSet:
    """A vended set left out because it is incomplete: the prefix it covers and the parts it lacks (no value)."""

    prefix: str
    missing: tuple[str, ...]


@dataclass(frozen=True)
class RefreshedSets:
    """What one reload produced: the complete vended sets and until when they may be used."""

    credentials: tuple[CredentialSet, ...] = field(repr=False)
    usable_until: float | None
    source: str  # "credentials-endpoint" or "load-table"
    dropped: tuple[IncompleteSet, ...] = ()  # vended sets left out by the completeness rule

    @property
    def incomplete(self) -> int:
        return len(self.dropped)


Reloader = Callable[[], RefreshedSets]


@dataclass(frozen=True)
class Holder:
    """A running fragment attempt that reads a leased table: where a push has to go."""

    worker: str
    query_id: str
    fragment_id: str


# Pushes ``credentials`` to the workers of ``holders`` (all of one table); errors are the pusher's to log.
Pusher = Callable[["TableIdent", Sequence[Holder], Sequence["CredentialSet"]], None]


def key_fingerprint(access_key_id: str) -> str:
    """A short, one-way name for a key id, for logs and statistics."""
    return hashlib.sha256(access_key_id.encode()).hexdigest()[:10]


def same_keys(a: Sequence[CredentialSet], b: Sequence[CredentialSet]) -> bool:
    """Whether two set lists carry the same keys for the same prefixes (then a push would change nothing)."""

    def keys(sets: Sequence[CredentialSet]) -> set[tuple[str | None, str, int | None]]:
        return {(s.prefix, s.access_key_id, s.expires_at_ms) for s in sets}

    return keys(a) == keys(b)


@dataclass
class LeaseStats(Counters):
    """Counters of one lease (tests and benchmarks); keys are kept only as :func:`key_fingerprint`."""

    reloads: int = 0
    pushes: int = 0  # refreshes that pushed a new set (each may reach several workers)
    unchanged: int = 0  # reloads that returned the set already held
    _key_fingerprints: set[str] = field(default_factory=set, repr=False)

    def saw_keys(self, credentials: Sequence[CredentialSet]) -> None:
        fingerprints = {key_fingerprint(c.access_key_id) for c in credentials}
        with self._lock:
            self._key_fingerprints.update(fingerprints)

    @property
    def key_fingerprints(self) -> frozenset[str]:
        """Every key this lease has held, by fingerprint (a copy)."""
        with self._lock:
            return frozenset(self._key_fingerprints)


@dataclass(eq=False)
class TableLease:
    """The current vended sets of one (user, table) and the fragments reading with them."""

    user: str
    ident: TableIdent
    credentials: tuple[CredentialSet, ...]
    usable_until: float | None
    reloader: Reloader
    obtained_at: float
    generation: int = 0
    holders: dict[str, Holder] = field(default_factory=dict)
    refreshing: bool = False
    stopped: str | None = None  # why refreshing stopped (never a secret)
    # Prefixes of sets a refresh dropped since the last load was adopted: a file only they covered must not go
    # on with other keys (the [storage] pair) on a later ticket, as on the local path (ScopedFileIO).
    dropped_prefixes: tuple[str, ...] = ()
    stats: LeaseStats = field(init=False)
    # The key ids, secrets and tokens of the lease's last HELD_GENERATIONS generations, newest last (never logged):
    # a running fragment may hold any of them (its ticket's, every push since), so a worker's text is scrubbed of all.
    _held: tuple[frozenset[str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stats = LeaseStats()
        self.stats.saw_keys(self.credentials)
        self._held = (_secrets_of(self.credentials),)

    def held(self, credentials: Sequence[CredentialSet]) -> None:
        """Remember ``credentials`` (the lease's new current sets) among the keys its fragments may hold."""
        self._held = (*self._held, _secrets_of(credentials))[-HELD_GENERATIONS:]

    def held_secrets(self) -> frozenset[str]:
        """Every key id, secret and token of the lease's recent generations (to scrub, never to log)."""
        return frozenset().union(*self._held)

    def __repr__(self) -> str:
        state = f"stopped: {self.stopped}" if self.stopped else "active"
        return f"TableLease({self.ident}, user={short_identity(self.user)!r}, generation={self.generation}, {state})"

    def due_at(self) -> float | None:
        """When to refresh: None while nobody reads, after a stop, or for sets without a usable limit."""
        if not self.holders or self.stopped or self.refreshing or self.usable_until is None:
            return None
        span = max(0.0, self.usable_until - self.obtained_at)
        lead = min(MAX_LEAD_SECONDS, max(MIN_LEAD_SECONDS, LEAD_FRACTION * span))
        return self.usable_until - lead


class CredentialRefresher:
    """Keeps leased credential sets fresh and pushes new ones to the workers that need them."""

    def __init__(
        self, push: Pusher, *, clock: Callable[[], float] = time.time, jobs: int = 2, background: bool = True
    ) -> None:
        """``background=False``: no timer thread; the owner calls :meth:`refresh_due` (tests)."""
        self._push = push
        self._clock = clock
        self._background = background
        self._leases: dict[tuple[str, TableIdent], TableLease] = {}
        self._cond = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="sqe-refresh")
        self._closed = False
        self._thread: threading.Thread | None = None

    # -- leases -----------------------------------------------------------------------------------------

    def lease(
        self,
        user: str,
        ident: TableIdent,
        credentials: Sequence[CredentialSet],
        usable_until: float | None,
        reloader: Reloader,
    ) -> TableLease:
        """The lease of (user, table), created or updated with a freshly planned set when that is newer."""
        now = self._clock()
        with self._cond:
            lease = self._leases.get((user, ident))
            if lease is None:
                lease = TableLease(user, ident, tuple(credentials), usable_until, reloader, now)
                self._leases[(user, ident)] = lease
            elif _later(usable_until, lease.usable_until) and credentials:
                # A newer load (a later query): its sets win, and a stopped lease starts again.
                self._adopt(lease, tuple(credentials), usable_until, now)
                lease.stopped = None
                lease.dropped_prefixes = ()  # the catalog's current answer for new queries
            lease.reloader = reloader
            return lease

    def register(self, lease: TableLease, holder: Holder) -> tuple[tuple[CredentialSet, ...], int]:
        """Add a running fragment; returns the sets its ticket must carry and their generation, atomically."""
        with self._cond:
            lease.holders[holder.fragment_id] = holder
            self._ensure_thread()
            self._cond.notify_all()
            return lease.credentials, lease.generation

    def unregister(self, lease: TableLease, holder: Holder) -> None:
        with self._cond:
            lease.holders.pop(holder.fragment_id, None)
            if not lease.holders and lease.stopped:
                self._leases.pop((lease.user, lease.ident), None)

    def current(self, lease: TableLease) -> tuple[tuple[CredentialSet, ...], int]:
        with self._cond:
            return lease.credentials, lease.generation

    def held_secrets(self, ident: TableIdent) -> frozenset[str]:
        """The keys every lease of ``ident`` (any user) held lately: what a push's refusal is scrubbed of."""
        with self._cond:
            leases = [lease for (_, leased), lease in self._leases.items() if leased == ident]
        return frozenset().union(*(lease.held_secrets() for lease in leases))

    def leases(self) -> list[TableLease]:
        with self._cond:
            return list(self._leases.values())

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the timer ----------------------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None and self._background and not self._closed:
            self._thread = threading.Thread(target=self._run, name="sqe-credential-refresher", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                for lease in self._take_due():
                    self._pool.submit(self._refresh, lease)
                times = [t for t in (lease.due_at() for lease in self._leases.values()) if t is not None]
                self._cond.wait(timeout=max(0.01, min(times) - self._clock()) if times else None)

    def _take_due(self) -> list[TableLease]:
        """Leases whose refresh is due now, marked as refreshing (call with the lock held)."""
        now = self._clock()
        due = [lease for lease in self._leases.values() if _is_due(lease, now)]
        for lease in due:
            lease.refreshing = True
        return due

    def refresh_due(self) -> int:
        """Run every due refresh in the calling thread (tests with a fake clock); returns how many ran."""
        with self._cond:
            due = self._take_due()
        for lease in due:
            self._refresh(lease)
        return len(due)

    def refresh_now(self, lease: TableLease) -> None:
        """One refresh of ``lease`` in the calling thread (unless one is already running)."""
        with self._cond:
            if lease.refreshing:
                return
            lease.refreshing = True
        self._refresh(lease)

    def _refresh(self, lease: TableLease) -> None:
        try:
            result = self._reload(lease)
            if result is not None:
                self._apply(lease, result)
        finally:
            with self._cond:
                lease.refreshing = False
                self._cond.notify_all()

    def _reload(self, lease: TableLease) -> RefreshedSets | None:
        lease.stats.add(reloads=1)  # a pool thread, outside the refresher's lock: Counters.add locks itself
        try:
            result = lease.reloader()
        except SQEError as exc:  # SQE's messages never hold a secret
            self._stop(lease, f"{type(exc).__name__}: {exc}")
            return None
        except Exception as exc:  # anything else: its class only, the message might echo a request
            self._stop(lease, f"unexpected {type(exc).__name__}")
            return None
        if not result.credentials:
            dropped = f" ({result.incomplete} incomplete)" if result.incomplete else ""
            self._stop(lease, f"the {result.source} answer held no complete credential set{dropped}")
            return None
        return result

    def _apply(self, lease: TableLease, result: RefreshedSets) -> None:
        now = self._clock()
        with self._cond:
            if same_keys(result.credentials, lease.credentials):
                lease.stats.add(unchanged=1)
                lease.usable_until, lease.obtained_at = result.usable_until, now
                return
            _remember_dropped(lease, result.credentials)
            self._adopt(lease, result.credentials, result.usable_until, now)
            lease.stats.add(pushes=1)
            holders = list(lease.holders.values())
            credentials = lease.credentials
        log.info(
            "refreshed credentials of %s for %s via %s: generation %d, %d set(s) pushed to %d fragment(s)",
            lease.ident,
            short_identity(lease.user),
            result.source,
            lease.generation,
            len(credentials),
            len(holders),
        )
        if holders:
            self._push(lease.ident, holders, credentials)

    def _adopt(
        self, lease: TableLease, credentials: tuple[CredentialSet, ...], usable_until: float | None, now: float
    ) -> None:
        lease.credentials, lease.usable_until, lease.obtained_at = credentials, usable_until, now
        lease.generation += 1
        lease.stats.saw_keys(credentials)
        lease.held(credentials)

    def _stop(self, lease: TableLease, reason: str) -> None:
        with self._cond:
            lease.stopped = reason
        log.warning(
            "credential refresh of %s for %s stopped, nothing pushed (running fragments keep their current "
            "keys until they expire): %s",
            lease.ident,
            short_identity(lease.user),
            reason,
        )


def _secrets_of(credentials: Sequence[CredentialSet]) -> frozenset[str]:
    return frozenset(v for c in credentials for v in (c.access_key_id, c.secret_access_key, c.session_token) if v)


def _remember_dropped(lease: TableLease, fresh: Sequence[CredentialSet]) -> None:
    """Add the prefixes of ``lease``'s sets that ``fresh`` no longer has (call with the refresher's lock held)."""
    kept = {c.prefix for c in fresh}
    gone = (c.prefix for c in lease.credentials if c.prefix is not None and c.prefix not in kept)
    lease.dropped_prefixes = tuple(dict.fromkeys((*lease.dropped_prefixes, *gone)))


def _is_due(lease: TableLease, now: float) -> bool:
    due = lease.due_at()
    return due is not None and due <= now


def _later(a: float | None, b: float | None) -> bool:
    """Whether usable point ``a`` is later than ``b`` (None: no limit, the latest of all)."""
    if a is None:
        return b is not None
    return b is not None and a > b
