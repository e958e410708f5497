"""Byte-bounded, per-process caches of immutable file content, each entry tied to one credential scope.

Two live here (sized by ``[cache] data_bytes`` and ``[cache] manifest_bytes``; 0 turns one off):

- :data:`DATA_RANGES`, byte ranges of data files keyed by (path, size, scope) and offset; a read is served when
  one kept range covers it (see :mod:`sqe.execution.cached_files`);
- :data:`MANIFESTS`, whole manifest lists and manifests keyed by (path, scope).

The scope is :attr:`sqe.credentials.scope.ResolvedCredentials.identity` of the credential set the bytes were
read with (:func:`scope_key`), the same key as the footer cache's. Entries are least-recently-used first out
once the kept bytes pass the bound; a single value larger than the bound is never kept. The caches hold raw
content in process memory only: no repr, log line or counter shows any of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, TypeVar, cast

from sqe._lru import LRUCache

if TYPE_CHECKING:
    from pyiceberg.io import FileIO

    from sqe.credentials.scope import ResolvedCredentials

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

DEFAULT_DATA_BYTES = 256 << 20
DEFAULT_MANIFEST_BYTES = 32 << 20


class MemoryBoundedCache(LRUCache[K, V]):
    """Values that ``weigh`` in bytes of memory, at most ``max_bytes`` of them in all (0: off)."""

    def __init__(self, max_bytes: int, weigh: Callable[[V], int]) -> None:
        super().__init__(max_bytes, weigh=weigh)

    @property
    def enabled(self) -> bool:
        return self.bound > 0

    @property
    def max_bytes(self) -> int:
        return self.bound

    @property
    def kept_bytes(self) -> int:
        return self.weight


class ByteBoundedCache(MemoryBoundedCache[K, bytes]):
    """Immutable byte strings, at most ``max_bytes`` of them in all."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, weigh=len)


FileKey = tuple[str, int, str]  # file path, file size, credential scope key
RangeKey = tuple[FileKey, int]  # a file and the offset a kept range starts at


class RangeCache(ByteBoundedCache[RangeKey]):
    """Byte ranges of data files; a read is served from the one kept range of its file that covers it."""

    def __init__(self, max_bytes: int) -> None:
        self._index_lock = threading.Lock()
        self._index: dict[FileKey, dict[int, int]] = {}  # file -> {offset: length} of its kept ranges
        # Files some of whose kept ranges are a prefetch's parts of a longer read: a read of such a file is served
        # by joining them (:meth:`assembled`), also on a repeat scan; other files never pay for that lookup.
        self._parted: set[FileKey] = set()
        super().__init__(max_bytes)

    def covering(self, file: FileKey, offset: int, length: int) -> memoryview | None:
        """``length`` bytes at ``offset`` of ``file`` from a kept range that holds them all, or None."""
        with self._index_lock:
            ranges = self._index.get(file, {})
            start = next((o for o, n in ranges.items() if o <= offset and offset + length <= o + n), None)
        if start is None:
            self.stats.add(misses=1)
            return None
        data = self.get((file, start))  # counts the hit, or a miss when evicted since the index was read
        if data is None or len(data) < offset - start + length:
            return None  # (shorter: two puts at one offset interleaved; a miss, never a short read)
        return memoryview(data)[offset - start : offset - start + length]

    def holds(self, file: FileKey, offset: int, length: int) -> bool:
        """Whether kept ranges of ``file`` that follow one another without a gap cover these bytes (asked before
        fetching: counts nothing), so a repeat prefetch does not fetch again the parts an earlier one kept."""
        with self._index_lock:
            ranges = sorted(self._index.get(file, {}).items())
        return gapless_end(ranges, offset, offset + length) >= offset + length

    def parted(self, file: FileKey) -> bool:
        """Whether ``file`` has prefetched parts kept, without the lock (a set's membership reads atomically): a
        read of a file without any skips :meth:`assembled`, so a process with the prefetch off never joins."""
        return file in self._parted

    def assembled(self, file: FileKey, offset: int, length: int) -> bytes | None:
        """``length`` bytes at ``offset`` of ``file`` joined from kept ranges that follow one another without a
        gap (a prefetch fetches a long read in parts), or None when they do not cover it all. A copy."""
        with self._index_lock:
            ranges = sorted(self._index.get(file, {}).items())
        parts: list[memoryview] = []
        position, end = offset, offset + length
        for start, size in ranges:
            if position >= end:
                break
            if start <= position < start + size:
                data = self.get((file, start), counted=False)
                if data is None or len(data) < min(size, end - start):
                    return None  # evicted since the index was read, or shorter than it says (as in covering)
                parts.append(memoryview(data)[position - start : min(size, end - start)])
                position = start + min(size, end - start)
        if position < end:
            return None
        self.stats.add(hits=1)
        return b"".join(parts)

    def put_range(self, file: FileKey, offset: int, data: bytes, *, part: bool = False) -> None:
        """Keep ``data`` read at ``offset``; ``part``: a prefetch's part of a longer read (served joined)."""
        with self._index_lock:
            kept = self._index.get(file, {}).get(offset, 0)
        if not data or len(data) <= kept or not self.put((file, offset), data):
            return
        with self._index_lock:
            self._index.setdefault(file, {})[offset] = len(data)
            if part:
                self._parted.add(file)
        # The range may have been evicted by a concurrent put before it was indexed: drop a stale index entry.
        with self._lock:
            gone = (file, offset) not in self._entries
        if gone:
            self._forget([(file, offset)])

    def files(self) -> int:
        with self._index_lock:
            return len(self._index)

    def _forget(self, keys: list[RangeKey]) -> None:
        with self._index_lock:
            for file, offset in keys:
                ranges = self._index.get(file)
                if ranges is None:
                    continue
                ranges.pop(offset, None)
                if not ranges:
                    del self._index[file]
                    self._parted.discard(file)


def gapless_end(ranges: Iterable[tuple[int, int]], position: int, end: int) -> int:
    """How far from ``position`` the (offset-sorted) ranges reach without a gap, up to ``end``."""
    for start, size in ranges:
        if position >= end:
            break
        if start <= position < start + size:
            position = start + size
    return position


DATA_RANGES = RangeCache(DEFAULT_DATA_BYTES)
MANIFESTS: ByteBoundedCache[tuple[str, str]] = ByteBoundedCache(DEFAULT_MANIFEST_BYTES)


def configure_byte_caches(*, data_bytes: int, manifest_bytes: int) -> None:
    """Bound this process's caches (the last configured session wins; workers keep the defaults)."""
    DATA_RANGES.resize(data_bytes)
    MANIFESTS.resize(manifest_bytes)


def clear_byte_caches() -> None:
    DATA_RANGES.clear()
    MANIFESTS.clear()


def scope_key(io: FileIO, path: str) -> str | None:
    """The identity of the credential set ``path`` is read with through ``io`` now, or None when ``io`` is not
    SQE's own ScopedFileIO (then nothing is cached)."""
    resolved = _resolved(io, path)
    return None if resolved is None else resolved.identity


def vended_credentials(io: FileIO, path: str) -> ResolvedCredentials | None:
    """The resolved set ``path`` is read with through ``io`` now, if the catalog vended it for this query (not
    SQE's static key, nor no key at all): the byte caches serve a read only under credentials the catalog has just
    handed out for the path, keyed by the set's ``identity``, and their misses read with it."""
    resolved = _resolved(io, path)
    return resolved if resolved is not None and resolved.source == "vended" else None


def _resolved(io: FileIO, path: str) -> ResolvedCredentials | None:
    resolve = getattr(io, "resolve", None)
    return None if resolve is None else cast("ResolvedCredentials", resolve(path))
