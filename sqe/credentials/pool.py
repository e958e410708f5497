"""One pyarrow-backed FileIO per exact credential identity, process-wide, released when its credential expires.

Every pyarrow ``S3FileSystem`` owns an AWS SDK client with its own connection pool (kept-alive TCP sockets to
the store) and eventfds. pyarrow cannot swap the keys of a live filesystem, so each vended set needs its own;
what must not happen is one per *lease object* kept alive by whatever still references it. With 5-second
credentials that grew the server by two eventfds and a socket per refresh (issue 17).

So the FileIOs live here and nowhere else: ``ScopedFileIO`` asks the pool on every open and keeps no FileIO of
its own. An entry is keyed by the identity of its resolved credentials (prefix, source and every property, keyed
by an HMAC under a per-process random key, so the key holds no secret and means nothing outside this process);
reads under two different sets never share a filesystem. An entry goes once its credential has expired (nothing
may open a file with dead keys; a daemon thread sees to it on time, so an idle process does not keep them) or
when the pool is over its hard cap (least recently used first); eviction
listeners (the footer cache) drop what they keep under that identity, and with the last reference gone pyarrow
closes the client. Files already open hold their own reference and finish undisturbed.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from pyarrow.fs import FileSystem
from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

from sqe._counters import Counters
from sqe._unpicklable import Unpicklable

DEFAULT_MAX_FILE_IOS = 32  # distinct live credential sets at once; each holds a client, sockets and eventfds
# An entry is kept at least this long, so a set that arrives already expired (a skewed clock, fixed timestamps
# in tests) still serves a burst of opens through one filesystem instead of one per open.
MIN_HOLD_SECONDS = 5.0

EvictionListener = Callable[[str], None]


@dataclass
class PoolStats(Counters):
    created: int = 0
    reused: int = 0
    expired: int = 0  # released because their credential expired
    evicted: int = 0  # released because the pool was over its cap


@dataclass
class FileSystemStats(Counters):
    created: int = 0
    live: int = 0  # pyarrow filesystems built by pooled FileIOs and not yet freed (whoever held them last)


FILESYSTEMS = FileSystemStats()


def _filesystem_freed() -> None:
    FILESYSTEMS.add(live=-1)


class PooledFileIO(Unpicklable, PyArrowFileIO):
    """pyiceberg's ``PyArrowFileIO`` without its reference cycle, counting the filesystems it builds.

    pyiceberg caches filesystems in ``lru_cache(self._initialize_fs)``: the cache holds a bound method, the
    method holds the FileIO, so a dropped FileIO (and its clients and sockets) waits for the cyclic garbage
    collector. Here the cache reaches the FileIO through a weak reference, and dropping it frees them at once.
    """

    _pickle_refusal = "a pooled FileIO holds credentials and cannot be pickled"

    def __init__(self, properties: Mapping[str, str]) -> None:
        super().__init__(properties=dict(properties))
        self.fs_by_scheme = _acyclic_cache(weakref.ref(self))

    def __repr__(self) -> str:
        return "PooledFileIO()"

    def new_input(self, location: str) -> PyArrowFile:
        return _held(super().new_input(location))

    def new_output(self, location: str) -> PyArrowFile:
        return _held(super().new_output(location))


class HeldFile(PyArrowFile):
    """pyiceberg's file object, refusing pickling (and copying by reduction) as :class:`Unpicklable` does: its
    pyarrow filesystem pickles with the credential set's keys and token."""

    def __reduce__(self) -> NoReturn:
        raise TypeError("a file opened through a pooled FileIO holds credentials and cannot be pickled")


def _held(file: PyArrowFile) -> PyArrowFile:
    file.__class__ = HeldFile  # same layout (HeldFile adds no state): the object pyiceberg built, unpicklable
    return file


def _acyclic_cache(owner: weakref.ref[PooledFileIO]) -> Callable[[str, str | None], FileSystem]:
    lock = threading.Lock()
    built: dict[tuple[str, str | None], FileSystem] = {}

    def filesystem(scheme: str, netloc: str | None = None) -> FileSystem:
        with lock:
            found = built.get((scheme, netloc))
            if found is not None:
                return found
            file_io = owner()
            if file_io is None:  # only reachable through the FileIO itself, so never in practice
                raise RuntimeError("the pooled FileIO was released")
            made: FileSystem = file_io._initialize_fs(scheme, netloc)
            built[(scheme, netloc)] = made
        FILESYSTEMS.add(created=1, live=1)
        weakref.finalize(made, _filesystem_freed)
        return made

    return filesystem


@dataclass
class _Entry:
    file_io: PooledFileIO
    release_at: float | None  # epoch seconds; None: no expiry (static keys, local paths)


class FileIOPool:
    """Thread-safe map of credential identity -> FileIO, bounded by expiry and by ``max_entries``."""

    def __init__(self, max_entries: int = DEFAULT_MAX_FILE_IOS, min_hold_seconds: float = MIN_HOLD_SECONDS) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self.min_hold_seconds = min_hold_seconds
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._next_expiry: float | None = None
        self._listeners: list[EvictionListener] = []
        self._releaser: threading.Thread | None = None

    def add_eviction_listener(self, listener: EvictionListener) -> None:
        """``listener(identity)`` runs after an entry is released (outside the pool's lock)."""
        with self._lock:
            self._listeners.append(listener)

    def file_io(self, identity: str, properties: Mapping[str, str], expires_at: float | None) -> PooledFileIO:
        """The FileIO for ``identity`` (built from ``properties`` on first use); releases what has expired."""
        released: list[str] = []
        with self._lock:
            now = time.time()
            released += self._release_expired(now)
            entry = self._entries.get(identity)
            created = entry is None
            if entry is None:
                release_at = None if expires_at is None else max(expires_at, now + self.min_hold_seconds)
                entry = _Entry(PooledFileIO(properties), release_at)
                self._entries[identity] = entry
                self._note_expiry(release_at)
                released += self._release_over_cap()
            else:
                self._entries.move_to_end(identity)
            file_io = entry.file_io
        self.stats.add(created=1) if created else self.stats.add(reused=1)
        self._notify(released)
        return file_io

    def peek(self, identity: str) -> PooledFileIO | None:
        """The pooled FileIO for ``identity``, if pooled, without touching its recency or building one."""
        with self._lock:
            entry = self._entries.get(identity)
        return None if entry is None else entry.file_io

    def sweep(self) -> int:
        """Release every entry whose credential has expired; returns how many went."""
        with self._lock:
            released = self._release_expired(time.time())
        self._notify(released)
        return len(released)

    def clear(self) -> None:
        """Release every entry now (a process dropping its caches, tests)."""
        with self._lock:
            released, self._entries, self._next_expiry = list(self._entries), OrderedDict(), None
            self._wake.notify()  # the releaser has nothing left to wait for
        self._notify(released)

    @property
    def releasing(self) -> bool:
        """Whether the thread that releases expired sets on time is running (it ends when none has an expiry)."""
        with self._lock:
            return self._releaser is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, identity: object) -> bool:
        with self._lock:
            return identity in self._entries

    # ------------------------------------------------------------------------------ under the lock

    def _note_expiry(self, release_at: float | None) -> None:
        if release_at is not None and (self._next_expiry is None or release_at < self._next_expiry):
            self._next_expiry = release_at
            self._wake_releaser()

    def _wake_releaser(self) -> None:
        """An idle process must not keep dead sets' connections until its next query: a daemon thread releases
        them on time. It runs only while some entry has an expiry, and wakes early for an earlier one."""
        if self._releaser is not None:
            self._wake.notify()
            return
        self._releaser = threading.Thread(target=self._release_on_time, name="sqe-fileio-release", daemon=True)
        self._releaser.start()

    def _release_on_time(self) -> None:
        while True:
            with self._lock:
                if self._next_expiry is None:
                    self._releaser = None
                    return
                delay = self._next_expiry - time.time()
                if delay > 0:
                    self._wake.wait(delay)
                    continue
                released = self._release_expired(time.time())
            self._notify(released)

    def _release_expired(self, now: float) -> list[str]:
        if self._next_expiry is None or now < self._next_expiry:
            return []
        gone = [key for key, entry in self._entries.items() if entry.release_at is not None and now >= entry.release_at]
        for key in gone:
            del self._entries[key]
        left = [e.release_at for e in self._entries.values() if e.release_at is not None]
        self._next_expiry = min(left, default=None)
        if gone:
            self.stats.add(expired=len(gone))
        return gone

    def _release_over_cap(self) -> list[str]:
        gone: list[str] = []
        while len(self._entries) > self.max_entries:
            key, _ = self._entries.popitem(last=False)
            gone.append(key)
        if gone:
            self.stats.add(evicted=len(gone))
        return gone

    # --------------------------------------------------------------------------------- listeners

    def _notify(self, released: list[str]) -> None:
        if not released:
            return
        with self._lock:
            listeners = list(self._listeners)
        for identity in released:
            for listener in listeners:
                listener(identity)


FILE_IOS = FileIOPool()
