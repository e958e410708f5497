"""One thread-safe least-recently-used cache, bounded by the total weight of its values.

The footer cache bounds by footer bytes, the data-range and manifest caches by bytes (``len``), the parse cache
by entries. Every cache of the engine is one of these; counters are shared.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqe._counters import Counters

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class CacheStats(Counters):
    hits: int = 0
    misses: int = 0
    evictions: int = 0


def _one(_value: object) -> int:
    return 1


class LRUCache(Generic[K, V]):
    """At most ``bound`` total weight (``weigh(value)``, 1 by default) of entries; oldest use out first."""

    def __init__(self, bound: int, weigh: Callable[[V], int] = _one) -> None:
        self.stats = CacheStats()
        self._weigh = weigh
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._weight = 0
        self._bound = 0
        self.resize(bound)

    @property
    def bound(self) -> int:
        return self._bound

    @property
    def weight(self) -> int:
        with self._lock:
            return self._weight

    def resize(self, bound: int) -> None:
        """A new bound; entries beyond it go at once (0 empties the cache and keeps nothing more)."""
        if bound < 0:
            raise ValueError("a cache bound must not be negative")
        with self._lock:
            self._bound = bound
            evicted = self._evict_locked()
        self._evicted(evicted)

    def get(self, key: K, *, counted: bool = True) -> V | None:
        """The value (now the most recently used), or None; ``counted=False`` for a lookup already counted."""
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
        if counted:
            self.stats.add(hits=1) if value is not None else self.stats.add(misses=1)
        return value

    def put(self, key: K, value: V) -> bool:
        """Keep ``value`` (True), unless it alone weighs more than the bound (then nothing changes)."""
        weight = self._weigh(value)
        if weight > self._bound:
            return False
        with self._lock:
            previous = self._entries.pop(key, None)
            self._weight -= self._weigh(previous) if previous is not None else 0
            self._entries[key] = value
            self._weight += weight
            evicted = self._evict_locked()
        self._evicted(evicted)
        return True

    def drop_where(self, doomed: Callable[[K], bool]) -> int:
        """Remove every entry whose key ``doomed`` accepts; returns how many went."""
        with self._lock:
            keys = [key for key in self._entries if doomed(key)]
            for key in keys:
                self._weight -= self._weigh(self._entries.pop(key))
        self._evicted(keys)
        return len(keys)

    def clear(self) -> None:
        """Remove every entry; unlike ``drop_where`` and the size bound, not counted as evictions."""
        with self._lock:
            gone = list(self._entries)
            self._entries.clear()
            self._weight = 0
        self._forget(gone)

    def snapshot_keys(self) -> list[K]:
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __repr__(self) -> str:  # keys and values (paths, statement texts, file bytes) stay out of reprs
        return f"{type(self).__name__}(entries={len(self)}, weight={self.weight}, bound={self._bound})"

    def _evict_locked(self) -> list[K]:
        evicted: list[K] = []
        while self._entries and self._weight > self._bound:
            key, value = self._entries.popitem(last=False)
            self._weight -= self._weigh(value)
            evicted.append(key)
        return evicted

    def _evicted(self, keys: list[K]) -> None:
        if keys:
            self.stats.add(evictions=len(keys))
            self._forget(keys)

    def _forget(self, keys: list[K]) -> None:
        """Called outside the lock with the keys that left (subclasses that keep an index override it)."""
