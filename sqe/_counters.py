"""Thread-safe integer counters (executor, coordinator and worker statistics share this one implementation)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class Counters:
    """Subclass as a dataclass of ``int`` fields; ``add`` and ``snapshot`` are atomic under one lock.

    Fields whose names start with ``_`` are private state and stay out of snapshots.
    """

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
            self._after_add()

    def raise_to(self, name: str, value: int) -> None:
        """Keep the maximum seen of a high-water-mark counter."""
        with self._lock:
            setattr(self, name, max(getattr(self, name), value))

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def _after_add(self) -> None:
        """Hook run under the lock after each ``add`` (for derived high-water marks)."""
